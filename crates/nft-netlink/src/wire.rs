//! Netlink message and attribute encoding: one growing byte buffer, attributes appended in
//! place and nests patched with their length when closed. No intermediate tree is built, so
//! encoding a batch of a million messages costs one allocation that grows geometrically.

use crate::sys::{NFNL_SUBSYS_NFTABLES, NLA_F_NESTED};

/// Netlink header length.
pub const NLMSG_HDRLEN: usize = 16;
/// `struct nfgenmsg` length.
pub const NFGENMSG_LEN: usize = 4;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A buffer of consecutive netlink messages.
#[derive(Debug, Default, Clone)]
pub struct MsgBuf {
    buf: Vec<u8>,
    msg_start: usize,
}

/// An open nested attribute, closed with [`MsgBuf::end_nest`].
#[derive(Debug)]
#[must_use]
pub struct Nest(usize);

impl MsgBuf {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// True when nothing was encoded.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Forgets everything, keeping the allocation.
    pub fn clear(&mut self) {
        self.buf.clear();
        self.msg_start = 0;
    }

    /// Starts an nfnetlink message: header plus `nfgenmsg` (`res_id` big-endian).
    pub fn begin(&mut self, msg_type: u16, flags: u16, seq: u32, family: u8, res_id: u16) {
        self.msg_start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&msg_type.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
    }

    /// Starts an nf_tables message (`NFNL_SUBSYS_NFTABLES << 8 | msg`).
    pub fn begin_nft(&mut self, msg: u16, flags: u16, seq: u32, family: u8) {
        self.begin((NFNL_SUBSYS_NFTABLES << 8) | msg, flags, seq, family, 0);
    }

    /// Closes the current message by writing its length.
    pub fn end(&mut self) {
        let len = (self.buf.len() - self.msg_start) as u32;
        self.buf[self.msg_start..self.msg_start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    /// Adds `shift` to the sequence number of every message in the buffer.
    pub fn shift_seqs(&mut self, shift: u32) {
        let mut at = 0;
        while let Some(header) = self.buf.get_mut(at..at + 16) {
            let len = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]) as usize;
            let seq = u32::from_ne_bytes([header[8], header[9], header[10], header[11]]).wrapping_add(shift);
            header[8..12].copy_from_slice(&seq.to_ne_bytes());
            // Messages are 4-byte aligned; a zero length would never end.
            at += len.max(16).div_ceil(4) * 4;
        }
    }

    /// ORs `flag` into the flags of the message starting at byte `at`.
    pub fn set_flag(&mut self, at: usize, flag: u16) {
        if let Some(f) = self.buf.get_mut(at + 6..at + 8) {
            let v = u16::from_ne_bytes([f[0], f[1]]) | flag;
            f.copy_from_slice(&v.to_ne_bytes());
        }
    }

    /// Appends an attribute with raw payload, padded to 4 bytes.
    pub fn put(&mut self, kind: u16, data: &[u8]) {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(self.buf.len() + align4(len) - len, 0);
    }

    /// A big-endian u32 attribute (the kernel's `NLA_BE32`).
    pub fn put_be32(&mut self, kind: u16, v: u32) {
        self.put(kind, &v.to_be_bytes());
    }

    /// A big-endian u64 attribute.
    pub fn put_be64(&mut self, kind: u16, v: u64) {
        self.put(kind, &v.to_be_bytes());
    }

    /// A NUL-terminated string attribute.
    pub fn put_str(&mut self, kind: u16, s: &str) {
        let len = 4 + s.len() + 1;
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self.buf.resize(self.buf.len() + align4(len) - len, 0);
    }

    /// Opens a nested attribute.
    pub fn begin_nest(&mut self, kind: u16) -> Nest {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        Nest(at)
    }

    /// Reopens the nested attribute that begins at byte `at` and is the last thing written, to
    /// append to it; close it again with [`MsgBuf::end_nest`].
    pub fn reopen_nest(&self, at: usize) -> Nest {
        Nest(at)
    }

    /// Closes a nested attribute.
    pub fn end_nest(&mut self, nest: Nest) {
        let len = (self.buf.len() - nest.0) as u16;
        self.buf[nest.0..nest.0 + 2].copy_from_slice(&len.to_ne_bytes());
    }
}

/// One attribute read back from the kernel.
#[derive(Debug, Clone, Copy)]
pub struct Attr<'a> {
    /// Type without the nested/byte-order flags.
    pub kind: u16,
    /// Payload.
    pub data: &'a [u8],
}

impl<'a> Attr<'a> {
    /// The payload as a NUL-terminated string.
    pub fn str(&self) -> String {
        let end = self.data.iter().position(|b| *b == 0).unwrap_or(self.data.len());
        String::from_utf8_lossy(&self.data[..end]).into_owned()
    }

    /// The payload as a big-endian u32.
    pub fn be32(&self) -> Option<u32> {
        self.data.get(..4).and_then(|b| b.try_into().ok()).map(u32::from_be_bytes)
    }

    /// The payload as a big-endian u64.
    pub fn be64(&self) -> Option<u64> {
        self.data.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes)
    }

    /// The nested attributes.
    pub fn nested(&self) -> Attrs<'a> {
        Attrs(self.data)
    }
}

/// Iterates over the attributes in a byte slice, stopping at the first malformed one.
#[derive(Debug, Clone, Copy)]
pub struct Attrs<'a>(pub &'a [u8]);

impl<'a> Iterator for Attrs<'a> {
    type Item = Attr<'a>;

    fn next(&mut self) -> Option<Attr<'a>> {
        let b = self.0;
        let len = usize::from(u16::from_ne_bytes(b.get(..2)?.try_into().ok()?));
        let kind = u16::from_ne_bytes(b.get(2..4)?.try_into().ok()?) & 0x3fff;
        let data = b.get(4..len)?;
        self.0 = b.get(align4(len).min(b.len())..).unwrap_or(&[]);
        Some(Attr { kind, data })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_nests_carry_their_length() {
        let mut m = MsgBuf::new();
        m.begin_nft(6, 0x0c01, 7, 2);
        m.put_str(1, "t");
        let n = m.begin_nest(4);
        m.put_be32(1, 0x0102_0304);
        m.end_nest(n);
        m.end();
        let b = m.bytes();
        assert_eq!(u32::from_ne_bytes(b[..4].try_into().unwrap()) as usize, b.len());
        assert_eq!(&b[16..20], &[2, 0, 0, 0]);
        // "t\0" in a 6-byte attribute padded to 8.
        assert_eq!(&b[20..28], &[6, 0, 1, 0, b't', 0, 0, 0]);
        // Nest of 12 bytes, type 4 | NLA_F_NESTED.
        assert_eq!(&b[28..32], &[12, 0, 4, 0x80]);
        assert_eq!(&b[36..40], &[1, 2, 3, 4]);
        let attrs: Vec<_> = Attrs(&b[20..]).collect();
        assert_eq!(attrs.len(), 2);
        assert_eq!(attrs[0].str(), "t");
        assert_eq!(attrs[1].nested().next().unwrap().be32(), Some(0x0102_0304));
    }
}
