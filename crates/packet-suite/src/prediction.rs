//! Every probe also asks explain ([`kproxy_plan::explain`]) what the plan predicts, and the
//! prediction must hold against the real packets: the backends that answered are among the
//! predicted endpoints (all of them, when the case probes until every expected backend
//! answered), a predicted reject is refused and a predicted drop times out, and the source the
//! backends saw is the one predicted (the client's when not masqueraded; the SNAT address when
//! it is known, else anything but the client's).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;

use kproxy_plan::Plan;
use kproxy_plan::explain::{Explanation, Host, Packet, SourceKind, Verdict, explain};
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

fn protocol(proto: Proto) -> Protocol {
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
    log: &mut String,
) -> Result<(), String> {
    let predicted: BTreeSet<IpAddr> = prediction.endpoints.iter().map(|e| e.address.ip()).collect();
    let _ = writeln!(
        log,
        "  explain: {} to {predicted:?}, masquerade {}, source seen {:?}: {}",
        prediction.verdict, prediction.masquerade, prediction.source_seen, prediction.reason
    );
    let fail = |why: String| Err(format!("explain's prediction does not hold: {why}; explain said {prediction:?}"));
    let answered: usize = tally.backends.values().sum();
    let v6 = c.dest.addr().is_ipv6();
    let mut seen = BTreeSet::new();
    for name in tally.backends.keys() {
        let pod = tb.pod(name).ok_or_else(|| format!("backend {name} is no pod of the testbed"))?;
        seen.insert(if v6 { IpAddr::V6(pod.ipv6()) } else { IpAddr::V4(pod.ipv4()) });
    }
    match prediction.verdict {
        Verdict::Dnat => {
            if !seen.is_subset(&predicted) {
                return fail(format!("backends {seen:?} answered, outside the predicted endpoints"));
            }
            // The runner probes these until every expected backend answered.
            let probed_to_coverage = matches!(c.expect, Expect::Backends(_) | Expect::Even(_)) && answered == probes;
            if probed_to_coverage && seen != predicted {
                return fail(format!("backends {seen:?} answered, not every predicted endpoint"));
            }
            check_source(prediction, client, tally).or_else(fail)?;
        }
        Verdict::Reject if tally.refused != probes => return fail(format!("not every probe was refused: {tally:?}")),
        Verdict::Drop if tally.timed_out != probes => return fail(format!("not every probe timed out: {tally:?}")),
        Verdict::None if answered > 0 => return fail(format!("kproxy leaves it alone, yet {seen:?} answered")),
        Verdict::Reject | Verdict::Drop | Verdict::None => {}
    }
    Ok(())
}

/// The sources the backends saw against the prediction, when every endpoint is predicted alike
/// (a hairpin client sees different sources at different endpoints, so per-endpoint sources
/// are only checked by the case's own expectation).
fn check_source(prediction: &Explanation, client: IpAddr, tally: &Tally) -> Result<(), String> {
    let sources: BTreeSet<IpAddr> = tally.seen_sources.keys().copied().collect();
    let eps = &prediction.endpoints;
    if eps.iter().all(|e| !e.masquerade) {
        if sources.iter().any(|s| *s != client) {
            return Err(format!("predicted unmasqueraded, but the backends saw {sources:?}"));
        }
    } else if eps.iter().all(|e| e.masquerade) {
        // The node's own packets are masqueraded to a node address, possibly the one they had.
        if prediction.source != SourceKind::Node && sources.contains(&client) {
            return Err(format!("predicted masqueraded, but the backends saw the client {client}"));
        }
        let certain: BTreeSet<IpAddr> = eps.iter().filter(|e| e.source_seen_certain).map(|e| e.source_seen).collect();
        if eps.iter().all(|e| e.source_seen_certain) && !sources.is_subset(&certain) {
            return Err(format!("predicted the source {certain:?}, but the backends saw {sources:?}"));
        }
    }
    Ok(())
}
