//! The whole IPVS table in one read: `/proc/net/ip_vs` lists every virtual service of the
//! reader's network namespace with its real servers, their weights and connection counts.
//!
//! Why: generic netlink has no dump of every real server — its real-server dump takes one
//! service — so reading 10k virtual services' real servers that way is 10k round trips. The
//! text lacks some service settings (scheduler flags) and does not say a firewall-mark
//! service's family, so it is [`join`]ed with the one generic netlink dump of the services,
//! which has them.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kproxy_state::{IpFamily, Protocol};

use crate::genl::{DestKey, DestSpec, DestState, ServiceKey, ServiceSpec};

/// The table of the calling thread's network namespace (`/proc/net` follows the process's
/// first thread, which need not be in the same one).
pub const PATH: &str = "/proc/thread-self/net/ip_vs";

/// A virtual service as the text names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// `TCP  C612800A:0050 rr`.
    Addr(ServiceKey),
    /// `FWM  10000001 rr` (either family).
    Fwmark(u32),
    /// A protocol kproxy does not use (`AH`, `ESP`): never kproxy's.
    Other,
}

/// `C612800A:0050` or `[fd00:0096:…:0010]:0050`.
fn addr_port(s: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = match s.strip_prefix('[') {
        Some(v6) => {
            let (a, p) = v6.split_once("]:")?;
            (IpAddr::V6(a.parse::<Ipv6Addr>().ok()?), p)
        }
        None => {
            let (a, p) = s.split_once(':')?;
            (IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(a, 16).ok()?)), p)
        }
    };
    Some((addr, u16::from_str_radix(port, 16).ok()?))
}

fn service_line(words: &[&str]) -> Option<Listed> {
    let protocol = match *words.first()? {
        "FWM" => return Some(Listed::Fwmark(u32::from_str_radix(words.get(1)?, 16).ok()?)),
        "TCP" => Protocol::Tcp,
        "UDP" => Protocol::Udp,
        "SCTP" => Protocol::Sctp,
        _ => return Some(Listed::Other),
    };
    let (addr, port) = addr_port(words.get(1)?)?;
    Some(Listed::Addr(ServiceKey::Addr { addr, protocol, port }))
}

/// `-> C6121010:1F90      Masq    1      0          0`.
fn dest_line(words: &[&str]) -> Option<DestState> {
    let (addr, port) = addr_port(words.get(1)?)?;
    let number = |i: usize| words.get(i).and_then(|w| w.parse::<u32>().ok());
    Some(DestState {
        spec: DestSpec { key: DestKey { addr, port }, weight: number(3)? },
        active_conns: number(4)?,
        inactive_conns: number(5)?,
    })
}

/// Every service of the text with its real servers; `None` when a line is not understood (the
/// caller then asks generic netlink service by service).
pub fn parse(text: &str) -> Option<Vec<(Listed, Vec<DestState>)>> {
    let mut out: Vec<(Listed, Vec<DestState>)> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first() {
            None => {}
            // The three header lines.
            Some(&"IP") | Some(&"Prot") => {}
            Some(&"->") if words.get(1).is_some_and(|w| w.starts_with("RemoteAddress")) => {}
            Some(&"->") => out.last_mut()?.1.push(dest_line(&words)?),
            Some(_) => out.push((service_line(&words)?, Vec::new())),
        }
    }
    Some(out)
}

/// Joins the services of the generic netlink dump with the real servers of the text. Returns
/// the services with their real servers, and those the text does not have (created after it
/// was read, or a firewall-mark service it is ambiguous about), for the caller to ask about.
///
/// A firewall-mark service of each family may have the same mark: the family of a text entry
/// is that of its real servers (NAT forwarding needs the service's family), and an entry
/// without any goes to a service of that mark not matched otherwise.
pub fn join(
    services: Vec<ServiceSpec>,
    listed: Vec<(Listed, Vec<DestState>)>,
) -> (Vec<(ServiceSpec, Vec<DestState>)>, Vec<ServiceSpec>) {
    let mut by_key: BTreeMap<ServiceKey, Vec<DestState>> = BTreeMap::new();
    let mut by_mark: BTreeMap<u32, Vec<Vec<DestState>>> = BTreeMap::new();
    for (what, dests) in listed {
        match what {
            Listed::Addr(key) => {
                by_key.insert(key, dests);
            }
            Listed::Fwmark(mark) => by_mark.entry(mark).or_default().push(dests),
            Listed::Other => {}
        }
    }
    let mut joined = Vec::with_capacity(services.len());
    let mut unmatched = Vec::new();
    // Firewall-mark services whose real servers name their family first, then the others.
    let (marks, addrs): (Vec<ServiceSpec>, Vec<ServiceSpec>) =
        services.into_iter().partition(|s| matches!(s.key, ServiceKey::Fwmark { .. }));
    for spec in addrs {
        match by_key.remove(&spec.key) {
            Some(dests) => joined.push((spec, dests)),
            None => unmatched.push(spec),
        }
    }
    let mut empty_handed = Vec::new();
    for spec in marks {
        let ServiceKey::Fwmark { family, mark } = spec.key else { continue };
        let entries = by_mark.entry(mark).or_default();
        let of_family = |d: &Vec<DestState>| d.first().is_some_and(|d| IpFamily::of(&d.spec.key.addr) == family);
        match entries.iter().position(of_family) {
            Some(i) => joined.push((spec, entries.remove(i))),
            None => empty_handed.push(spec),
        }
    }
    for spec in empty_handed {
        let ServiceKey::Fwmark { mark, .. } = spec.key else { continue };
        let entries = by_mark.entry(mark).or_default();
        match entries.iter().position(Vec::is_empty) {
            Some(i) => joined.push((spec, entries.remove(i))),
            None => unmatched.push(spec),
        }
    }
    (joined, unmatched)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout of `ip_vs_info_seq_show` (Linux 6.1): IPv4 in hex, IPv6 in full `%pI6`.
    const TABLE: &str = "IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  C612800A:0050 rr 
  -> C6121010:1F90      Masq    1      0          0         
  -> C6121110:1F90      Masq    0      3          1         
UDP  C612800B:0035 rr persistent 10800 FFFFFFFF
TCP  [fd00:0096:0000:0000:0000:0000:0000:0010]:0050 rr 
  -> [fd00:0010:0000:0000:0000:0000:0000:000a]:1F90      Masq    1      0          0         
FWM  10000001 rr 
  -> [fd00:0010:0000:0000:0000:0000:0000:000a]:1F90      Masq    1      0          0         
FWM  10000001 rr 
FWM  10000002 rr 
  -> C6121010:1F90      Masq    1      0          0         
";

    fn key(s: &str, protocol: Protocol) -> ServiceKey {
        let a: std::net::SocketAddr = s.parse().unwrap();
        ServiceKey::Addr { addr: a.ip(), protocol, port: a.port() }
    }

    fn spec(key: ServiceKey) -> ServiceSpec {
        ServiceSpec { key, scheduler: "rr".into(), flags: 0, timeout: 0 }
    }

    #[test]
    fn every_service_and_real_server_of_the_text_is_read() {
        let listed = parse(TABLE).unwrap();
        assert_eq!(listed.len(), 6);
        assert_eq!(listed[0].0, Listed::Addr(key("198.18.128.10:80", Protocol::Tcp)));
        let dests: Vec<_> = listed[0].1.iter().map(|d| (d.spec.key.addr.to_string(), d.spec.weight)).collect();
        assert_eq!(dests, [("198.18.16.16".to_owned(), 0x1), ("198.18.17.16".to_owned(), 0)]);
        assert_eq!((listed[0].1[1].active_conns, listed[0].1[1].inactive_conns), (3, 1));
        assert_eq!(listed[1].0, Listed::Addr(key("198.18.128.11:53", Protocol::Udp)));
        assert!(listed[1].1.is_empty());
        assert_eq!(listed[2].0, Listed::Addr(key("[fd00:96::10]:80", Protocol::Tcp)));
        assert_eq!(listed[2].1[0].spec.key, DestKey { addr: "fd00:10::a".parse().unwrap(), port: 8080 });
        assert_eq!(listed[3].0, Listed::Fwmark(0x1000_0001));
    }

    #[test]
    fn a_line_not_understood_gives_up_on_the_text() {
        assert!(parse("TCP  nonsense rr\n").is_none());
        assert!(parse(&format!("{TABLE}  -> C6121010:1F90 Masq one 0 0\n")).is_none());
        assert!(parse("  -> C6121010:1F90      Masq    1      0          0\n").is_none(), "a real server first");
    }

    #[test]
    fn firewall_mark_services_of_both_families_get_the_real_servers_of_their_family() {
        let v4 = ServiceKey::Fwmark { family: IpFamily::V4, mark: 0x1000_0001 };
        let v6 = ServiceKey::Fwmark { family: IpFamily::V6, mark: 0x1000_0001 };
        let other = ServiceKey::Fwmark { family: IpFamily::V4, mark: 0x1000_0002 };
        let gone = key("198.18.128.99:80", Protocol::Tcp);
        let services = vec![spec(v4), spec(v6), spec(other), spec(gone), spec(key("198.18.128.10:80", Protocol::Tcp))];
        let (joined, unmatched) = join(services, parse(TABLE).unwrap());
        let dests = |k: ServiceKey| {
            let (_, d) = joined.iter().find(|(s, _)| s.key == k).unwrap();
            d.iter().map(|d| d.spec.key.addr.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(dests(v6), ["fd00:10::a"]);
        assert!(dests(v4).is_empty(), "the entry without real servers");
        assert_eq!(dests(other), ["198.18.16.16"]);
        assert_eq!(dests(key("198.18.128.10:80", Protocol::Tcp)).len(), 2);
        assert_eq!(unmatched, vec![spec(gone)], "not in the text: asked about separately");
    }
}
