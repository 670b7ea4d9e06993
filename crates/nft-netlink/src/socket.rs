//! The nfnetlink socket: sends a batch in one `sendmsg` and collects the kernel's verdicts;
//! runs dumps. Synchronous: kproxy applies one transaction at a time and waits for it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt};

use crate::batch::Batch;
use crate::sys::*;
use crate::wire::{MsgBuf, NLMSG_HDRLEN};

/// Receive buffer for replies: errors for a failed batch and dump pages.
const RCVBUF: usize = 16 << 20;
const RECV_CHUNK: usize = 1 << 20;

/// One `NLMSG_ERROR` the kernel sent for a batch message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// Sequence number of the message it answers.
    pub seq: u32,
    /// `0` for an acknowledgement, else a negative errno.
    pub error: i32,
}

/// A netlink socket bound to `NETLINK_NETFILTER` in the calling thread's network namespace.
#[derive(Debug)]
pub struct NfSocket {
    sock: Socket,
    sndbuf: usize,
    recv: Vec<u8>,
}

/// The socket's descriptor: to poll it, or to set an option this type leaves alone.
impl AsFd for NfSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// One message read back from the kernel.
#[derive(Debug, Clone, Copy)]
pub struct RawMsg<'a> {
    /// `nlmsg_type`.
    pub kind: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// Payload after the netlink header.
    pub payload: &'a [u8],
}

/// Splits a datagram into netlink messages.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = RawMsg<'_>> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let hdr = rest.get(..NLMSG_HDRLEN)?;
        let len = u32::from_ne_bytes(hdr[0..4].try_into().ok()?) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return None;
        }
        let msg = RawMsg {
            kind: u16::from_ne_bytes(hdr[4..6].try_into().ok()?),
            flags: u16::from_ne_bytes(hdr[6..8].try_into().ok()?),
            seq: u32::from_ne_bytes(hdr[8..12].try_into().ok()?),
            payload: &rest[NLMSG_HDRLEN..len],
        };
        rest = rest.get(((len + 3) & !3).min(rest.len())..).unwrap_or(&[]);
        Some(msg)
    })
}

/// What an `NLMSG_ERROR` message's payload says: an acknowledgement (error code 0), or the
/// error the kernel reported.
pub fn acknowledgement(payload: &[u8]) -> io::Result<()> {
    match payload.get(..4).and_then(|b| b.try_into().ok()).map(i32::from_ne_bytes) {
        Some(0) => Ok(()),
        // An error code is a negative errno; `i32::MIN` has none (the kernel never sends it,
        // but a reply must never panic the reader): it saturates.
        Some(code) => Err(io::Error::from_raw_os_error(code.saturating_neg())),
        None => Err(io::Error::other("truncated netlink error")),
    }
}

impl NfSocket {
    /// Opens the socket (in the calling thread's network namespace).
    pub fn open() -> io::Result<NfSocket> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        // Only the header of a failed message comes back with its error.
        sock.set_cap_ack(true)?;
        sock.set_ext_ack(true)?;
        if setsockopt(&sock.as_fd(), sockopt::RcvBufForce, &RCVBUF).is_err() {
            sock.set_rx_buf_sz(RCVBUF)?;
        }
        Ok(NfSocket { sock, sndbuf: 0, recv: Vec::with_capacity(RECV_CHUNK) })
    }

    /// Joins nfnetlink multicast group `group` (`NFNLGRP_*`): the kernel's notices to it arrive
    /// through [`NfSocket::receive`].
    pub fn subscribe(&self, group: u32) -> io::Result<()> {
        self.sock.add_membership(group)
    }

    /// Makes [`NfSocket::receive`] give up (with `WouldBlock`) after `timeout` without a datagram.
    pub fn set_receive_timeout(&self, timeout: std::time::Duration) -> io::Result<()> {
        let tv = nix::sys::time::TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
        setsockopt(&self.sock.as_fd(), sockopt::ReceiveTimeout, &tv).map_err(io::Error::from)
    }

    /// Waits for the next datagram from the kernel and returns it (several messages; see
    /// [`messages`]).
    pub fn receive(&mut self) -> io::Result<&[u8]> {
        self.recv_some()?;
        Ok(&self.recv)
    }

    fn ensure_sndbuf(&mut self, len: usize) -> io::Result<()> {
        if len + 4096 > self.sndbuf {
            let want = (len + 65536).next_power_of_two();
            setsockopt(&self.sock.as_fd(), sockopt::SndBufForce, &want).map_err(io::Error::from)?;
            self.sndbuf = want;
        }
        Ok(())
    }

    fn recv_some(&mut self) -> io::Result<()> {
        self.recv.clear();
        self.recv.reserve(RECV_CHUNK);
        loop {
            match self.sock.recv(&mut self.recv, 0) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => {
                    other?;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Sends `batch` and returns every error the kernel reported, in order (empty: applied).
    pub fn send_batch(&mut self, batch: &Batch) -> io::Result<Vec<Reply>> {
        let bytes = batch.bytes();
        self.ensure_sndbuf(bytes.len())?;
        let sent = self.sock.send(bytes, 0)?;
        if sent != bytes.len() {
            return Err(io::Error::other(format!("short netlink send: {sent} of {} bytes", bytes.len())));
        }
        let mut errors = Vec::new();
        loop {
            self.recv_some()?;
            let mut done = false;
            for msg in messages(&self.recv) {
                if msg.kind != NLMSG_ERROR {
                    continue;
                }
                let Some(code) = msg.payload.get(..4).and_then(|b| b.try_into().ok()).map(i32::from_ne_bytes) else {
                    continue;
                };
                // The answered message's header follows the error code.
                let seq =
                    msg.payload.get(12..16).and_then(|b| b.try_into().ok()).map(u32::from_ne_bytes).unwrap_or(msg.seq);
                if code != 0 {
                    errors.push(Reply { seq, error: code });
                }
                // The acknowledged last message, or a commit failure reported on BEGIN.
                if seq == batch.last_seq() || seq == batch.first_seq() {
                    done = true;
                }
            }
            if done {
                return Ok(errors);
            }
        }
    }

    /// Sends the one message in `m` (which must ask for `NLM_F_ACK`) and waits for the kernel's
    /// answer to it: `Ok` for an acknowledgement, else the error it reported.
    pub fn request(&mut self, m: &MsgBuf) -> io::Result<()> {
        self.sock.send(m.bytes(), 0)?;
        loop {
            self.recv_some()?;
            for reply in messages(&self.recv) {
                if reply.kind != NLMSG_ERROR {
                    continue;
                }
                return acknowledgement(reply.payload);
            }
        }
    }

    /// The nf_tables generation (`NFT_MSG_GETGEN`): bumped by every commit in the namespace.
    pub fn generation(&mut self) -> io::Result<u32> {
        let mut m = MsgBuf::new();
        m.begin_nft(NFT_MSG_GETGEN, NLM_F_REQUEST | NLM_F_ACK, 1, NFPROTO_UNSPEC);
        m.end();
        self.sock.send(m.bytes(), 0)?;
        let mut generation = None;
        loop {
            self.recv_some()?;
            for reply in messages(&self.recv) {
                match reply.kind {
                    NLMSG_ERROR => {
                        acknowledgement(reply.payload)?;
                        return generation.ok_or_else(|| io::Error::other("no generation in the kernel's answer"));
                    }
                    k if k == (NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN) => {
                        generation = crate::wire::Attrs(reply.payload.get(4..).unwrap_or(&[]))
                            .find(|a| a.kind == NFTA_GEN_ID)
                            .and_then(|a| a.be32());
                    }
                    _ => {}
                }
            }
        }
    }

    /// Runs one `NLM_F_DUMP` request and calls `each` with every reply message's payload
    /// (after `nfgenmsg`). A dump the kernel flags as interrupted by a concurrent change
    /// (`NLM_F_DUMP_INTR`) is read to its end and then reported as
    /// [`io::ErrorKind::Interrupted`]: what `each` saw may be inconsistent.
    pub fn dump(
        &mut self,
        msg: u16,
        family: u8,
        attrs: impl FnOnce(&mut MsgBuf),
        each: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        self.dump_subsystem(NFNL_SUBSYS_NFTABLES, msg, family, attrs, each)
    }

    /// [`NfSocket::dump`] for a message of any nfnetlink subsystem (`NFNL_SUBSYS_*`).
    pub fn dump_subsystem(
        &mut self,
        subsystem: u16,
        msg: u16,
        family: u8,
        attrs: impl FnOnce(&mut MsgBuf),
        mut each: impl FnMut(&[u8]),
    ) -> io::Result<()> {
        self.dump_families(subsystem, msg, family, attrs, |_, payload| each(payload))
    }

    /// [`NfSocket::dump_subsystem`], telling `each` the family of every reply (its `nfgenmsg`):
    /// a dump for `NFPROTO_UNSPEC` answers objects of every family.
    pub fn dump_families(
        &mut self,
        subsystem: u16,
        msg: u16,
        family: u8,
        attrs: impl FnOnce(&mut MsgBuf),
        mut each: impl FnMut(u8, &[u8]),
    ) -> io::Result<()> {
        let mut m = MsgBuf::new();
        m.begin((subsystem << 8) | msg, NLM_F_REQUEST | NLM_F_DUMP | NLM_F_ACK, 1, family, 0);
        attrs(&mut m);
        m.end();
        self.sock.send(m.bytes(), 0)?;
        let mut interrupted = false;
        loop {
            self.recv_some()?;
            for reply in messages(&self.recv) {
                interrupted |= reply.flags & NLM_F_DUMP_INTR != 0;
                match reply.kind {
                    NLMSG_DONE if interrupted => {
                        return Err(io::Error::new(io::ErrorKind::Interrupted, "the dump met a concurrent change"));
                    }
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => acknowledgement(reply.payload)?,
                    _ => each(reply.payload.first().copied().unwrap_or(0), reply.payload.get(4..).unwrap_or(&[])),
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// An `NLMSG_ERROR` payload: the error code, then the header of the message answered.
    fn error_payload(code: i32) -> Vec<u8> {
        let mut payload = code.to_ne_bytes().to_vec();
        payload.extend_from_slice(&[0; NLMSG_HDRLEN]);
        payload
    }

    #[test]
    fn an_acknowledgement_is_ok_and_an_error_is_the_kernels() {
        assert!(acknowledgement(&error_payload(0)).is_ok());
        assert_eq!(acknowledgement(&error_payload(-2)).unwrap_err().raw_os_error(), Some(2));
        assert!(acknowledgement(&[0, 0]).unwrap_err().to_string().contains("truncated"));
    }

    #[test]
    fn an_error_code_without_a_positive_counterpart_is_read_not_a_panic() {
        // Found by fuzzing (crates/fuzz/tests/nft_netlink.rs): the negation overflowed.
        assert_eq!(acknowledgement(&error_payload(i32::MIN)).unwrap_err().raw_os_error(), Some(i32::MAX));
    }
}
