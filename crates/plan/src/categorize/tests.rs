//! Table-driven cases for endpoint categorization, modelled on the situations upstream's
//! `TestCategorizeEndpoints` covers (written independently).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::*;

const NODE: &str = "node-a";

/// A compact endpoint: "ip" plus flags. `r` ready, `s` serving, `t` terminating, `l` local.
struct Ep {
    ip: &'static str,
    flags: &'static str,
    zones: &'static [&'static str],
    nodes: &'static [&'static str],
}

const fn ep(ip: &'static str, flags: &'static str) -> Ep {
    Ep { ip, flags, zones: &[], nodes: &[] }
}

const fn zep(ip: &'static str, flags: &'static str, zones: &'static [&'static str]) -> Ep {
    Ep { ip, flags, zones, nodes: &[] }
}

const fn nep(
    ip: &'static str,
    flags: &'static str,
    zones: &'static [&'static str],
    nodes: &'static [&'static str],
) -> Ep {
    Ep { ip, flags, zones, nodes }
}

fn candidate(e: &Ep) -> Candidate {
    Candidate {
        ip: e.ip.parse().unwrap(),
        port: 80,
        is_local: e.flags.contains('l'),
        ready: e.flags.contains('r'),
        serving: e.flags.contains('s') || e.flags.contains('r'),
        terminating: e.flags.contains('t'),
        zone_hints: e.zones.iter().map(|z| z.to_string()).collect(),
        node_hints: e.nodes.iter().map(|n| n.to_string()).collect(),
    }
}

struct Case {
    name: &'static str,
    uses_cluster: bool,
    uses_local: bool,
    zone: Option<&'static str>,
    endpoints: &'static [Ep],
    cluster: &'static [&'static str],
    local: &'static [&'static str],
    has_any: bool,
}

fn ips(list: &[Endpoint]) -> BTreeSet<IpAddr> {
    list.iter().map(|e| e.ip).collect()
}

fn want(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

const CASES: &[Case] = &[
    Case {
        name: "zone hints pick same-zone endpoints",
        uses_cluster: true,
        uses_local: false,
        zone: Some("zone-a"),
        endpoints: &[
            zep("198.18.16.3", "r", &["zone-a"]),
            zep("198.18.16.4", "r", &["zone-b"]),
            zep("198.18.16.5", "r", &["zone-c"]),
            zep("198.18.16.6", "r", &["zone-a"]),
        ],
        cluster: &["198.18.16.3", "198.18.16.6"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "endpoint with several zone hints counts for each",
        uses_cluster: true,
        uses_local: false,
        zone: Some("zone-b"),
        endpoints: &[zep("198.18.16.3", "r", &["zone-a", "zone-b"]), zep("198.18.16.4", "r", &["zone-c"])],
        cluster: &["198.18.16.3"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "a ready endpoint without hints disables topology",
        uses_cluster: true,
        uses_local: false,
        zone: Some("zone-a"),
        endpoints: &[zep("198.18.16.3", "r", &["zone-a"]), ep("198.18.16.4", "r")],
        cluster: &["198.18.16.3", "198.18.16.4"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "no endpoint hinted for this zone: no topology",
        uses_cluster: true,
        uses_local: false,
        zone: Some("zone-z"),
        endpoints: &[zep("198.18.16.3", "r", &["zone-a"]), zep("198.18.16.4", "r", &["zone-b"])],
        cluster: &["198.18.16.3", "198.18.16.4"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "node without zone label: no topology",
        uses_cluster: true,
        uses_local: false,
        zone: None,
        endpoints: &[zep("198.18.16.3", "r", &["zone-a"]), zep("198.18.16.4", "r", &["zone-b"])],
        cluster: &["198.18.16.3", "198.18.16.4"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "unready endpoints are ignored when deciding topology",
        uses_cluster: true,
        uses_local: false,
        zone: Some("zone-a"),
        endpoints: &[zep("198.18.16.3", "r", &["zone-a"]), ep("198.18.16.4", ""), zep("198.18.16.5", "r", &["zone-b"])],
        cluster: &["198.18.16.3"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "node hints win over zone hints (PreferSameNode)",
        uses_cluster: true,
        uses_local: false,
        zone: Some("zone-a"),
        endpoints: &[
            nep("198.18.16.3", "r", &["zone-a"], &["node-a"]),
            nep("198.18.16.4", "r", &["zone-a"], &["node-b"]),
            nep("198.18.16.5", "r", &["zone-b"], &["node-c"]),
        ],
        cluster: &["198.18.16.3"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "no endpoint hinted for this node falls back to zone hints",
        uses_cluster: true,
        uses_local: false,
        zone: Some("zone-a"),
        endpoints: &[
            nep("198.18.16.4", "r", &["zone-a"], &["node-b"]),
            nep("198.18.16.5", "r", &["zone-b"], &["node-c"]),
        ],
        cluster: &["198.18.16.4"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "missing node hint on one endpoint falls back to zone hints",
        uses_cluster: true,
        uses_local: false,
        zone: Some("zone-b"),
        endpoints: &[nep("198.18.16.3", "r", &["zone-a"], &["node-a"]), zep("198.18.16.5", "r", &["zone-b"])],
        cluster: &["198.18.16.5"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "cluster policy uses only ready endpoints when some are ready",
        uses_cluster: true,
        uses_local: false,
        zone: None,
        endpoints: &[ep("198.18.16.3", "r"), ep("198.18.16.4", "st"), ep("198.18.16.5", "")],
        cluster: &["198.18.16.3"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "cluster policy falls back to serving terminating endpoints",
        uses_cluster: true,
        uses_local: false,
        zone: None,
        endpoints: &[ep("198.18.16.3", "st"), ep("198.18.16.4", "t"), ep("198.18.16.5", "")],
        cluster: &["198.18.16.3"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "no ready and no serving endpoints: nothing anywhere",
        uses_cluster: true,
        uses_local: false,
        zone: None,
        endpoints: &[ep("198.18.16.3", ""), ep("198.18.16.4", "t")],
        cluster: &[],
        local: &[],
        has_any: false,
    },
    Case {
        name: "iTP Local: no endpoints at all",
        uses_cluster: false,
        uses_local: true,
        zone: None,
        endpoints: &[],
        cluster: &[],
        local: &[],
        has_any: false,
    },
    Case {
        name: "iTP Local: all endpoints remote",
        uses_cluster: false,
        uses_local: true,
        zone: None,
        endpoints: &[ep("198.18.17.3", "r"), ep("198.18.17.4", "r")],
        cluster: &[],
        local: &[],
        has_any: true,
    },
    Case {
        name: "iTP Local: some endpoints local",
        uses_cluster: false,
        uses_local: true,
        zone: None,
        endpoints: &[ep("198.18.16.3", "rl"), ep("198.18.17.4", "r")],
        cluster: &[],
        local: &["198.18.16.3"],
        has_any: true,
    },
    Case {
        name: "topology is ignored for local endpoints",
        uses_cluster: true,
        uses_local: true,
        zone: Some("zone-a"),
        endpoints: &[zep("198.18.16.3", "rl", &["zone-b"]), zep("198.18.17.4", "r", &["zone-a"])],
        cluster: &["198.18.17.4"],
        local: &["198.18.16.3"],
        has_any: true,
    },
    Case {
        name: "local policy falls back to local serving terminating endpoints",
        uses_cluster: true,
        uses_local: true,
        zone: None,
        endpoints: &[ep("198.18.16.3", "stl"), ep("198.18.17.4", "r")],
        cluster: &["198.18.17.4"],
        local: &["198.18.16.3"],
        has_any: true,
    },
    Case {
        name: "local ready endpoints win over local terminating ones",
        uses_cluster: false,
        uses_local: true,
        zone: None,
        endpoints: &[ep("198.18.16.3", "stl"), ep("198.18.16.4", "rl")],
        cluster: &[],
        local: &["198.18.16.4"],
        has_any: true,
    },
    Case {
        name: "iTP and eTP Local, all endpoints remote and terminating",
        uses_cluster: true,
        uses_local: true,
        zone: None,
        endpoints: &[ep("198.18.17.3", "st"), ep("198.18.17.4", "st")],
        cluster: &["198.18.17.3", "198.18.17.4"],
        local: &[],
        has_any: true,
    },
    Case {
        name: "local not-serving terminating endpoint is never used",
        uses_cluster: false,
        uses_local: true,
        zone: None,
        endpoints: &[ep("198.18.16.3", "tl")],
        cluster: &[],
        local: &[],
        has_any: false,
    },
];

#[test]
fn categorize_cases() {
    for case in CASES {
        let candidates: Vec<Candidate> = case.endpoints.iter().map(candidate).collect();
        let got = categorize_endpoints(&candidates, case.uses_cluster, case.uses_local, NODE, case.zone);
        assert_eq!(ips(&got.cluster), want(case.cluster), "{}: cluster endpoints", case.name);
        assert_eq!(ips(&got.local), want(case.local), "{}: local endpoints", case.name);
        assert_eq!(got.has_any, case.has_any, "{}: has_any", case.name);
    }
}
