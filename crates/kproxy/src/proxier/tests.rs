//! The sync loop's rules, with a recording dataplane.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kproxy_plan::{NodeContext, ProxyPolicy};
use kproxy_state::{Kind, Object};
use serde_json::json;

use super::*;

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Full(usize),
    Partial(usize),
    Verify(usize),
}

#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<Call>>>,
    fail_next: Arc<Mutex<bool>>,
    /// What the next `take_drift_repairs` hands over.
    drift: Arc<Mutex<Vec<String>>>,
    /// The next `verify` finds the tables too busy to read.
    busy_next: Arc<Mutex<bool>>,
    /// The delta of the last partial sync.
    last_delta: Arc<Mutex<Option<PlanDelta>>>,
}

impl Dataplane for Recorder {
    fn full_sync(&mut self, plan: &Plan) -> Result<(), kproxy_plan::DataplaneError> {
        self.record(Call::Full(ports(plan)))
    }
    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), kproxy_plan::DataplaneError> {
        *self.last_delta.lock().unwrap() = Some(delta.clone());
        self.record(Call::Partial(ports(plan)))
    }
    fn cleanup(&mut self) -> Result<(), kproxy_plan::DataplaneError> {
        Ok(())
    }
    fn verify(&mut self, plan: &Plan) -> Result<Verified, kproxy_plan::DataplaneError> {
        self.record(Call::Verify(ports(plan)))?;
        if std::mem::take(&mut *self.busy_next.lock().unwrap()) {
            return Ok(Verified::Busy);
        }
        Ok(Verified::Clean)
    }
    fn take_drift_repairs(&mut self) -> Vec<String> {
        std::mem::take(&mut *self.drift.lock().unwrap())
    }
}

/// Counts the drift repairs reported.
#[derive(Clone, Default)]
struct DriftCounter(Arc<Mutex<Vec<Vec<String>>>>);

impl SyncObserver for DriftCounter {
    fn drift_repaired(&mut self, drift: &[String]) {
        self.0.lock().unwrap().push(drift.to_vec());
    }
}

impl Recorder {
    fn record(&self, call: Call) -> Result<(), kproxy_plan::DataplaneError> {
        self.calls.lock().unwrap().push(call);
        if std::mem::take(&mut *self.fail_next.lock().unwrap()) {
            return Err("injected failure".into());
        }
        Ok(())
    }
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

fn ports(plan: &Plan) -> usize {
    plan.families.values().map(|f| f.services.len()).sum()
}

fn service(name: &str, ip: &str) -> Object {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"clusterIP": ip, "ports": [{"port": 80}]},
    }))
    .unwrap();
    Object::Service(Box::new(svc.into()))
}

fn slice(name: &str, svc: &str) -> Object {
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["198.18.16.5"]}],
        "ports": [{"port": 8080}],
    }))
    .unwrap();
    Object::EndpointSlice(Box::new(slice))
}

fn proxier(recorder: &Recorder) -> Proxier<Recorder, NoObserver> {
    let planner = Planner::new(ProxyPolicy::default(), NodeContext { name: "node-a".into(), ..Default::default() });
    let pacing =
        Pacing { min_sync_period: Duration::ZERO, sync_period: Duration::from_secs(3600), burst: DEFAULT_BURST };
    Proxier::new(planner, recorder.clone(), NoObserver, pacing)
}

#[test]
fn nothing_is_programmed_until_services_and_endpointslices_are_both_listed() {
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.apply(Change::Replaced(Kind::Service, vec![service("a", "198.18.128.1")]));
    assert!(!p.sync());
    assert!(rec.calls().is_empty(), "a partial view must never reach the dataplane");
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![slice("a-1", "a")]));
    assert!(p.sync());
    assert_eq!(rec.calls(), [Call::Full(1)]);
}

#[test]
fn later_syncs_are_partial_and_a_failure_forces_a_full_resync() {
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.apply(Change::Replaced(Kind::Service, vec![service("a", "198.18.128.1")]));
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![]));
    assert!(p.sync());
    p.apply(Change::Applied(service("b", "198.18.128.2")));
    assert!(p.sync());
    *rec.fail_next.lock().unwrap() = true;
    p.apply(Change::Applied(service("c", "198.18.128.3")));
    assert!(!p.sync());
    assert!(p.sync(), "the retry succeeds");
    assert_eq!(rec.calls(), [Call::Full(1), Call::Partial(2), Call::Partial(3), Call::Full(3)]);
}

#[test]
fn explain_answers_from_the_plan_in_the_kernel_and_not_before_a_sync_or_after_a_failed_one() {
    use kproxy_plan::explain::{Packet, Verdict};
    let packet = Packet {
        from: "203.0.113.7".parse().unwrap(),
        to: "198.18.128.1:80".parse().unwrap(),
        protocol: kproxy_state::Protocol::Tcp,
    };
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.apply(Change::Replaced(Kind::Service, vec![service("a", "198.18.128.1")]));
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![slice("a-1", "a")]));
    assert_eq!(p.explain(&packet), None, "nothing is programmed yet");
    assert!(p.sync());
    let answer = p.explain(&packet).unwrap();
    assert_eq!((answer.service.as_deref(), answer.verdict), (Some("ns/a"), Verdict::Dnat));
    *rec.fail_next.lock().unwrap() = true;
    p.apply(Change::Deleted(Kind::EndpointSlice, kproxy_state::ObjectKey::new("ns", "a-1")));
    assert!(!p.sync());
    assert_eq!(p.explain(&packet), None, "the kernel does not hold the plan that failed");
    assert!(p.sync());
    assert_eq!(p.explain(&packet).unwrap().verdict, Verdict::Reject, "the retried plan: no endpoints");
}

#[test]
fn a_sync_with_no_changes_does_not_touch_the_dataplane() {
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.apply(Change::Replaced(Kind::Service, vec![service("a", "198.18.128.1")]));
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![]));
    assert!(p.sync());
    p.apply(Change::Applied(service("a", "198.18.128.1")));
    assert!(p.sync());
    assert_eq!(rec.calls(), [Call::Full(1)]);
}

/// On tokio's paused clock, so the pacing is exact however slow the machine (e.g. under qemu).
#[tokio::test(start_paused = true)]
async fn events_in_a_burst_collapse_into_one_sync() {
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.pacing.min_sync_period = Duration::from_millis(200);
    let (tx, rx) = mpsc::channel(16);
    let task = tokio::spawn(p.run(rx));
    tx.send(Change::Replaced(Kind::Service, vec![])).await.unwrap();
    tx.send(Change::Replaced(Kind::EndpointSlice, vec![])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..10 {
        tx.send(Change::Applied(service(&format!("s{i}"), &format!("198.18.128.{}", i + 1)))).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(2), task).await.unwrap();
    assert_eq!(rec.calls(), [Call::Full(0), Call::Partial(10)]);
}

/// Upstream's bounded-frequency runner: two syncs may run back to back, then one per
/// `min_sync_period` on average.
#[tokio::test(start_paused = true)]
async fn syncs_are_paced_by_a_token_bucket_with_a_burst_of_two() {
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.pacing.min_sync_period = Duration::from_secs(1);
    p.tokens = SyncTokens::full(&p.pacing);
    p.apply(Change::Replaced(Kind::Service, vec![]));
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![]));
    let t0 = Instant::now();
    assert_eq!(p.next_sync_at(t0), t0, "the first sync runs at once");
    assert!(p.sync());
    p.apply(Change::Applied(service("a", "198.18.128.1")));
    assert_eq!(p.next_sync_at(t0), t0, "the burst allows a second sync at once");
    assert!(p.sync());
    p.apply(Change::Applied(service("b", "198.18.128.2")));
    assert_eq!(p.next_sync_at(t0), t0 + Duration::from_secs(1), "the third waits for a token");
    tokio::time::advance(Duration::from_millis(400)).await;
    assert_eq!(p.next_sync_at(Instant::now()), t0 + Duration::from_secs(1));
    tokio::time::advance(Duration::from_secs(5)).await;
    let later = Instant::now();
    assert_eq!(p.next_sync_at(later), later, "tokens refill over time");
}

#[tokio::test(start_paused = true)]
async fn a_failed_sync_is_retried_after_the_sync_period_unless_an_event_comes_first() {
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.pacing.sync_period = Duration::from_secs(30);
    p.apply(Change::Replaced(Kind::Service, vec![]));
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![]));
    *rec.fail_next.lock().unwrap() = true;
    let t0 = Instant::now();
    assert!(!p.sync());
    assert_eq!(p.next_sync_at(t0), t0 + Duration::from_secs(30), "no tight retry loop");
    p.apply(Change::Applied(service("a", "198.18.128.1")));
    assert_eq!(p.next_sync_at(t0), t0, "a new event brings the retry forward");
    assert!(p.sync());
    assert_eq!(rec.calls(), [Call::Full(0), Call::Full(1)], "the retry is a full sync");
}

/// A proxier with a 30 s sync period, both kinds listed and one Service synced (a full sync).
fn synced_with_one_service(rec: &Recorder) -> Proxier<Recorder, NoObserver> {
    let mut p = proxier(rec);
    p.pacing.sync_period = Duration::from_secs(30);
    p.apply(Change::Replaced(Kind::Service, vec![]));
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![]));
    p.apply(Change::Applied(service("a", "198.18.128.1")));
    assert!(p.sync());
    p
}

#[tokio::test(start_paused = true)]
async fn the_periodic_sync_is_a_check_and_the_plan_is_rebuilt_only_hourly() {
    let rec = Recorder::default();
    let mut p = synced_with_one_service(&rec);
    let t0 = Instant::now();
    assert_eq!(p.next_sync_at(t0), t0 + Duration::from_secs(30));
    tokio::time::advance(Duration::from_secs(30)).await;
    p.check();
    let t1 = Instant::now();
    assert_eq!(p.next_sync_at(t1), t1 + Duration::from_secs(30), "the next check is a sync period later");
    assert_eq!(rec.calls(), [Call::Full(1), Call::Verify(1)]);
    tokio::time::advance(FULL_SYNC_PERIOD).await;
    p.check();
    assert_eq!(rec.calls(), [Call::Full(1), Call::Verify(1), Call::Full(1)], "a full sync once an hour");
}

/// With the default `minSyncPeriod` of 1 s, changes arriving one per second each find a sync
/// token: none waits for the bucket, with or without periodic checks in between.
#[tokio::test(start_paused = true)]
async fn a_change_a_second_never_waits_for_the_token_bucket() {
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.pacing.min_sync_period = Duration::from_secs(1);
    p.pacing.sync_period = Duration::from_secs(30);
    p.tokens = SyncTokens::full(&p.pacing);
    p.apply(Change::Replaced(Kind::Service, vec![]));
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![]));
    assert!(p.sync());
    for i in 0..100 {
        tokio::time::advance(Duration::from_millis(1000)).await;
        if i % 30 == 29 {
            p.check();
        }
        p.apply(Change::Applied(service(&format!("s{i}"), &format!("198.18.128.{}", i + 1))));
        let now = Instant::now();
        assert_eq!(p.next_sync_at(now), now, "change {i} waits");
        assert!(p.sync());
    }
}

/// A notice of another program's commit to kproxy's tables makes the loop check the kernel at
/// once, not a sync period later; the watch starts only after the first sync.
#[tokio::test(start_paused = true)]
async fn a_noticed_commit_is_checked_within_the_gap_not_a_sync_period_later() {
    let rec = Recorder::default();
    let mut p = proxier(&rec);
    p.pacing.sync_period = Duration::from_secs(30);
    let (notify, notices) = mpsc::channel(1);
    let started = Arc::new(Mutex::new(false));
    let p = p.check_when_touched({
        let started = started.clone();
        Box::new(move || {
            *started.lock().unwrap() = true;
            notices
        })
    });
    let (events, rx) = mpsc::channel(16);
    let task = tokio::spawn(p.run(rx));
    events.send(Change::Replaced(Kind::Service, vec![])).await.unwrap();
    assert!(!*started.lock().unwrap(), "not watched before the first sync");
    events.send(Change::Replaced(Kind::EndpointSlice, vec![])).await.unwrap();
    events.send(Change::Applied(service("a", "198.18.128.1"))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rec.calls(), [Call::Full(1)]);
    assert!(*started.lock().unwrap(), "watched once the first sync built the tables");
    notify.send(()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(rec.calls(), [Call::Full(1), Call::Verify(1)], "checked at once, not 30 s later");
    // Notices in a burst right after a check: one more check, a gap after the last one.
    notify.send(()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    notify.send(()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(rec.calls().len(), 2, "no second check within the gap: {:?}", rec.calls());
    tokio::time::sleep(TOUCHED_CHECK_GAP).await;
    assert_eq!(rec.calls(), [Call::Full(1), Call::Verify(1), Call::Verify(1)], "one check for the burst");
    drop(events);
    task.await.unwrap();
}

/// After a failed periodic check the retry waits a sync period; a noticed commit to kproxy's
/// tables (another tool deleting them, say) brings it forward.
#[tokio::test(start_paused = true)]
async fn a_noticed_commit_brings_the_retry_after_a_failed_check_forward() {
    let rec = Recorder::default();
    let mut p = synced_with_one_service(&rec);
    tokio::time::advance(Duration::from_secs(30)).await;
    *rec.fail_next.lock().unwrap() = true;
    p.check();
    let t0 = Instant::now();
    assert_eq!(p.next_sync_at(t0), t0 + Duration::from_secs(30), "the failed check is retried a sync period later");
    p.check_soon = true;
    assert_eq!(p.next_sync_at(t0), t0 + TOUCHED_CHECK_GAP, "a notice brings the retry forward");
    tokio::time::advance(TOUCHED_CHECK_GAP).await;
    assert!(p.sync(), "the retry is a full sync");
    assert!(!p.check_soon, "which covers the notice");
    assert_eq!(rec.calls(), [Call::Full(1), Call::Verify(1), Call::Full(1)]);
}

/// A check that could not read the tables (another program committing in a tight loop) is
/// neither a failure nor a full resync: the check is tried again a second later, and after one
/// that reads them the checks go back to a sync period apart.
#[tokio::test(start_paused = true)]
async fn a_check_that_found_the_tables_busy_is_tried_again_a_second_later_not_failed() {
    let rec = Recorder::default();
    let mut p = synced_with_one_service(&rec);
    tokio::time::advance(Duration::from_secs(30)).await;
    *rec.busy_next.lock().unwrap() = true;
    p.check();
    let t0 = Instant::now();
    assert_eq!(p.next_sync_at(t0), t0 + BUSY_CHECK_GAP, "tried again soon");
    assert!(!p.needs_full_sync && p.retry_at.is_none(), "not a failure");
    tokio::time::advance(BUSY_CHECK_GAP).await;
    p.check();
    let t1 = Instant::now();
    assert_eq!(p.next_sync_at(t1), t1 + Duration::from_secs(30), "back to a sync period");
    assert_eq!(rec.calls(), [Call::Full(1), Call::Verify(1), Call::Verify(1)]);
}

/// Busy checks in a row wait twice as long each time, up to a sync period; one that reads the
/// tables puts the checks back a sync period apart.
#[tokio::test(start_paused = true)]
async fn busy_checks_in_a_row_back_off_to_a_sync_period() {
    let rec = Recorder::default();
    let mut p = synced_with_one_service(&rec);
    tokio::time::advance(Duration::from_secs(30)).await;
    let mut gaps = Vec::new();
    for _ in 0..7 {
        *rec.busy_next.lock().unwrap() = true;
        p.check();
        let now = Instant::now();
        let gap = p.next_sync_at(now) - now;
        gaps.push(gap.as_secs());
        tokio::time::advance(gap).await;
    }
    assert_eq!(gaps, [1, 2, 4, 8, 16, 30, 30]);
    assert!(!p.needs_full_sync && p.retry_at.is_none(), "not a failure");
    p.check();
    let now = Instant::now();
    assert_eq!(p.next_sync_at(now), now + Duration::from_secs(30), "back to a sync period");
}

#[test]
fn drift_a_full_sync_repaired_is_reported_once() {
    let rec = Recorder::default();
    let planner = Planner::new(ProxyPolicy::default(), NodeContext { name: "node-a".into(), ..Default::default() });
    let pacing =
        Pacing { min_sync_period: Duration::ZERO, sync_period: Duration::from_secs(3600), burst: DEFAULT_BURST };
    let observer = DriftCounter::default();
    let mut p = Proxier::new(planner, rec.clone(), observer.clone(), pacing);
    p.apply(Change::Replaced(Kind::Service, vec![service("a", "198.18.128.1")]));
    p.apply(Change::Replaced(Kind::EndpointSlice, vec![]));
    *rec.drift.lock().unwrap() = vec!["V4 nat chain KUBE-SVC-X: its rules were changed".to_owned()];
    assert!(p.sync());
    p.apply(Change::Applied(service("b", "198.18.128.2")));
    assert!(p.sync());
    assert_eq!(*observer.0.lock().unwrap(), [vec!["V4 nat chain KUBE-SVC-X: its rules were changed".to_owned()]]);
}

/// A pod's veth brings a link-local address; an address outside `nodePortAddresses` changes
/// nothing either: neither costs a sync. One that the CIDR selects is synced as a node-wide
/// delta, the node-port addresses alone, by a partial sync.
#[tokio::test(start_paused = true)]
async fn addresses_outside_node_port_addresses_cost_no_sync_and_one_inside_a_node_only_partial_sync() {
    use kproxy_plan::{NodePortAddress, NodePortAddresses};
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let rec = Recorder::default();
    let policy = ProxyPolicy {
        nodeport_addresses: vec![NodePortAddress::Cidr("198.18.0.0/24".parse().unwrap())],
        ..ProxyPolicy::default()
    };
    let node = NodeContext { name: "node-a".into(), local_addresses: vec![ip("198.18.0.2")], ..Default::default() };
    let pacing =
        Pacing { min_sync_period: Duration::ZERO, sync_period: Duration::from_secs(3600), burst: DEFAULT_BURST };
    let (addresses, followed) = tokio::sync::watch::channel(vec![ip("198.18.0.2")]);
    let p = Proxier::new(Planner::new(policy, node), rec.clone(), NoObserver, pacing).follow_local_addresses(followed);
    let (tx, rx) = mpsc::channel(16);
    let task = tokio::spawn(p.run(rx));
    tx.send(Change::Replaced(Kind::Service, vec![service("a", "198.18.128.1")])).await.unwrap();
    tx.send(Change::Replaced(Kind::EndpointSlice, vec![])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rec.calls(), [Call::Full(1)]);

    for more in [&["fe80::a8c1:abff:fe12:3456"][..], &["fe80::a8c1:abff:fe12:3456", "fe80::1", "192.0.2.5"]] {
        let mut now: Vec<_> = more.iter().map(|a| ip(a)).collect();
        now.push(ip("198.18.0.2"));
        addresses.send(now).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(rec.calls(), [Call::Full(1)], "addresses nodePortAddresses does not select cost nothing");

    addresses.send(vec![ip("198.18.0.2"), ip("198.18.0.4"), ip("fe80::1"), ip("192.0.2.5")]).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rec.calls(), [Call::Full(1), Call::Partial(1)], "one partial sync");
    let delta = rec.last_delta.lock().unwrap().clone().unwrap();
    let v4 = &delta.families[&IpFamily::V4];
    assert!(v4.added.is_empty() && v4.changed.is_empty() && v4.removed.is_empty(), "no service port: {v4:?}");
    assert_eq!(
        v4.node.as_ref().map(|n| &n.nodeport_addresses),
        Some(&NodePortAddresses::Only(vec![ip("198.18.0.2"), ip("198.18.0.4")]))
    );
    drop(tx);
    let p = tokio::time::timeout(Duration::from_secs(2), task).await.unwrap().unwrap();
    assert_eq!(p.plan, p.planner.build(&p.state), "the plan synced piecewise is the plan built anew");
}
