//! The sync loop: source events in, dataplane syncs out, paced like upstream's
//! bounded-frequency runner.
//!
//! Every change marks the state dirty and queues a sync. A sync runs no sooner than
//! `min_sync_period` after the previous one (bursts of events collapse into one sync). A full
//! sync (the plan rebuilt from the state) runs at start, after any failure, and every
//! [`FULL_SYNC_PERIOD`]; every `sync_period` in between the dataplane checks that the kernel
//! still holds the plan and repairs what differs (for nftables that costs O(1) while nobody else
//! touched the tables), so steady state costs O(change). Nothing is programmed until both
//! Services and EndpointSlices have been listed once, so a partial view never reaches the kernel.

use std::time::Duration;

use tokio::time::Instant;

use std::collections::HashMap;

use kproxy_nftables::counters::ServicePortCounts;
use kproxy_plan::explain::{Explanation, Host, Packet, explain, service_port_label};
use kproxy_plan::{Dataplane, Plan, PlanDelta, Planner, ServicePortName, Verified};
use kproxy_state::{Change, ClusterState, IpFamily, Kind};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

/// Something to do after each successful sync (health, conntrack, health-check servers).
pub trait SyncObserver: Send {
    /// An event arrived from the source (before it is applied).
    fn received(&mut self, _change: &Change) {}
    /// A sync was queued at `at`.
    fn queued(&mut self, _at: Instant) {}
    /// A sync finished.
    fn synced(&mut self, _sync: &Synced<'_>) {}
    /// A sync failed.
    fn failed(&mut self, _full: bool) {}
    /// Removing the dataplane's leftovers for `family` (nftables' stale chains) failed once.
    fn cleanup_failed(&mut self, _family: IpFamily) {}
    /// Objects were rejected or warned about.
    fn rejected(&mut self, _errors: &[kproxy_state::ObjectError]) {}
    /// The periodic check, or a full sync comparing with what is live, found kproxy's rules
    /// changed by someone else (each line says how) and repaired them.
    fn drift_repaired(&mut self, _drift: &[String]) {}
    /// Per-Service counters were read.
    fn counted(&mut self, _counts: &[ServicePortCounts]) {}
}

/// How often the plan is rebuilt from the state and fully synced, as upstream's nftables mode
/// does at most hourly; the periodic checks in between cost O(change).
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// What a successful sync did, for the observer.
#[derive(Debug)]
pub struct Synced<'a> {
    /// The state the plan was computed from.
    pub state: &'a ClusterState,
    /// The plan now in the kernel.
    pub plan: &'a Plan,
    /// What changed.
    pub delta: &'a PlanDelta,
    /// A full resync (else partial).
    pub full: bool,
    /// How long the sync took.
    pub took: Duration,
    /// `last-change-trigger-time`s of the EndpointSlice changes this sync programmed.
    pub change_triggers: Vec<(kproxy_state::IpFamily, String)>,
}

/// A no-op observer.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct NoObserver;
#[cfg(test)]
impl SyncObserver for NoObserver {}

/// Pacing of syncs: upstream's bounded-frequency runner, a token bucket refilled at one sync per
/// `min_sync_period` holding at most `burst` syncs, plus a full resync every `sync_period`.
#[derive(Debug, Clone, Copy)]
pub struct Pacing {
    /// Average minimum time between two syncs.
    pub min_sync_period: Duration,
    /// Time between full resyncs.
    pub sync_period: Duration,
    /// Syncs that may run back to back before `min_sync_period` applies (upstream: 2).
    pub burst: u32,
}

/// kube-proxy's burst of syncs.
pub const DEFAULT_BURST: u32 = 2;

/// The bounded-frequency token bucket.
#[derive(Debug, Clone, Copy)]
struct SyncTokens {
    tokens: f64,
    at: Instant,
}

impl SyncTokens {
    fn full(pacing: &Pacing) -> Self {
        Self { tokens: f64::from(pacing.burst.max(1)), at: Instant::now() }
    }

    fn refilled(self, pacing: &Pacing, now: Instant) -> Self {
        let period = pacing.min_sync_period.as_secs_f64();
        let gained =
            if period == 0.0 { f64::INFINITY } else { now.saturating_duration_since(self.at).as_secs_f64() / period };
        Self { tokens: (self.tokens + gained).min(f64::from(pacing.burst.max(1))), at: now }
    }

    /// When the next token is there.
    fn available_at(self, pacing: &Pacing, now: Instant) -> Instant {
        let current = self.refilled(pacing, now);
        if current.tokens >= 1.0 { now } else { now + pacing.min_sync_period.mul_f64(1.0 - current.tokens) }
    }
}

/// A question for the sync loop: what the plan now in the kernel does with one packet. The
/// loop owns the plan, so it answers between syncs instead of publishing a copy at every sync.
#[derive(Debug)]
pub struct ExplainRequest {
    /// The packet.
    pub packet: Packet,
    /// The answer; `None` while nothing has been synced.
    pub reply: oneshot::Sender<Option<Explanation>>,
}

/// Reads the kernel's per-Service counters for a plan (see `kproxy_nftables::counters`).
pub type CounterReader = Box<dyn FnMut(&Plan) -> Result<Vec<ServicePortCounts>, String> + Send>;

/// Changes taken from the source's channel at a time: at start (hundreds of thousands of
/// objects) one wake-up and one pass of the loop per batch instead of per object.
const EVENT_BATCH: usize = 256;

/// How often per-Service counters are read and exported.
pub const COUNTERS_PERIOD: Duration = Duration::from_secs(10);

/// The least time between two periodic checks that notices of commits to kproxy's tables ask
/// for ([`Proxier::check_when_touched`]): a tool that rewrites them in a loop meets one repair
/// per this much, not a repair war.
pub const TOUCHED_CHECK_GAP: Duration = Duration::from_millis(200);

/// When a periodic check could not read the tables because another program kept committing,
/// the next try comes this much later (not a sync period later, and not so soon that a tight
/// loop of someone else's commits keeps kproxy dumping its tables); twice as long after each
/// further busy check, up to a sync period.
pub const BUSY_CHECK_GAP: Duration = Duration::from_secs(1);

/// Starts following commits to kproxy's tables; each notice on the channel asks for a check.
pub type TouchWatcher = Box<dyn FnOnce() -> mpsc::Receiver<()> + Send>;

/// Per-Service counters: how to read them, and the last reading.
struct Counting {
    read: CounterReader,
    last: HashMap<(IpFamily, ServicePortName), ServicePortCounts>,
    next_at: Instant,
}

/// The proxier: owns the state, the plan and the dataplane.
pub struct Proxier<D, O> {
    state: ClusterState,
    planner: Planner,
    plan: Plan,
    dataplane: D,
    observer: O,
    pacing: Pacing,
    needs_full_sync: bool,
    last_full_sync: Option<Instant>,
    /// The last full sync or periodic check: the next check is due `sync_period` after it.
    last_check: Option<Instant>,
    tokens: SyncTokens,
    pending: bool,
    /// After a failed sync: when to retry if no new event comes first (upstream: syncPeriod).
    retry_at: Option<Instant>,
    /// The node's interface addresses, when followed ([`Proxier::follow_local_addresses`]).
    local_addresses: Option<tokio::sync::watch::Receiver<Vec<std::net::IpAddr>>>,
    /// Addresses that `nodePortAddresses` selects came or went: the next sync updates the
    /// node-wide settings (a delta of its own, not a replan).
    node_addresses_changed: bool,
    /// `/debug/explain` questions, when answered ([`Proxier::answer_explain`]).
    explain_requests: Option<mpsc::Receiver<ExplainRequest>>,
    /// Per-Service counters, when on ([`Proxier::count_services`]).
    counting: Option<Counting>,
    /// Starts the watch of commits to kproxy's tables, once the first sync built them.
    touch_watcher: Option<TouchWatcher>,
    /// Notices of commits that touched kproxy's tables, once watched.
    touched: Option<mpsc::Receiver<()>>,
    /// A notice came: check the kernel as soon as [`TOUCHED_CHECK_GAP`] allows.
    check_soon: bool,
    /// How long after the last check a `check_soon` check runs: [`TOUCHED_CHECK_GAP`], or
    /// [`BUSY_CHECK_GAP`] (doubling) after checks that found the tables too busy to read.
    check_gap: Duration,
}

impl<D: Dataplane, O: SyncObserver> Proxier<D, O> {
    /// A proxier that has synced nothing yet.
    pub fn new(planner: Planner, dataplane: D, observer: O, pacing: Pacing) -> Self {
        Self {
            state: ClusterState::new(),
            planner,
            plan: Plan::default(),
            dataplane,
            observer,
            pacing,
            needs_full_sync: true,
            last_full_sync: None,
            last_check: None,
            tokens: SyncTokens::full(&pacing),
            pending: false,
            retry_at: None,
            local_addresses: None,
            node_addresses_changed: false,
            explain_requests: None,
            counting: None,
            touch_watcher: None,
            touched: None,
            check_soon: false,
            check_gap: TOUCHED_CHECK_GAP,
        }
    }

    /// The dataplane and the observer (`kproxy sync-bench` reads its timers there).
    pub fn parts(&self) -> (&D, &O) {
        (&self.dataplane, &self.observer)
    }

    /// Checks the kernel (the periodic check, [`Dataplane::verify`]) soon after every commit
    /// that touched kproxy's tables, instead of waiting up to `syncPeriod` to find another
    /// program's change: `start` is called once the first sync has built the tables (so the
    /// watch does not see that sync's own flood of notifications).
    pub fn check_when_touched(mut self, start: TouchWatcher) -> Self {
        self.touch_watcher = Some(start);
        self
    }

    /// The next notice of a commit to kproxy's tables; never, when not watched or the watch
    /// stopped.
    async fn next_touch(touched: &mut Option<mpsc::Receiver<()>>) {
        let Some(rx) = touched else { return std::future::pending().await };
        if rx.recv().await.is_none() {
            *touched = None;
            std::future::pending::<()>().await;
        }
    }

    /// Reads per-Service counters with `read` every [`COUNTERS_PERIOD`] once synced, hands them
    /// to the observer and adds them to explanations.
    pub fn count_services(mut self, read: CounterReader) -> Self {
        self.counting = Some(Counting { read, last: HashMap::new(), next_at: Instant::now() });
        self
    }

    /// Waits until `due` (when counters are next read); forever when they are off.
    async fn counters_due(due: Option<Instant>) {
        match due {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// Reads the counters (after the first sync: before it, the maps are not there).
    fn count(&mut self) {
        let Some(counting) = self.counting.as_mut() else { return };
        counting.next_at = Instant::now() + COUNTERS_PERIOD;
        if self.last_full_sync.is_none() {
            return;
        }
        match (counting.read)(&self.plan) {
            Ok(counts) => {
                counting.last = counts.iter().map(|c| ((c.family, c.name.clone()), c.clone())).collect();
                self.observer.counted(&counts);
            }
            Err(e) => warn!(error = %e, "reading the per-Service counters failed"),
        }
    }

    /// Answers [`ExplainRequest`]s from the plan of the last sync.
    pub fn answer_explain(mut self, requests: mpsc::Receiver<ExplainRequest>) -> Self {
        self.explain_requests = Some(requests);
        self
    }

    /// The next question; never, when none are taken or their sender is gone.
    async fn next_explain_request(requests: &mut Option<mpsc::Receiver<ExplainRequest>>) -> ExplainRequest {
        let Some(rx) = requests else { return std::future::pending().await };
        match rx.recv().await {
            Some(request) => request,
            None => {
                *requests = None;
                std::future::pending().await
            }
        }
    }

    /// What the plan in the kernel does with `packet`; `None` before the first sync and after a
    /// failed one (the kernel then holds an older plan than this one), until a sync succeeds.
    pub fn explain(&self, packet: &Packet) -> Option<Explanation> {
        if self.last_full_sync.is_none() || self.retry_at.is_some() {
            return None;
        }
        let local_addresses = match &self.local_addresses {
            Some(rx) => rx.borrow().clone(),
            None => self.planner.node().local_addresses.clone(),
        };
        let host = Host::of_node(&self.state, &self.planner.node().name, local_addresses);
        let mut answer = explain(&self.plan, &host, packet);
        if let (Some(counting), Some(service)) = (&self.counting, &answer.service) {
            let family = IpFamily::of(&packet.to.ip());
            let counted = counting.last.iter().find(|((f, name), _)| {
                *f == family && name.protocol == packet.protocol && service_port_label(name) == *service
            });
            if let Some((_, c)) = counted {
                (answer.connections, answer.packets, answer.bytes) = (Some(c.counts), Some(c.packets), Some(c.bytes));
            }
        }
        Some(answer)
    }

    /// Follows the node's interface addresses (`crate::node_addresses`): see
    /// [`Proxier::local_addresses_changed`].
    pub fn follow_local_addresses(mut self, addresses: tokio::sync::watch::Receiver<Vec<std::net::IpAddr>>) -> Self {
        self.local_addresses = Some(addresses);
        self
    }

    /// The next change of the followed addresses; never, when they are not followed or their
    /// owner stopped.
    async fn next_local_addresses(
        addresses: &mut Option<tokio::sync::watch::Receiver<Vec<std::net::IpAddr>>>,
    ) -> Vec<std::net::IpAddr> {
        let Some(rx) = addresses else { return std::future::pending().await };
        if rx.changed().await.is_err() {
            // The owner stopped: nothing will change any more.
            *addresses = None;
            return std::future::pending().await;
        }
        rx.borrow_and_update().clone()
    }

    /// The node's addresses changed. Only those `nodePortAddresses` selects reach the plan (a
    /// pod's veth brings a link-local address at every pod start): any other change costs nothing,
    /// and one among them is synced as what it is, the node-port addresses of a family, not as a
    /// replan of every Service.
    fn local_addresses_changed(&mut self, addresses: Vec<std::net::IpAddr>) {
        if !self.planner.set_local_addresses(addresses) {
            return;
        }
        let delta = self.planner.node_addresses_delta(&self.plan);
        if delta.is_empty() {
            debug!("node addresses changed; none that nodePortAddresses selects");
            return;
        }
        for (family, fd) in &delta.families {
            if let Some(node) = &fd.node {
                info!(%family, nodeport_addresses = ?node.nodeport_addresses, "node addresses changed: syncing the node-port addresses");
            }
        }
        self.node_addresses_changed = true;
        if !self.pending {
            self.observer.queued(Instant::now());
        }
        self.pending = true;
    }

    /// Applies one source event.
    pub fn apply(&mut self, change: Change) {
        if self.ready() {
            tracing::trace!(kind = %change.kind(), "source change");
        }
        self.observer.received(&change);
        let kind = change.kind();
        let mut outcome = self.state.apply(change);
        // What a relist no longer named is a delete, counted as the source's deletes are.
        for key in std::mem::take(&mut outcome.gone) {
            self.observer.received(&Change::Deleted(kind, key));
        }
        for e in outcome.rejected.iter() {
            warn!(error = %e, "skipping invalid object");
        }
        for e in outcome.warnings.iter() {
            warn!(warning = %e, "object accepted with a warning");
        }
        if !outcome.rejected.is_empty() || !outcome.warnings.is_empty() {
            self.observer.rejected(&[outcome.rejected, outcome.warnings].concat());
        }
        if !self.pending {
            self.observer.queued(Instant::now());
        }
        self.pending = true;
    }

    /// True once Services and EndpointSlices have both been listed.
    pub fn ready(&self) -> bool {
        self.state.is_synced(Kind::Service) && self.state.is_synced(Kind::EndpointSlice)
    }

    /// Runs one sync now if one is due; returns whether it ran successfully.
    pub fn sync(&mut self) -> bool {
        if !self.ready() {
            debug!("not syncing: waiting for the initial Service and EndpointSlice listings");
            return false;
        }
        let full = self.needs_full_sync;
        let start = Instant::now();
        let dirty = self.state.take_dirty();
        // A full sync plans with the current addresses; a partial one takes their change first.
        let addresses_changed = std::mem::take(&mut self.node_addresses_changed);
        let (delta, result) = if full {
            let new = self.planner.build(&self.state);
            let delta = PlanDelta::between(&self.plan, &new);
            let result = self.dataplane.full_sync(&new);
            self.plan = new;
            (delta, result)
        } else {
            let mut delta = PlanDelta::default();
            if addresses_changed {
                delta = self.planner.node_addresses_delta(&self.plan);
                self.plan.apply(&delta);
            }
            merge(&mut delta, self.planner.update(&mut self.plan, &self.state, &dirty));
            let result = if delta.is_empty() { Ok(()) } else { self.dataplane.partial_sync(&self.plan, &delta) };
            (delta, result)
        };
        self.report_cleanup_failures();
        let drift = self.dataplane.take_drift_repairs();
        if !drift.is_empty() {
            warn!(?drift, full, "a sync found kproxy's rules changed by someone else and repaired them");
            self.observer.drift_repaired(&drift);
        }
        let mut tokens = self.tokens.refilled(&self.pacing, start);
        tokens.tokens -= 1.0;
        self.tokens = tokens;
        self.pending = false;
        match result {
            Ok(()) => {
                let took = start.elapsed();
                self.retry_at = None;
                if full {
                    self.needs_full_sync = false;
                    self.last_full_sync = Some(start);
                    self.last_check = Some(start);
                    // A full sync rewrote whatever a noticed commit changed.
                    self.check_soon = false;
                    info!(took_ms = took.as_millis() as u64, "full sync done");
                } else {
                    debug!(took_us = took.as_micros() as u64, "partial sync done");
                }
                let change_triggers = self.state.take_change_triggers();
                let synced =
                    Synced { state: &self.state, plan: &self.plan, delta: &delta, full, took, change_triggers };
                self.observer.synced(&synced);
                true
            }
            Err(e) => {
                warn!(error = %e, full, "sync failed; the next sync is a full resync");
                self.needs_full_sync = true;
                // Retry after syncPeriod, as upstream, not in a tight loop; a new event still
                // brings the (full) sync forward.
                self.retry_at = Some(start + self.pacing.sync_period);
                self.observer.failed(full);
                false
            }
        }
    }

    fn report_cleanup_failures(&mut self) {
        for family in self.dataplane.take_cleanup_failures() {
            self.observer.cleanup_failed(family);
        }
    }

    /// The periodic check: the dataplane makes sure the kernel still holds the plan of the last
    /// sync, repairing what differs; a full sync instead when one is due.
    fn check(&mut self) {
        let start = Instant::now();
        if self.last_full_sync.is_none_or(|t| start.saturating_duration_since(t) >= FULL_SYNC_PERIOD) {
            self.needs_full_sync = true;
            self.sync();
            return;
        }
        self.last_check = Some(start);
        self.check_soon = false;
        let previous_gap = std::mem::replace(&mut self.check_gap, TOUCHED_CHECK_GAP);
        let was_busy = previous_gap >= BUSY_CHECK_GAP;
        match self.dataplane.verify(&self.plan) {
            Ok(Verified::Clean) => debug!(took_us = start.elapsed().as_micros() as u64, "periodic check: rules intact"),
            Ok(Verified::Repaired(drift)) => {
                warn!(?drift, took_ms = start.elapsed().as_millis() as u64, "periodic check repaired kproxy's rules");
                self.observer.drift_repaired(&drift);
            }
            Ok(Verified::Rewritten) => {
                let took = start.elapsed();
                self.last_full_sync = Some(start);
                info!(took_ms = took.as_millis() as u64, "full sync done");
                let delta = PlanDelta::default();
                let synced = Synced {
                    state: &self.state,
                    plan: &self.plan,
                    delta: &delta,
                    full: true,
                    took,
                    change_triggers: Vec::new(),
                };
                self.observer.synced(&synced);
            }
            Ok(Verified::Busy) => {
                if !was_busy {
                    info!(
                        retry_in_ms = BUSY_CHECK_GAP.as_millis() as u64,
                        "periodic check: another program kept committing while kproxy's tables were read; checking again"
                    );
                }
                self.check_soon = true;
                // Twice as long after each busy check in a row, up to a sync period: a program
                // that never stops committing costs kproxy a few listings per period, not one
                // every second.
                self.check_gap = if was_busy {
                    (previous_gap * 2).min(self.pacing.sync_period).max(BUSY_CHECK_GAP)
                } else {
                    BUSY_CHECK_GAP
                };
            }
            Err(e) => {
                warn!(error = %e, "periodic check failed; the next sync is a full resync");
                self.needs_full_sync = true;
                self.retry_at = Some(start + self.pacing.sync_period);
                self.observer.failed(true);
            }
        }
    }

    /// When the next sync should run, if any is due.
    fn next_sync_at(&self, now: Instant) -> Instant {
        let earliest = self.tokens.available_at(&self.pacing, now);
        let full_due = self.last_check.map_or(now, |t| t + self.pacing.sync_period);
        // A noticed commit to kproxy's tables: checked (or, after a failure, resynced) soon.
        let touched = self.check_soon.then(|| self.last_check.map_or(now, |t| t + self.check_gap).max(now));
        match (self.pending, self.retry_at) {
            (true, _) => earliest,
            (false, Some(retry)) => touched.map_or(retry, |t| t.min(retry)).max(earliest),
            (false, None) if self.needs_full_sync => earliest,
            (false, None) => touched.unwrap_or(full_due.max(earliest)),
        }
    }

    /// Runs until the event channel closes.
    pub async fn run(mut self, mut events: mpsc::Receiver<Change>) -> Self {
        let mut received = Vec::with_capacity(EVENT_BATCH);
        loop {
            if self.last_full_sync.is_some()
                && let Some(start) = self.touch_watcher.take()
            {
                self.touched = Some(start());
            }
            let now = Instant::now();
            let at = self.next_sync_at(now);
            let wait = at.saturating_duration_since(now);
            tokio::select! {
                // Drain queued events before syncing, so a burst of them makes one sync.
                biased;
                count = events.recv_many(&mut received, EVENT_BATCH) => {
                    if count == 0 {
                        return self;
                    }
                    for change in received.drain(..) {
                        self.apply(change);
                    }
                },
                _ = Self::counters_due(self.counting.as_ref().map(|c| c.next_at)) => self.count(),
                () = Self::next_touch(&mut self.touched) => self.check_soon = true,
                addresses = Self::next_local_addresses(&mut self.local_addresses) => self.local_addresses_changed(addresses),
                _ = tokio::time::sleep(wait) => {
                    if !self.pending && !self.needs_full_sync && self.retry_at.is_none() && self.ready() {
                        self.check();
                        continue;
                    }
                    if !self.sync() && !self.ready() {
                        // Nothing to do until the listings arrive: wait for events only.
                        match events.recv().await {
                            Some(change) => self.apply(change),
                            None => return self,
                        }
                    }
                }
                // Last: a sync that is due runs before any question waiting here.
                request = Self::next_explain_request(&mut self.explain_requests) => {
                    let _ = request.reply.send(self.explain(&request.packet));
                },
            }
        }
    }
}

/// Adds `more`, computed after `into` was applied, to `into`: a later node-wide setting wins.
fn merge(into: &mut PlanDelta, more: PlanDelta) {
    for (family, fd) in more.families {
        let to = into.families.entry(family).or_default();
        if fd.node.is_some() {
            to.node = fd.node;
        }
        to.added.extend(fd.added);
        to.changed.extend(fd.changed);
        to.removed.extend(fd.removed);
    }
}

#[cfg(test)]
mod tests;
