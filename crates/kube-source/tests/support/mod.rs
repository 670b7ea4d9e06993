//! Shared test helpers: objects, a source running against the fake API server, and a recorder
//! of the changes it sends.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use kproxy_kube_source::fake::FakeApiServer;
use kproxy_kube_source::{KubeSourceOptions, ListMode, RetryBackoff, SourceStats, run};
use kproxy_state::{ApplyOutcome, Change, ClusterState, Kind, ObjectKey};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub const NODE: &str = "node-a";
/// How long any single expected change may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(15);

pub fn service(ns: &str, name: &str, ip: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name},
           "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                    "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

pub fn slice(ns: &str, name: &str, service: &str, ip: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]})
}

pub fn node(name: &str, pod_cidr: &str) -> Value {
    json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
           "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
           "status": {"addresses": [{"type": "InternalIP", "address": "198.51.100.10"}]}})
}

pub fn service_cidr(name: &str, cidr: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"cidrs": [cidr]}})
}

pub fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(ns, name)
}

/// Names of the objects in a change, sorted, for compact assertions.
pub fn names(change: &Change) -> (Kind, &'static str, Vec<String>) {
    match change {
        Change::Applied(o) => (o.kind(), "applied", vec![o.key().to_string()]),
        Change::Deleted(kind, key) => (*kind, "deleted", vec![key.to_string()]),
        Change::Replaced(kind, objects) => {
            let mut names: Vec<String> = objects.iter().map(|o| o.key().to_string()).collect();
            names.sort();
            (*kind, "replaced", names)
        }
        Change::Synced(kind) => (*kind, "synced", Vec::new()),
        Change::ListStarted(kind) => (*kind, "list started", Vec::new()),
        Change::Unreadable(kind, key) => (*kind, "unreadable", vec![key.to_string()]),
        Change::ListEnded(kind) => (*kind, "list ended", Vec::new()),
    }
}

/// Whether `change` completes a listing of `kind`: a streamed listing's end, or a kind
/// counted as synced without one (no Node watched, no ServiceCIDR API).
pub fn completes_listing(change: &Change, kind: Kind) -> bool {
    *change == Change::ListEnded(kind) || *change == Change::Synced(kind)
}

/// The objects of `kind` applied before the end of its first listing, sorted; fails the test
/// when `changes` holds no end of a listing of that kind.
pub fn first_listing(changes: &[Change], kind: Kind) -> Vec<String> {
    let end = changes.iter().position(|c| completes_listing(c, kind)).unwrap_or_else(|| {
        panic!("no end of a {kind} listing in {:#?}", changes.iter().map(names).collect::<Vec<_>>())
    });
    let mut listed: Vec<String> = changes[..end]
        .iter()
        .filter_map(|c| match c {
            Change::Applied(o) if o.kind() == kind => Some(o.key().to_string()),
            _ => None,
        })
        .collect();
    listed.sort();
    listed
}

pub fn ev(kind: Kind, what: &'static str, names: &[&str]) -> (Kind, &'static str, Vec<String>) {
    (kind, what, names.iter().map(|n| (*n).to_owned()).collect())
}

/// A fake API server, a source watching it, and everything the source sent.
pub struct Harness {
    pub server: FakeApiServer,
    pub stats: Arc<SourceStats>,
    pub state: ClusterState,
    pub seen: Vec<Change>,
    /// What the state removed because a completed relist no longer named it.
    pub gone: Vec<(Kind, ObjectKey)>,
    rx: Option<mpsc::Receiver<Change>>,
    task: Option<JoinHandle<()>>,
}

impl Harness {
    /// A server with no objects and no source yet.
    pub async fn new() -> Self {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        let server = FakeApiServer::start().await.unwrap();
        Self {
            server,
            stats: Arc::new(SourceStats::new()),
            state: ClusterState::new(),
            seen: Vec::new(),
            gone: Vec::new(),
            rx: None,
            task: None,
        }
    }

    /// Starts the source (the unmodified kube-rs client against the fake API server).
    pub fn start_source(&mut self) {
        let client = kube::Client::try_from(self.server.kube_config().unwrap()).unwrap();
        self.start_source_with(client, ListMode::default());
    }

    /// Starts the source with this client and list mode.
    pub fn start_source_with(&mut self, client: kube::Client, list_mode: ListMode) {
        self.start_source_configured(client, |opts| opts.list_mode = list_mode);
    }

    /// Starts the source with this client and the test's options (retries every 100 ms),
    /// changed by `configure`.
    pub fn start_source_configured(&mut self, client: kube::Client, configure: impl FnOnce(&mut KubeSourceOptions)) {
        let mut opts = KubeSourceOptions::new(NODE);
        opts.backoff = RetryBackoff::Fixed(Duration::from_millis(100));
        configure(&mut opts);
        let (tx, rx) = mpsc::channel(64);
        self.task = Some(tokio::spawn(run(client, opts, tx, self.stats.clone())));
        self.rx = Some(rx);
    }

    /// The next change (applied to `state` and recorded); fails the test after [`PATIENCE`].
    pub async fn next(&mut self) -> Change {
        let rx = self.rx.as_mut().expect("source not started");
        let change = tokio::time::timeout(PATIENCE, rx.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no change within {PATIENCE:?}; seen so far: {:#?}",
                    self.seen.iter().map(names).collect::<Vec<_>>()
                )
            })
            .expect("source stopped");
        let outcome = self.take(change.clone());
        assert!(outcome.rejected.is_empty(), "state rejected {:?}", outcome.rejected);
        change
    }

    /// Applies a change to the state and records it, and what the state found gone.
    fn take(&mut self, change: Change) -> ApplyOutcome {
        let kind = change.kind();
        self.seen.push(change.clone());
        let outcome = self.state.apply(change);
        self.gone.extend(outcome.gone.iter().map(|key| (kind, key.clone())));
        outcome
    }

    /// Every change that arrives until none has come for `quiet`.
    pub async fn until_quiet(&mut self, quiet: Duration) -> Vec<Change> {
        let mut changes = Vec::new();
        loop {
            let rx = self.rx.as_mut().expect("source not started");
            let received = tokio::time::timeout(quiet, rx.recv()).await;
            match received {
                Ok(Some(change)) => {
                    self.take(change.clone());
                    changes.push(change);
                }
                Ok(None) => panic!("source stopped"),
                Err(_) => return changes,
            }
        }
    }

    /// The changes already sent, without waiting.
    pub fn drain_now(&mut self) -> Vec<Change> {
        let mut changes = Vec::new();
        while let Ok(change) = self.rx.as_mut().expect("source not started").try_recv() {
            self.take(change.clone());
            changes.push(change);
        }
        changes
    }

    /// Polls `done` until it holds; fails the test after [`PATIENCE`].
    pub async fn eventually(&self, what: &str, done: impl Fn(&FakeApiServer) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !done(&self.server) {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Changes until `done` holds for the state; fails the test after [`PATIENCE`].
    pub async fn until(&mut self, done: impl Fn(&ClusterState) -> bool) -> Vec<Change> {
        self.until_within(PATIENCE, done).await
    }

    /// [`Self::until`] with a deadline of the caller's: for a test whose changes are many, with
    /// a deadline derived from this machine's pace.
    pub async fn until_within(&mut self, within: Duration, done: impl Fn(&ClusterState) -> bool) -> Vec<Change> {
        let deadline = tokio::time::Instant::now() + within;
        let mut changes = Vec::new();
        while !done(&self.state) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "condition not met; changes: {:#?}",
                changes.iter().map(names).collect::<Vec<_>>()
            );
            changes.push(self.next().await);
        }
        changes
    }

    /// Changes until one for which `done` holds, that one included; fails the test when one
    /// takes longer than [`PATIENCE`].
    pub async fn until_change(&mut self, done: impl Fn(&Change) -> bool) -> Vec<Change> {
        let mut changes = Vec::new();
        loop {
            let change = self.next().await;
            let last = done(&change);
            changes.push(change);
            if last {
                return changes;
            }
        }
    }

    /// Waits until the initial sync of every kind is done.
    pub async fn synced(&mut self) -> Vec<Change> {
        self.synced_within(PATIENCE).await
    }

    /// [`Self::synced`] with a deadline of the caller's.
    pub async fn synced_within(&mut self, within: Duration) -> Vec<Change> {
        self.until_within(within, |s| Kind::ALL.iter().all(|k| s.is_synced(*k))).await
    }

    /// Waits until the server has `n` open watch streams.
    pub async fn watches_open(&self, n: usize) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while self.server.open_watches() < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "only {} watches open, want {n}",
                self.server.open_watches()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Service keys in the state, sorted.
    pub fn services(&self) -> Vec<String> {
        self.state.services().map(|s| s.key.to_string()).collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Moves the resource version past what the open watches have seen (changes to a Node nobody
/// watches), tells them with a bookmark, then compacts the history and drops the connections:
/// only a watch that kept its bookmark's version can resume without a relist.
pub async fn bookmark_then_compact_and_drop(server: &FakeApiServer) {
    for cidr in 2..6 {
        server.apply(Kind::Node, node("node-b", &format!("198.19.{cidr}.0/24")));
    }
    server.bookmark();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.compact();
    server.drop_connections().await;
}
