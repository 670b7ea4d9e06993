//! Upstream-style object names: `<prefix>-<HASH8>-<ns>/<svc>/<proto>/<port>`.
//!
//! The hash (first 8 characters of base32(sha256(base))) keeps names unique even though the
//! readable part is only informative; names are stable across restarts, so a full resync
//! replaces chains in place. Names fit nf_tables' 256-byte limit (namespace and service names
//! are at most 63 bytes, port names 15).

use std::net::IpAddr;

use kproxy_plan::ServicePortName;
use sha2::{Digest, Sha256};

/// The readable base: `ns/svc/proto/port`.
pub fn base(name: &ServicePortName) -> String {
    format!("{}/{}/{}/{}", name.namespace, name.service, name.protocol, name.port)
}

/// `<prefix>-<HASH8>-<base>`.
pub fn chain(prefix: &str, name: &ServicePortName) -> String {
    let base = base(name);
    format!("{prefix}-{}-{base}", hash8(&base))
}

/// A stable 64-bit id of an endpoint of a service port with an affinity timeout (the first
/// bytes of sha256 of `ns/svc/proto/port/timeout/ip/port`), as two 32-bit halves: with the
/// client's address, the key of the shared affinity set. The timeout is part of it so that a
/// changed timeout starts afresh, as a new set did when each service port had its own (an entry
/// keeps the timeout it was written with until a packet refreshes it). Two pairs sharing an id
/// (odds about n²/2^65 for n pairs on the node) would share their sticky clients.
pub fn affinity_id(name: &ServicePortName, timeout: u32, ip: IpAddr, port: u16) -> [u32; 2] {
    let digest = Sha256::digest(format!("{}/{timeout}/{ip}/{port}", base(name)).as_bytes());
    let half = |i: usize| u32::from_be_bytes([digest[i], digest[i + 1], digest[i + 2], digest[i + 3]]);
    [half(0), half(4)]
}

/// The first 8 characters of the RFC 4648 base32 encoding of sha256(`s`): exactly 40 bits.
pub fn hash8(s: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(s.as_bytes());
    let bits = digest[..5].iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    (0..8).map(|i| ALPHABET[((bits >> (35 - 5 * i)) & 31) as usize] as char).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kproxy_state::Protocol;

    use super::*;

    #[test]
    fn hash_matches_upstream_for_a_known_name() {
        // Upstream's golden dump names ns1/svc1 port p80 "service-ULMVA6XW-ns1/svc1/tcp/p80".
        assert_eq!(hash8("ns1/svc1/tcp/p80"), "ULMVA6XW");
    }

    #[test]
    fn chain_names_are_prefixed_hashed_and_readable() {
        let n = ServicePortName {
            namespace: "ns1".into(),
            service: "svc1".into(),
            port: "p80".into(),
            protocol: Protocol::Tcp,
        };
        assert_eq!(chain("service", &n), "service-ULMVA6XW-ns1/svc1/tcp/p80");
    }

    #[test]
    fn affinity_ids_differ_by_service_port_timeout_and_endpoint() {
        let n = |port: &str| ServicePortName {
            namespace: "ns1".into(),
            service: "svc1".into(),
            port: port.into(),
            protocol: Protocol::Tcp,
        };
        let (a, b) = ("198.18.16.2".parse().unwrap(), "fd00::1".parse().unwrap());
        let (p80, p81) = (n("p80"), n("p81"));
        let id = affinity_id;
        assert_eq!(id(&p80, 10800, a, 80), id(&p80, 10800, a, 80));
        assert_ne!(id(&p80, 10800, a, 80), id(&p80, 10800, a, 81));
        assert_ne!(id(&p80, 10800, a, 80), id(&p80, 10800, b, 80));
        assert_ne!(id(&p80, 10800, a, 80), id(&p81, 10800, a, 80));
        assert_ne!(id(&p80, 10800, a, 80), id(&p80, 60, a, 80), "a new timeout starts afresh");
    }
}
