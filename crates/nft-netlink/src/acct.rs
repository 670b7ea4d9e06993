//! nfnetlink_acct (`NFNL_SUBSYS_ACCT`): the kernel's named packet and byte counters, the objects
//! iptables' `-m nfacct --nfacct-name NAME` adds each matching packet to. kproxy's iptables mode
//! counts its INVALID drops and its localhost NodePort connections in two of them, as upstream
//! kube-proxy does, and reads them back at each scrape of `/metrics`.
//!
//! Two operations, both on the `NETLINK_NETFILTER` socket this crate already has
//! ([`NfSocket`]): `NFNL_MSG_ACCT_NEW` creates a counter (the kernel answers `EBUSY` when one
//! of that name exists, which [`AcctClient::ensure`] takes as done, since without
//! `NLM_F_REPLACE` it leaves the existing counter untouched), and `NFNL_MSG_ACCT_GET` with
//! `NLM_F_DUMP` lists every counter of the network namespace with its counts. A kernel without
//! nfnetlink_acct refuses the dump (`EINVAL` for the unknown subsystem), which is how
//! [`AcctClient::list`] doubles as the probe.
//!
//! Hand-written, like the rest of this crate's messages: the whole protocol used here is one
//! string attribute out and three attributes back, and the encoder, attribute reader and socket
//! are this crate's own ([`MsgBuf`], [`Attrs`], [`NfSocket`]). No maintained Rust netlink crate
//! has nfnetlink_acct messages (the rust-netlink `netlink-packet-netfilter` crate covers nflog
//! and conntrack); `neli` would be a second netlink stack for three attributes. The byte layout
//! is checked against what a real kernel sent and accepted (the tests below).

use std::io;

use crate::socket::NfSocket;
use crate::sys::{NLM_F_ACK, NLM_F_CREATE, NLM_F_REQUEST};
use crate::wire::{Attrs, MsgBuf};

/// `NFNL_SUBSYS_ACCT`.
pub const NFNL_SUBSYS_ACCT: u16 = 7;
/// `NFNL_MSG_ACCT_NEW`: create a counter (also the type of every dumped counter).
const NFNL_MSG_ACCT_NEW: u16 = 0;
/// `NFNL_MSG_ACCT_GET`: one counter by name, or all of them with `NLM_F_DUMP`.
const NFNL_MSG_ACCT_GET: u16 = 1;
/// `NFACCT_NAME` (a NUL-terminated string).
const NFACCT_NAME: u16 = 1;
/// `NFACCT_PKTS` (a big-endian u64).
const NFACCT_PKTS: u16 = 2;
/// `NFACCT_BYTES` (a big-endian u64).
const NFACCT_BYTES: u16 = 3;
/// `AF_UNSPEC`: nfnetlink_acct objects belong to no address family.
const AF_UNSPEC: u8 = 0;
/// `EBUSY`: the answer to creating a counter that exists.
const EBUSY: i32 = 16;

/// The longest counter name (`NFACCT_NAME_MAX` is 32 with its NUL).
pub const NAME_MAX: usize = 31;

/// One counter as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcctCounter {
    /// Its name.
    pub name: String,
    /// Packets counted.
    pub packets: u64,
    /// Bytes counted (whole IP packets).
    pub bytes: u64,
}

/// The request that creates counter `name`: `NLM_F_CREATE` without `NLM_F_EXCL` or
/// `NLM_F_REPLACE`, so an existing counter is neither an error the kernel reports as `EEXIST`
/// nor reset.
pub fn create_request(name: &str) -> io::Result<MsgBuf> {
    if name.is_empty() || name.len() > NAME_MAX || name.contains('\0') {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("not an nfacct counter name: {name:?}")));
    }
    let mut m = MsgBuf::new();
    m.begin((NFNL_SUBSYS_ACCT << 8) | NFNL_MSG_ACCT_NEW, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE, 1, AF_UNSPEC, 0);
    m.put_str(NFACCT_NAME, name);
    m.end();
    Ok(m)
}

/// One dumped counter, from a message's attributes (after `nfgenmsg`); `None` when the name or
/// a count is missing.
pub fn decode(attrs: &[u8]) -> Option<AcctCounter> {
    let (mut name, mut packets, mut bytes) = (None, None, None);
    for a in Attrs(attrs) {
        match a.kind {
            NFACCT_NAME => name = Some(a.str()),
            NFACCT_PKTS => packets = a.be64(),
            NFACCT_BYTES => bytes = a.be64(),
            _ => {}
        }
    }
    Some(AcctCounter { name: name?, packets: packets?, bytes: bytes? })
}

/// A netlink socket for nfnetlink_acct, in the network namespace of the thread that opened it.
#[derive(Debug)]
pub struct AcctClient {
    sock: NfSocket,
}

impl AcctClient {
    /// Opens the socket.
    pub fn open() -> io::Result<AcctClient> {
        Ok(AcctClient { sock: NfSocket::open()? })
    }

    /// Every counter of the namespace, in one dump. Fails on a kernel without nfnetlink_acct.
    pub fn list(&mut self) -> io::Result<Vec<AcctCounter>> {
        let mut counters = Vec::new();
        self.sock.dump_subsystem(
            NFNL_SUBSYS_ACCT,
            NFNL_MSG_ACCT_GET,
            AF_UNSPEC,
            |_| {},
            |msg| {
                counters.extend(decode(msg));
            },
        )?;
        Ok(counters)
    }

    /// Makes sure counter `name` exists; an existing one keeps its counts.
    pub fn ensure(&mut self, name: &str) -> io::Result<()> {
        match self.sock.request(&create_request(name)?) {
            Err(e) if e.raw_os_error() == Some(EBUSY) => Ok(()),
            other => other,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// The request the kernel acknowledged (error 0, and `EBUSY` the second time) when creating
    /// `probe_ctr` in a fresh namespace: 16-byte header (type 0x0700, flags
    /// REQUEST|ACK|CREATE = 0x0405, seq 1), `nfgenmsg` for AF_UNSPEC, then NFACCT_NAME.
    #[test]
    fn create_request_is_the_message_the_kernel_accepted() {
        let m = create_request("probe_ctr").unwrap();
        assert_eq!(m.bytes(), unhex("24000000000705040100000000000000000000000e00010070726f62655f637472000000"));
    }

    #[test]
    fn names_the_kernel_would_refuse_are_refused_before_sending() {
        assert!(create_request("").is_err());
        assert!(create_request(&"x".repeat(NAME_MAX + 1)).is_err());
        assert!(create_request(&"x".repeat(NAME_MAX)).is_ok());
        assert!(create_request("a\0b").is_err());
    }

    /// A counter dumped by a 6.18 kernel after three 38-byte UDP packets matched
    /// `-m nfacct --nfacct-name probe_ctr`: name, packets 3, bytes 114, then NFACCT_USE (2),
    /// which is skipped.
    #[test]
    fn a_dumped_counter_is_decoded_from_a_real_capture() {
        let msg = unhex(
            "44000000000702000100000032520000000000000e00010070726f62655f6374720000000c0002000000000000000003\
             0c00030000000000000000720800040000000002",
        );
        let reply = crate::socket::messages(&msg).next().unwrap();
        assert_eq!(reply.kind, NFNL_SUBSYS_ACCT << 8 | NFNL_MSG_ACCT_NEW);
        let counter = decode(&reply.payload[4..]).unwrap();
        assert_eq!(counter, AcctCounter { name: "probe_ctr".into(), packets: 3, bytes: 114 });
        // Without its counts a message is not a counter.
        assert_eq!(decode(&reply.payload[4..4 + 16]), None);
    }
}
