//! The `kube-ipvs0` dummy interface over rtnetlink: create it (up, so IPv6 addresses become
//! local too), list, add and remove its addresses, delete it.
//!
//! Every VIP is added as a host address (`/32`, `/128`) with `IFA_F_NODAD` so an IPv6 VIP is
//! usable at once. A local route per address is what makes the kernel deliver VIP traffic to
//! the `LOCAL_IN` hook where IPVS picks it up.

use std::net::IpAddr;

use crate::netlink::{self, Message, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 1;
const IFA_F_NODAD: u8 = 0x02;
const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// `struct ifinfomsg`.
fn ifinfomsg(index: i32, flags: u32, change: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0] = AF_UNSPEC;
    b[4..8].copy_from_slice(&index.to_ne_bytes());
    b[8..12].copy_from_slice(&flags.to_ne_bytes());
    b[12..16].copy_from_slice(&change.to_ne_bytes());
    b
}

/// `RTM_GETLINK` by name.
pub fn get_link_request(name: &str) -> Message {
    let mut m = Message::new(RTM_GETLINK, NLM_F_REQUEST | NLM_F_ACK);
    m.raw(&ifinfomsg(0, 0, 0));
    m.str(IFLA_IFNAME, name);
    m
}

/// The interface index and link kind from an `RTM_NEWLINK` answer.
pub fn parse_link(payload: &[u8]) -> Option<(u32, Option<String>)> {
    let index = u32::try_from(i32::from_ne_bytes(payload.get(4..8)?.try_into().ok()?)).ok()?;
    let kind = netlink::find(payload.get(16..)?, IFLA_LINKINFO)
        .and_then(|info| netlink::find(info, IFLA_INFO_KIND))
        .and_then(netlink::get_str);
    Some((index, kind))
}

/// `ip link add NAME up type dummy`.
pub fn create_dummy_request(name: &str) -> Message {
    let mut m = Message::new(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL);
    m.raw(&ifinfomsg(0, IFF_UP, IFF_UP));
    m.str(IFLA_IFNAME, name);
    let n = m.begin_nested(IFLA_LINKINFO);
    m.str(IFLA_INFO_KIND, "dummy");
    m.end_nested(n);
    m
}

/// `ip link set dev INDEX up`.
pub fn set_up_request(index: u32) -> Message {
    let mut m = Message::new(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK);
    m.raw(&ifinfomsg(i32::try_from(index).unwrap_or(0), IFF_UP, IFF_UP));
    m
}

/// `ip link del INDEX`.
pub fn delete_link_request(index: u32) -> Message {
    let mut m = Message::new(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK);
    m.raw(&ifinfomsg(i32::try_from(index).unwrap_or(0), 0, 0));
    m
}

/// Dump every address (filtered by interface afterwards).
pub fn dump_addresses_request() -> Message {
    let mut m = Message::new(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP);
    m.raw(&[AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0]);
    m
}

/// The address of an `RTM_NEWADDR` dump entry when it belongs to interface `index`.
pub fn parse_address(payload: &[u8], index: u32) -> Option<IpAddr> {
    let family = *payload.first()?;
    let ifindex = u32::from_ne_bytes(payload.get(4..8)?.try_into().ok()?);
    if ifindex != index {
        return None;
    }
    let attrs = payload.get(8..)?;
    let raw = netlink::find(attrs, IFA_LOCAL).or_else(|| netlink::find(attrs, IFA_ADDRESS))?;
    match family {
        AF_INET => Some(IpAddr::from(<[u8; 4]>::try_from(raw.get(..4)?).ok()?)),
        AF_INET6 => Some(IpAddr::from(<[u8; 16]>::try_from(raw.get(..16)?).ok()?)),
        _ => None,
    }
}

/// `ip addr add|del ADDR/32|128 dev INDEX` (no DAD).
pub fn address_request(add: bool, index: u32, addr: IpAddr) -> Message {
    let (ty, flags) = if add {
        (RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
    } else {
        (RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK)
    };
    let mut m = Message::new(ty, flags);
    let (family, prefix, bytes): (u8, u8, Vec<u8>) = match addr {
        IpAddr::V4(a) => (AF_INET, 32, a.octets().to_vec()),
        IpAddr::V6(a) => (AF_INET6, 128, a.octets().to_vec()),
    };
    let mut hdr = [family, prefix, IFA_F_NODAD, 0, 0, 0, 0, 0];
    hdr[4..8].copy_from_slice(&index.to_ne_bytes());
    m.raw(&hdr);
    m.attr(IFA_LOCAL, &bytes);
    m.attr(IFA_ADDRESS, &bytes);
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_dummy_is_an_exclusive_create_with_link_kind() {
        let b = create_dummy_request("kube-ipvs0").finish(1);
        // header: type RTM_NEWLINK, flags REQUEST|ACK|EXCL|CREATE
        assert_eq!(u16::from_ne_bytes([b[4], b[5]]), RTM_NEWLINK);
        assert_eq!(u16::from_ne_bytes([b[6], b[7]]), 0x605);
        // ifinfomsg: flags and change = IFF_UP
        assert_eq!(&b[24..32], &[1, 0, 0, 0, 1, 0, 0, 0]);
        let attrs: Vec<_> = netlink::attrs(&b[32..]).collect();
        assert_eq!(netlink::get_str(attrs[0].1).unwrap(), "kube-ipvs0");
        let kind = netlink::find(attrs[1].1, IFLA_INFO_KIND).and_then(netlink::get_str);
        assert_eq!(kind.as_deref(), Some("dummy"));
    }

    #[test]
    fn address_requests_carry_host_prefixes_and_no_dad() {
        let b = address_request(true, 7, "fd00:96::10".parse().unwrap()).finish(1);
        assert_eq!(&b[16..24], &[AF_INET6, 128, IFA_F_NODAD, 0, 7, 0, 0, 0]);
        let v4 = address_request(false, 7, "198.18.128.10".parse().unwrap()).finish(1);
        assert_eq!(u16::from_ne_bytes([v4[4], v4[5]]), RTM_DELADDR);
        assert_eq!(&v4[16..18], &[AF_INET, 32]);
        assert_eq!(parse_address(&v4[16..], 7), Some("198.18.128.10".parse().unwrap()));
        assert_eq!(parse_address(&v4[16..], 8), None);
    }
}
