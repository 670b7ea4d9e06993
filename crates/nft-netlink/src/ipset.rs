//! The kernel's ip sets (`NFNL_SUBSYS_IPSET`), as far as kproxy needs them: the names of the
//! sets of the network namespace, and destroying one. kube-proxy's IPVS mode keeps its
//! Service addresses in ip sets named `KUBE-…`; taking over from it removes them
//! (`kproxy-takeover`), and kproxy itself never creates one.
//!
//! Hand-written on this crate's socket, like [`crate::acct`]: two requests of two attributes
//! each. The maintained Rust netlink crates have no ipset messages, and the `ipset` crate binds
//! libipset through C (and `unsafe`, denied in this workspace). The messages follow the kernel's
//! `include/uapi/linux/netfilter/ipset/ip_set.h`; the tests check them against a real kernel.

use std::io;

use crate::socket::NfSocket;
use crate::sys::{NLM_F_ACK, NLM_F_REQUEST};
use crate::wire::{Attrs, MsgBuf};

/// `NFNL_SUBSYS_IPSET`.
const NFNL_SUBSYS_IPSET: u16 = 6;
/// `IPSET_CMD_DESTROY`.
const IPSET_CMD_DESTROY: u16 = 3;
/// `IPSET_CMD_LIST`.
const IPSET_CMD_LIST: u16 = 7;
/// `IPSET_ATTR_PROTOCOL` (u8): the protocol version every request carries.
const IPSET_ATTR_PROTOCOL: u16 = 1;
/// `IPSET_ATTR_SETNAME` (string).
const IPSET_ATTR_SETNAME: u16 = 2;
/// `IPSET_ATTR_FLAGS` (u32, network byte order): command-level flags.
const IPSET_ATTR_FLAGS: u16 = 6;
/// `NLA_F_NET_BYTEORDER`.
const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
/// `IPSET_FLAG_LIST_SETNAME`: a listing of names only.
const IPSET_FLAG_LIST_SETNAME: u32 = 1 << 1;
/// Protocol 6: what every kernel since 2.6.39 speaks (newer ones accept 6 to 7).
const IPSET_PROTOCOL: u8 = 6;
/// ipset speaks with family `AF_INET` in `nfgenmsg` whatever the set's family.
const AF_INET: u8 = 2;
/// `IPSET_ERR_PRIVATE`: ipset's own error codes start here.
const IPSET_ERR_PRIVATE: i32 = 4096;
/// `IPSET_ERR_BUSY`: the set is still referenced (by an iptables rule, a list set).
const IPSET_ERR_BUSY: i32 = IPSET_ERR_PRIVATE + 4;

/// The request that lists the names of every set (with `NLM_F_DUMP` added by the socket).
fn list_attrs(m: &mut MsgBuf) {
    m.put(IPSET_ATTR_PROTOCOL, &[IPSET_PROTOCOL]);
    m.put(IPSET_ATTR_FLAGS | NLA_F_NET_BYTEORDER, &IPSET_FLAG_LIST_SETNAME.to_be_bytes());
}

/// The request that destroys set `name`.
pub fn destroy_request(name: &str) -> MsgBuf {
    let mut m = MsgBuf::new();
    m.begin((NFNL_SUBSYS_IPSET << 8) | IPSET_CMD_DESTROY, NLM_F_REQUEST | NLM_F_ACK, 1, AF_INET, 0);
    m.put(IPSET_ATTR_PROTOCOL, &[IPSET_PROTOCOL]);
    m.put_str(IPSET_ATTR_SETNAME, name);
    m.end();
    m
}

/// The set name in one message of a listing.
pub fn decode_name(payload: &[u8]) -> Option<String> {
    Attrs(payload).find(|a| a.kind == IPSET_ATTR_SETNAME).map(|a| a.str())
}

/// The ip sets of the calling thread's network namespace.
#[derive(Debug)]
pub struct IpsetClient {
    sock: NfSocket,
}

impl IpsetClient {
    /// Opens the socket.
    pub fn open() -> io::Result<IpsetClient> {
        Ok(IpsetClient { sock: NfSocket::open()? })
    }

    /// The names of every set, in the kernel's order. A kernel without ip sets has none.
    pub fn names(&mut self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        let listed = self.sock.dump_subsystem(NFNL_SUBSYS_IPSET, IPSET_CMD_LIST, AF_INET, list_attrs, |p| {
            names.extend(decode_name(p));
        });
        match listed {
            Ok(()) => {}
            // No ip_set in this kernel: the subsystem is unknown.
            Err(e) if matches!(e.raw_os_error(), Some(nix::libc::EINVAL | nix::libc::EOPNOTSUPP)) => {}
            Err(e) => return Err(e),
        }
        names.dedup();
        Ok(names)
    }

    /// Destroys set `name`; one already gone is done. A set still referenced is refused with
    /// an error that says so.
    pub fn destroy(&mut self, name: &str) -> io::Result<()> {
        match self.sock.request(&destroy_request(name)) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => Ok(()),
            Err(e) if e.raw_os_error() == Some(IPSET_ERR_BUSY) => {
                Err(io::Error::other(format!("ip set {name} is still in use (an iptables rule refers to it)")))
            }
            // ipset's "the set does not exist" is its own code.
            Err(e) if e.raw_os_error().is_some_and(|c| c > IPSET_ERR_PRIVATE) => Err(io::Error::other(format!(
                "destroying ip set {name}: ipset error {}",
                e.raw_os_error().unwrap_or(0)
            ))),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn destroy_request_carries_protocol_and_name_for_af_inet() {
        let m = destroy_request("KUBE-CLUSTER-IP");
        let b = m.bytes();
        // type IPSET (6) << 8 | DESTROY (3), flags REQUEST|ACK.
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), 0x0603);
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(b[16], AF_INET);
        let attrs: Vec<_> = Attrs(&b[20..]).map(|a| (a.kind, a.data.to_vec())).collect();
        assert_eq!(attrs[0], (IPSET_ATTR_PROTOCOL, vec![IPSET_PROTOCOL]));
        assert_eq!(attrs[1], (IPSET_ATTR_SETNAME, b"KUBE-CLUSTER-IP\0".to_vec()));
    }
}
