//! Whether real packets did what an [`Explanation`] predicted: the one judgement the packet
//! suite and the demo share.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::{Explanation, SourceKind, Verdict};

/// What probes of the explained packet's destination observed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// How many probes were sent.
    pub probes: usize,
    /// Probes answered by an endpoint.
    pub answered: usize,
    /// The addresses of the endpoints that answered.
    pub answered_by: BTreeSet<IpAddr>,
    /// The source addresses those endpoints saw.
    pub seen_sources: BTreeSet<IpAddr>,
    /// Probes refused (TCP reset, ICMP port unreachable).
    pub refused: usize,
    /// Probes that got no answer at all.
    pub timed_out: usize,
}

/// How strictly to compare.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Strictness {
    /// Predicted endpoints that can not answer (nothing runs there, e.g. a node a sandbox does
    /// not host): probes sent to them time out, which is expected.
    pub silent: BTreeSet<IpAddr>,
    /// Enough probes were sent for every predicted endpoint that can answer to have answered.
    pub expect_coverage: bool,
}

impl Explanation {
    /// `Ok` when `observed` (probes from `client`) is what this explanation predicts, else why
    /// not: a DNAT is answered only by predicted endpoints (by all of them with
    /// `expect_coverage`) and every probe is answered unless a silent endpoint was picked; a
    /// reject is refused and a drop times out every time; kproxy's `none` is answered by no
    /// endpoint; unmasqueraded endpoints see the client, masqueraded ones never do (unless the
    /// client is the node, masqueraded to its own address) and see the SNAT address when it is
    /// certain. Sources are compared when every endpoint is predicted alike.
    pub fn agrees_with(&self, client: IpAddr, observed: &Observed, strictness: &Strictness) -> Result<(), String> {
        let o = observed;
        let predicted: BTreeSet<IpAddr> = self.endpoints.iter().map(|e| e.address.ip()).collect();
        match self.verdict {
            Verdict::Dnat => {
                if !o.answered_by.is_subset(&predicted) {
                    return Err(format!("answered by {:?}, outside the predicted {predicted:?}", o.answered_by));
                }
                let can_answer: BTreeSet<IpAddr> = predicted.difference(&strictness.silent).copied().collect();
                if strictness.expect_coverage && o.answered_by != can_answer {
                    return Err(format!("answered by {:?}, not by every predicted {can_answer:?}", o.answered_by));
                }
                let may_time_out = !strictness.silent.is_disjoint(&predicted);
                if o.answered + if may_time_out { o.timed_out } else { 0 } != o.probes {
                    return Err(format!("{} of {} probes unanswered: {o:?}", o.probes - o.answered, o.probes));
                }
                self.sources_agree(client, &o.seen_sources)
            }
            Verdict::Reject if o.refused != o.probes => Err(format!("predicted reject, observed {o:?}")),
            Verdict::Drop if o.timed_out != o.probes => Err(format!("predicted drop, observed {o:?}")),
            Verdict::None if o.answered > 0 => Err(format!("kproxy leaves it alone, yet {:?} answered", o.answered_by)),
            Verdict::Reject | Verdict::Drop | Verdict::None => Ok(()),
        }
    }

    fn sources_agree(&self, client: IpAddr, seen: &BTreeSet<IpAddr>) -> Result<(), String> {
        let eps = &self.endpoints;
        if eps.iter().all(|e| !e.masquerade) {
            if seen.iter().any(|s| *s != client) {
                return Err(format!("predicted the client's source {client}, the endpoints saw {seen:?}"));
            }
        } else if eps.iter().all(|e| e.masquerade) {
            // The node's own packets are masqueraded to a node address, possibly the one they had.
            if self.source != SourceKind::Node && seen.contains(&client) {
                return Err(format!("predicted masqueraded, the endpoints saw the client {client}"));
            }
            let snat: BTreeSet<IpAddr> = eps.iter().filter_map(|e| e.source_seen).collect();
            if eps.iter().all(|e| e.source_seen_certain) && !seen.is_subset(&snat) {
                return Err(format!("predicted the source {snat:?}, the endpoints saw {seen:?}"));
            }
        }
        Ok(())
    }
}
