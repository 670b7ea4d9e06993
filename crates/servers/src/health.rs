//! The proxy's own health, as kube-proxy defines it.
//!
//! The sync loop reports two things per IP family: "a change is queued" ([`ProxyHealth::queued_update`])
//! and "everything queued is now programmed" ([`ProxyHealth::updated`]). A family is unhealthy when
//! its oldest unapplied change has waited `healthz_timeout` (2 × syncPeriod upstream) or longer.
//! As upstream, a family only counts once it has completed its first sync: while starting up the
//! proxy reports healthy. `/healthz` additionally requires the Node to be eligible (not being
//! deleted, not tainted `ToBeDeletedByClusterAutoscaler`) so that cloud load balancers drain nodes
//! about to go away (KEP-3836); `/livez` ignores the Node.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use kproxy_state::IpFamily;

use crate::clock::{Clock, SystemClock};
use crate::timefmt::rfc3339_nano;

/// Shared health state of the proxy; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct ProxyHealth {
    healthz_timeout: Duration,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    last_updated: BTreeMap<IpFamily, SystemTime>,
    oldest_pending: BTreeMap<IpFamily, SystemTime>,
    node_eligible: bool,
}

/// Health of one IP family's proxier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyHealth {
    /// When that family last completed a sync.
    pub last_updated: SystemTime,
    /// Whether it is healthy.
    pub healthy: bool,
}

/// A snapshot of the proxy's health at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthStatus {
    /// The most recent sync completion over all families; `None` before the first.
    pub last_updated: Option<SystemTime>,
    /// When the snapshot was taken.
    pub current_time: SystemTime,
    /// All families healthy (the Node is not considered).
    pub healthy: bool,
    /// Per-family health, for families that have synced at least once.
    pub families: BTreeMap<IpFamily, FamilyHealth>,
}

impl ProxyHealth {
    /// The timeout kube-proxy uses: twice the sync period.
    pub fn healthz_timeout_for(sync_period: Duration) -> Duration {
        sync_period.saturating_mul(2)
    }

    /// Health on the system clock. The Node starts eligible, as upstream before it sees its Node.
    pub fn new(healthz_timeout: Duration) -> Self {
        Self::with_clock(healthz_timeout, Arc::new(SystemClock))
    }

    /// Health on a given clock (tests use [`crate::FakeClock`]).
    pub fn with_clock(healthz_timeout: Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            healthz_timeout,
            clock,
            state: Mutex::new(State {
                last_updated: BTreeMap::new(),
                oldest_pending: BTreeMap::new(),
                node_eligible: true,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent even if a holder panicked: every update is a single insert.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The clock this health reads.
    pub fn now(&self) -> SystemTime {
        self.clock.now()
    }

    /// The timeout after which a queued, unapplied change makes the proxy unhealthy.
    pub fn healthz_timeout(&self) -> Duration {
        self.healthz_timeout
    }

    /// A change for `family` arrived and is not yet programmed. Only the oldest pending one counts.
    pub fn queued_update(&self, family: IpFamily) {
        let now = self.clock.now();
        self.state().oldest_pending.entry(family).or_insert(now);
    }

    /// `family` has programmed everything queued so far.
    pub fn updated(&self, family: IpFamily) {
        let now = self.clock.now();
        let mut state = self.state();
        state.oldest_pending.remove(&family);
        state.last_updated.insert(family, now);
    }

    /// Records whether the Node may receive load-balancer traffic (false while it is being deleted
    /// or tainted for removal; see `NodeInfo::draining`).
    pub fn set_node_eligible(&self, eligible: bool) {
        self.state().node_eligible = eligible;
    }

    /// Whether the Node may receive load-balancer traffic.
    pub fn node_eligible(&self) -> bool {
        self.state().node_eligible
    }

    /// The proxy's own health (what `/livez` and the service health checks use).
    pub fn is_healthy(&self) -> bool {
        self.status().healthy
    }

    /// Whether this node is programmed: every family's first sync reached the kernel, and no
    /// change has waited `healthz_timeout` since (what `/readyz` answers; kproxy's own, upstream
    /// has no such probe: its `/healthz` is 200 from the start).
    pub fn is_ready(&self) -> bool {
        let status = self.status();
        status.last_updated.is_some() && status.healthy
    }

    /// A snapshot of the proxy's health now.
    pub fn status(&self) -> HealthStatus {
        let now = self.clock.now();
        let state = self.state();
        let mut families = BTreeMap::new();
        let mut healthy = true;
        for (&family, &last_updated) in &state.last_updated {
            let late = state.oldest_pending.get(&family).is_some_and(|&queued| {
                // A queued time in the future (clock stepped back) is not late.
                now.duration_since(queued).is_ok_and(|waited| waited >= self.healthz_timeout)
            });
            healthy &= !late;
            families.insert(family, FamilyHealth { last_updated, healthy: !late });
        }
        HealthStatus { last_updated: state.last_updated.values().max().copied(), current_time: now, healthy, families }
    }
}

/// Which of the two probes is answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `/healthz`: proxy health and Node eligibility.
    Healthz,
    /// `/livez`: proxy health only.
    Livez,
    /// `/readyz` (kproxy's): the node is programmed ([`ProxyHealth::is_ready`]).
    Readyz,
}

/// A probe's verdict: the HTTP status and kube-proxy's JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResponse {
    /// 200 or 503.
    pub status: u16,
    /// The JSON body, field for field as kube-proxy writes it.
    pub body: String,
}

impl ProxyHealth {
    /// Answers a probe the way kube-proxy does.
    ///
    /// Body fields in upstream's order: `lastUpdated`, `currentTime`, `nodeEligible` (healthz only),
    /// `healthy` (the proxy's health, not counting the Node), and `status` per IP family (omitted
    /// when no family has synced). When the answer is 200, `lastUpdated` is the current time, as
    /// upstream keeps for compatibility with releases where it meant "the sync loop last ran".
    pub fn probe(&self, probe: Probe) -> ProbeResponse {
        let status = self.status();
        let node_eligible = match probe {
            Probe::Healthz => Some(self.node_eligible()),
            Probe::Livez | Probe::Readyz => None,
        };
        let ok = match probe {
            // Not programmed yet: no family has synced.
            Probe::Readyz => status.healthy && status.last_updated.is_some(),
            Probe::Healthz | Probe::Livez => status.healthy && node_eligible.unwrap_or(true),
        };
        let last_updated = if ok { Some(status.current_time) } else { status.last_updated };

        // Written by hand: field order is upstream's (Go marshals struct fields in declaration
        // order), which a JSON map would not keep. Every value is a timestamp, a bool or a family
        // name, none of which needs escaping.
        let mut body = format!(
            "{{\"lastUpdated\":\"{}\",\"currentTime\":\"{}\"",
            rfc3339_nano(last_updated),
            rfc3339_nano(Some(status.current_time))
        );
        if let Some(eligible) = node_eligible {
            body.push_str(&format!(",\"nodeEligible\":{eligible}"));
        }
        body.push_str(&format!(",\"healthy\":{}", status.healthy));
        if !status.families.is_empty() {
            let families: Vec<String> = status
                .families
                .iter()
                .map(|(family, health)| {
                    format!(
                        "\"{family}\":{{\"lastUpdated\":\"{}\",\"healthy\":{}}}",
                        rfc3339_nano(Some(health.last_updated)),
                        health.healthy
                    )
                })
                .collect();
            body.push_str(&format!(",\"status\":{{{}}}", families.join(",")));
        }
        body.push('}');
        ProbeResponse { status: if ok { 200 } else { 503 }, body }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use std::time::UNIX_EPOCH;

    fn fixture() -> (Arc<FakeClock>, ProxyHealth) {
        let clock = Arc::new(FakeClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
        let health = ProxyHealth::with_clock(Duration::from_secs(60), clock.clone());
        (clock, health)
    }

    #[test]
    fn healthy_while_starting_even_with_queued_changes() {
        let (clock, health) = fixture();
        health.queued_update(IpFamily::V4);
        clock.advance(Duration::from_secs(3600));
        assert!(health.is_healthy(), "a family that never synced does not count, as upstream");
    }

    #[test]
    fn late_queued_update_makes_only_that_family_unhealthy() {
        let (clock, health) = fixture();
        health.updated(IpFamily::V4);
        health.updated(IpFamily::V6);
        health.queued_update(IpFamily::V6);
        clock.advance(Duration::from_secs(30));
        health.queued_update(IpFamily::V6); // does not reset the oldest pending time
        clock.advance(Duration::from_secs(29));
        assert!(health.is_healthy());
        clock.advance(Duration::from_secs(1));
        let status = health.status();
        assert!(!status.healthy);
        assert!(status.families[&IpFamily::V4].healthy);
        assert!(!status.families[&IpFamily::V6].healthy);
        health.updated(IpFamily::V6);
        assert!(health.is_healthy());
    }

    #[test]
    fn ready_only_once_synced_and_while_healthy() {
        let (clock, health) = fixture();
        assert_eq!(health.probe(Probe::Readyz).status, 503, "nothing programmed yet");
        assert_eq!(health.probe(Probe::Livez).status, 200, "while /livez is healthy, as upstream");
        health.queued_update(IpFamily::V4);
        health.updated(IpFamily::V4);
        assert!(health.is_ready());
        assert_eq!(health.probe(Probe::Readyz).status, 200);
        health.queued_update(IpFamily::V4);
        clock.advance(Duration::from_secs(60));
        assert_eq!(health.probe(Probe::Readyz).status, 503, "a change late by the healthz timeout");
        health.set_node_eligible(false);
        health.updated(IpFamily::V4);
        assert_eq!(health.probe(Probe::Readyz).status, 200, "the Node's eligibility is /healthz's business");
    }

    #[test]
    fn node_eligibility_affects_healthz_only() {
        let (_clock, health) = fixture();
        health.set_node_eligible(false);
        assert_eq!(health.probe(Probe::Healthz).status, 503);
        assert_eq!(health.probe(Probe::Livez).status, 200);
        assert!(health.is_healthy());
    }
}
