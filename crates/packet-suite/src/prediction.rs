//! Every probe also asks explain ([`kproxy_plan::explain`]) what the plan predicts, and the
//! prediction must hold against the real packets ([`Explanation::agrees_with`]): the backends
//! that answered are among the predicted endpoints (all of them, when the case probes until
//! every expected backend answered), a predicted reject is refused and a predicted drop times
//! out, and the source the backends saw is the predicted one.

use std::net::IpAddr;

use kproxy_plan::Plan;
use kproxy_plan::explain::{Explanation, Host, Observed, Packet, Strictness, explain};
use kproxy_state::{ClusterState, Protocol};
use kproxy_testbed::{Proto, Tally, Testbed};

use crate::cluster::NODE_A;
use crate::runner::{Check, Expect};

/// The node as explain needs it: its Node object's pod CIDRs and the addresses its namespace
/// has now (steps add some).
pub fn host(tb: &Testbed, state: &ClusterState) -> Result<Host, String> {
    let listing = tb.node().exec_ok("ip", &["-o", "addr", "show"]).map_err(|e| e.to_string())?;
    // `2: eth0    inet 198.18.0.2/24 brd … scope global eth0`: the word after inet / inet6.
    let addresses = listing
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace().skip_while(|w| *w != "inet" && *w != "inet6");
            words.nth(1)?.split('/').next()?.parse().ok()
        })
        .collect();
    Ok(Host::of_node(state, NODE_A, addresses))
}

/// The kernel's protocol for a probe's.
pub fn protocol(proto: Proto) -> Protocol {
    match proto {
        Proto::Tcp => Protocol::Tcp,
        Proto::Udp => Protocol::Udp,
        Proto::Sctp => Protocol::Sctp,
    }
}

/// What explain says about the check's packet from `client`.
pub fn predict(plan: &Plan, host: &Host, client: IpAddr, c: &Check) -> Explanation {
    explain(plan, host, &Packet { from: client, to: c.dest.addr(), protocol: protocol(c.proto) })
}

/// Checks `prediction` against what `probes` probes of `c` observed (`tally`).
pub fn check(
    tb: &Testbed,
    c: &Check,
    client: IpAddr,
    prediction: &Explanation,
    tally: &Tally,
    probes: usize,
) -> Result<(), String> {
    let v6 = c.dest.addr().is_ipv6();
    let mut observed = Observed {
        probes,
        answered: tally.backends.values().sum(),
        seen_sources: tally.seen_sources.keys().copied().collect(),
        refused: tally.refused + tally.unreachable,
        timed_out: tally.timed_out,
        ..Observed::default()
    };
    for name in tally.backends.keys() {
        let pod = tb.pod(name).ok_or_else(|| format!("backend {name} is no pod of the testbed"))?;
        observed.answered_by.insert(if v6 { IpAddr::V6(pod.ipv6()) } else { IpAddr::V4(pod.ipv4()) });
    }
    // The runner probes these until every expected backend answered.
    let strictness = Strictness {
        silent: Default::default(),
        expect_coverage: matches!(c.expect, Expect::Backends(_) | Expect::Even(_)),
    };
    prediction
        .agrees_with(client, &observed, &strictness)
        .map_err(|why| format!("explain's prediction does not hold: {why}; explain said {prediction:?}"))
}
