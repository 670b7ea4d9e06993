//! Mutations of binary messages (netlink), from valid seeds: what `mutated_text` is to text.
//!
//! Netlink is lengths and types in 16- and 32-bit fields at 4-byte boundaries, so besides
//! flipped bytes and cut or repeated ranges, most mutations write a value that matters to a
//! reader (0, 1, 3, 4, a boundary, all ones, the message length give or take one) over a
//! 2- or 4-byte field at an aligned position: a length that claims more than there is, or
//! less than a header, a type with the nested flag, an errno at `i32::MIN`.
#![allow(dead_code)] // each target uses part of it

use proptest::prelude::*;
use proptest::sample::Index;

/// One change to a message.
#[derive(Debug, Clone)]
pub enum ByteMutation {
    /// Write a 16-bit value (host order) at an even position.
    U16(Index, u16),
    /// Write a 32-bit value (host order) at a position that is a multiple of 4.
    U32(Index, u32),
    /// Set one byte.
    Byte(Index, u8),
    /// Flip one bit.
    Bit(Index, u8),
    /// Cut the message off.
    Truncate(Index),
    /// Remove up to this many bytes.
    Delete(Index, usize),
    /// Repeat a range of up to this many bytes (an attribute, a message) after itself.
    Repeat(Index, usize),
    /// Insert bytes.
    Insert(Index, Vec<u8>),
}

fn interesting_u16() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(0u16),
        Just(1),
        Just(3),
        Just(4),
        Just(5),
        Just(8),
        Just(0x7fff),
        Just(0x8000),
        Just(0xffff),
        0u16..=0x40,
        any::<u16>(),
    ]
}

fn interesting_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(1),
        Just(15),
        Just(16),
        Just(17),
        Just(0x7fff_ffff),
        Just(0x8000_0000),
        Just(0xffff_ffff),
        Just((-2i32) as u32),
        0u32..=0x200,
        any::<u32>(),
    ]
}

fn byte_mutation() -> impl Strategy<Value = ByteMutation> {
    prop_oneof![
        4 => (any::<Index>(), interesting_u16()).prop_map(|(i, v)| ByteMutation::U16(i, v)),
        3 => (any::<Index>(), interesting_u32()).prop_map(|(i, v)| ByteMutation::U32(i, v)),
        2 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| ByteMutation::Byte(i, v)),
        2 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| ByteMutation::Bit(i, b)),
        1 => any::<Index>().prop_map(ByteMutation::Truncate),
        1 => (any::<Index>(), 1usize..24).prop_map(|(i, n)| ByteMutation::Delete(i, n)),
        1 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| ByteMutation::Repeat(i, n)),
        1 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..12)).prop_map(|(i, b)| ByteMutation::Insert(i, b)),
    ]
}

/// Between one and five mutations of `seed`.
pub fn mutated_bytes(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(byte_mutation(), 1..6).prop_map(move |mutations| {
        let mut bytes = seed.clone();
        for mutation in mutations {
            apply(&mut bytes, mutation);
        }
        bytes
    })
}

/// A seed from `seeds`, mutated.
pub fn mutated_seed(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    proptest::sample::select(seeds).prop_flat_map(mutated_bytes)
}

/// Position `index` among `slots` positions `step` bytes apart (none when `bytes` is shorter).
fn aligned(index: &Index, len: usize, step: usize, width: usize) -> Option<usize> {
    let slots = (len.checked_sub(width)? / step) + 1;
    Some(index.index(slots) * step)
}

fn apply(bytes: &mut Vec<u8>, mutation: ByteMutation) {
    let len = bytes.len();
    match mutation {
        ByteMutation::U16(i, v) => {
            if let Some(at) = aligned(&i, len, 2, 2) {
                bytes[at..at + 2].copy_from_slice(&v.to_ne_bytes());
            }
        }
        ByteMutation::U32(i, v) => {
            if let Some(at) = aligned(&i, len, 4, 4) {
                bytes[at..at + 4].copy_from_slice(&v.to_ne_bytes());
            }
        }
        ByteMutation::Byte(i, v) => {
            if len > 0 {
                bytes[i.index(len)] = v;
            }
        }
        ByteMutation::Bit(i, bit) => {
            if len > 0 {
                bytes[i.index(len)] ^= 1 << bit;
            }
        }
        ByteMutation::Truncate(i) => bytes.truncate(i.index(len + 1)),
        ByteMutation::Delete(i, n) => {
            let at = i.index(len + 1);
            bytes.drain(at..(at + n).min(len));
        }
        ByteMutation::Repeat(i, n) => {
            if len > 0 {
                let at = i.index(len);
                let range = bytes[at..(at + n).min(len)].to_vec();
                let end = at + range.len();
                bytes.splice(end..end, range);
            }
        }
        ByteMutation::Insert(i, new) => {
            let at = i.index(len + 1);
            bytes.splice(at..at, new);
        }
    }
}

/// `text` of hex digit pairs (whitespace ignored) as bytes.
pub fn from_hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("00"), 16).unwrap_or(0))
        .collect()
}

/// `text` of `\xNN` escapes as bytes.
pub fn from_escaped(text: &str) -> Vec<u8> {
    text.split("\\x").filter(|s| !s.is_empty()).map(|h| u8::from_str_radix(h, 16).unwrap_or(0)).collect()
}
