//! A lean netlink layer: a message builder, an attribute walker and a blocking request/dump
//! client over `netlink-sys`'s socket.
//!
//! Why not a message crate: the IPVS dataplane sends about a dozen message shapes (seven IPVS
//! commands, four rtnetlink ones, one generic-netlink controller lookup). `nlrs` (0.2) models
//! IPVS, but it is young, brings its own socket layer and gives no control over attribute order,
//! which the byte-level tests compare against `ipvsadm`'s; `netlink-packet-generic` has no IPVS
//! attributes at all, so its types would only wrap the same raw attributes written here. A
//! hundred lines of builder keep every byte visible and testable without root.

use std::io;

use netlink_sys::{Socket, SocketAddr};

/// `NLM_F_REQUEST`.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_ACK`.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP` (`ROOT | MATCH`).
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLM_F_EXCL`.
pub const NLM_F_EXCL: u16 = 0x200;
/// `NLM_F_CREATE`.
pub const NLM_F_CREATE: u16 = 0x400;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const HEADER_LEN: usize = 16;
/// `NLA_F_NESTED`, set on nested attributes as libnl and iproute2 do.
const NLA_F_NESTED: u16 = 0x8000;
/// The attribute type bits (without `NLA_F_NESTED` / `NLA_F_NET_BYTEORDER`).
const NLA_TYPE_MASK: u16 = 0x3fff;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A netlink message under construction: header, family header, attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    buf: Vec<u8>,
}

impl Message {
    /// A message of type `ty` with `flags`; length and sequence are filled in by [`Message::finish`].
    pub fn new(ty: u16, flags: u16) -> Self {
        let mut buf = vec![0u8; HEADER_LEN];
        buf[4..6].copy_from_slice(&ty.to_ne_bytes());
        buf[6..8].copy_from_slice(&flags.to_ne_bytes());
        Self { buf }
    }

    /// Appends raw bytes (a family header such as `genlmsghdr` or `ifinfomsg`), padded to 4.
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    /// Appends one attribute.
    pub fn attr(&mut self, ty: u16, payload: &[u8]) -> &mut Self {
        let len = u16::try_from(4 + payload.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    /// A `u16` attribute in host order.
    pub fn u16(&mut self, ty: u16, v: u16) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }

    /// A `u32` attribute in host order.
    pub fn u32(&mut self, ty: u16, v: u32) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }

    /// A NUL-terminated string attribute.
    pub fn str(&mut self, ty: u16, s: &str) -> &mut Self {
        let mut bytes = s.as_bytes().to_vec();
        bytes.push(0);
        self.attr(ty, &bytes)
    }

    /// A `u8` attribute.
    pub fn u8(&mut self, ty: u16, v: u8) -> &mut Self {
        self.attr(ty, &[v])
    }

    /// Starts a nested attribute; close it with [`Message::end_nested`].
    pub fn begin_nested(&mut self, ty: u16) -> usize {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        start
    }

    /// Closes the nested attribute started at `start`.
    pub fn end_nested(&mut self, start: usize) -> &mut Self {
        let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    /// The finished bytes with sequence number `seq` (port id 0: the kernel).
    pub fn finish(&self, seq: u32) -> Vec<u8> {
        let mut buf = self.buf.clone();
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        buf[0..4].copy_from_slice(&len.to_ne_bytes());
        buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        buf
    }
}

/// Walks the attributes in `buf`: `(type without flag bits, payload)`. Stops at a malformed one.
pub fn attrs(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        if rest.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let ty = u16::from_ne_bytes([rest[2], rest[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > rest.len() {
            return None;
        }
        let payload = &rest[4..len];
        rest = &rest[align4(len).min(rest.len())..];
        Some((ty, payload))
    })
}

/// The payload of attribute `ty`, if present.
pub fn find(buf: &[u8], ty: u16) -> Option<&[u8]> {
    attrs(buf).find(|(t, _)| *t == ty).map(|(_, p)| p)
}

/// A host-order `u16` payload.
pub fn get_u16(p: &[u8]) -> Option<u16> {
    Some(u16::from_ne_bytes(p.get(..2)?.try_into().ok()?))
}

/// A host-order `u32` payload.
pub fn get_u32(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

/// A NUL-terminated string payload.
pub fn get_str(p: &[u8]) -> Option<String> {
    let end = p.iter().position(|b| *b == 0).unwrap_or(p.len());
    String::from_utf8(p[..end].to_vec()).ok()
}

/// A failed netlink exchange.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The socket failed.
    #[error("netlink socket: {0}")]
    Io(#[from] io::Error),
    /// The kernel answered with an error.
    #[error("{}", io::Error::from_raw_os_error(*.0))]
    Kernel(i32),
    /// The kernel's answer could not be parsed.
    #[error("malformed netlink answer")]
    Malformed,
}

impl NetlinkError {
    /// The errno the kernel returned, if it did.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel(e) => Some(*e),
            _ => None,
        }
    }
}

/// A blocking netlink client bound in the network namespace of the thread that opened it.
#[derive(Debug)]
pub struct Client {
    socket: Socket,
    seq: u32,
}

impl Client {
    /// Opens a socket of `protocol` (`NETLINK_GENERIC`, `NETLINK_ROUTE`).
    pub fn open(protocol: isize) -> Result<Self, NetlinkError> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Self { socket, seq: 0 })
    }

    fn send(&mut self, msg: &Message) -> Result<u32, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        self.socket.send(&msg.finish(self.seq), 0)?;
        Ok(self.seq)
    }

    /// Sends a request (`NLM_F_ACK` must be among its flags) and waits for the acknowledgement;
    /// returns the payloads of any data messages before it (for `GET` requests).
    pub fn request(&mut self, msg: &Message) -> Result<Vec<Vec<u8>>, NetlinkError> {
        let seq = self.send(msg)?;
        self.collect(seq, false)
    }

    /// Sends a dump request and returns the payload of every message up to `NLMSG_DONE`.
    pub fn dump(&mut self, msg: &Message) -> Result<Vec<Vec<u8>>, NetlinkError> {
        let seq = self.send(msg)?;
        self.collect(seq, true)
    }

    fn collect(&mut self, seq: u32, dump: bool) -> Result<Vec<Vec<u8>>, NetlinkError> {
        let mut out = Vec::new();
        loop {
            let (buf, _) = self.socket.recv_from_full()?;
            if read_replies(&buf, seq, dump, &mut out)? == Replies::Complete {
                return Ok(out);
            }
        }
    }
}

/// Whether the answer to a request is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replies {
    /// Its acknowledgement (or the end of the dump) came.
    Complete,
    /// More datagrams follow.
    Pending,
}

/// Reads one datagram of the kernel's answer to request `seq` (a dump when `dump`): the payload
/// of every data message is added to `out`; messages of other requests are skipped. Says
/// whether the answer is complete, or what the kernel refused.
pub fn read_replies(datagram: &[u8], seq: u32, dump: bool, out: &mut Vec<Vec<u8>>) -> Result<Replies, NetlinkError> {
    let mut rest = datagram;
    while rest.len() >= HEADER_LEN {
        let len = get_u32(rest).map(|l| l as usize).ok_or(NetlinkError::Malformed)?;
        if len < HEADER_LEN || len > rest.len() {
            return Err(NetlinkError::Malformed);
        }
        let ty = get_u16(&rest[4..]).ok_or(NetlinkError::Malformed)?;
        let msg_seq = get_u32(&rest[8..]).ok_or(NetlinkError::Malformed)?;
        let payload = &rest[HEADER_LEN..len];
        rest = &rest[align4(len).min(rest.len())..];
        if msg_seq != seq {
            continue;
        }
        match ty {
            NLMSG_ERROR => {
                let code = payload.get(..4).and_then(get_i32).ok_or(NetlinkError::Malformed)?;
                if code != 0 {
                    return Err(NetlinkError::Kernel(errno(code)));
                }
                if !dump {
                    return Ok(Replies::Complete);
                }
            }
            NLMSG_DONE => {
                let code = payload.get(..4).and_then(get_i32).unwrap_or(0);
                return if code < 0 { Err(NetlinkError::Kernel(errno(code))) } else { Ok(Replies::Complete) };
            }
            _ => out.push(payload.to_vec()),
        }
    }
    Ok(Replies::Pending)
}

/// The errno of a kernel error code (negative). `i32::MIN` has no positive counterpart: it
/// saturates rather than overflow.
fn errno(code: i32) -> i32 {
    code.saturating_neg()
}

fn get_i32(p: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_nested_lengths_cover_their_children() {
        let mut m = Message::new(0x22, NLM_F_REQUEST | NLM_F_ACK);
        m.raw(&[1, 2]);
        let n = m.begin_nested(1);
        m.str(6, "rr");
        m.u16(1, 2);
        m.end_nested(n);
        let bytes = m.finish(7);
        assert_eq!(bytes.len(), 16 + 4 + 4 + 8 + 8);
        assert_eq!(get_u32(&bytes).unwrap() as usize, bytes.len());
        assert_eq!(get_u32(&bytes[8..]).unwrap(), 7);
        let nested: Vec<_> = attrs(&bytes[20..]).collect();
        assert_eq!(nested.len(), 1);
        assert_eq!(nested[0].0, 1);
        let inner: Vec<_> = attrs(nested[0].1).collect();
        assert_eq!(get_str(inner[0].1).unwrap(), "rr");
        assert_eq!(get_u16(inner[1].1).unwrap(), 2);
    }

    /// A reply datagram: one message of type `ty` for `seq` with `payload`.
    fn reply(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Message::new(ty, 0);
        m.raw(payload);
        m.finish(seq)
    }

    #[test]
    fn replies_of_other_requests_are_skipped_and_errors_are_the_kernels() {
        let mut datagram = reply(0x20, 6, &[1, 2, 3, 4]);
        datagram.extend(reply(0x20, 7, &[5, 6, 7, 8]));
        datagram.extend(reply(NLMSG_DONE, 7, &0i32.to_ne_bytes()));
        let mut out = Vec::new();
        assert_eq!(read_replies(&datagram, 7, true, &mut out).unwrap(), Replies::Complete);
        assert_eq!(out, vec![vec![5, 6, 7, 8]]);
        let refused = reply(NLMSG_ERROR, 7, &(-17i32).to_ne_bytes());
        assert_eq!(read_replies(&refused, 7, false, &mut out).unwrap_err().errno(), Some(17));
        assert!(matches!(read_replies(&refused[..18], 7, false, &mut out), Err(NetlinkError::Malformed)));
    }

    #[test]
    fn an_error_code_without_a_positive_counterpart_is_read_not_a_panic() {
        // Found by fuzzing (crates/fuzz/tests/ipvs_replies.rs): the negation overflowed.
        for ty in [NLMSG_ERROR, NLMSG_DONE] {
            let datagram = reply(ty, 1, &i32::MIN.to_ne_bytes());
            let error = read_replies(&datagram, 1, true, &mut Vec::new()).unwrap_err();
            assert_eq!(error.errno(), Some(i32::MAX));
        }
    }

    #[test]
    fn malformed_attributes_stop_the_walk() {
        let buf = [8u8, 0, 1, 0, 1, 2, 3, 4, 200, 0, 2, 0];
        let all: Vec<_> = attrs(&buf).collect();
        assert_eq!(all.len(), 1);
    }
}
