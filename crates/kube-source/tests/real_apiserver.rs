//! The source against the real kube-apiserver v1.36.2 (`kproxy-k8s-harness`): its start, live
//! events, the relist after `410 Gone`, an API server restart and an RBAC denial, on etcd 3.6,
//! on etcd 3.5.1 (which fails streaming lists with an ERROR event) and with the WatchList
//! feature off; and the fake API server's answers checked against the real server's.
//!
//! `410 Gone` on demand: the API server is stopped, the Service is deleted from etcd directly
//! (etcd's JSON gateway) and etcd compacted at that revision; the restarted API server's watch
//! cache starts at the new revision, so the source's watch, resumed from its older version, is
//! answered "too old resource version" (`410`) and the source relists, finding the Service gone.
//!
//! Without the binaries these tests skip visibly, and fail under `CI=true`
//! ([`kproxy_k8s_harness::require_k8s`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use kproxy_k8s_harness::{ControlPlane, ControlPlaneOptions, Etcd, Identity, require_k8s};
use kproxy_kube_source::fake::{FakeApiServer, StreamingLists};
use kproxy_kube_source::{ContentTypes, KubeSourceOptions, SourceStats};
use kproxy_state::{Change, ClusterState, Kind, ObjectKey};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// How long any single expected change may take.
const PATIENCE: Duration = Duration::from_secs(30);
const NS: &str = "kp";

fn start(options: ControlPlaneOptions) -> Option<ControlPlane> {
    let binaries = require_k8s()?;
    let plane = ControlPlane::start(&binaries, options).expect("control plane starts");
    eprintln!("control plane ready in {:?}", plane.started_in());
    Some(plane)
}

fn apply(plane: &ControlPlane, object: &Value) {
    plane.kubectl_with_stdin(&["apply", "-f", "-"], Some(&object.to_string())).expect("kubectl apply");
}

fn service(name: &str, port: u16) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
           "spec": {"type": "ClusterIP", "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}})
}

fn slice(name: &str, service: &str, ip: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": name, "namespace": NS,
                        "labels": {"kubernetes.io/service-name": service,
                                   "endpointslice.kubernetes.io/managed-by": "kproxy-tests"}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
           "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]})
}

/// The namespace, Services `a` and `b`, and a slice for each.
fn seed(plane: &ControlPlane) {
    apply(plane, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    apply(plane, &service("a", 80));
    apply(plane, &service("b", 81));
    apply(plane, &slice("a-1", "a", "198.18.1.1"));
    apply(plane, &slice("b-1", "b", "198.18.1.2"));
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new(NS, name)
}

/// The source running against a real API server (its own runtime), and what it sent.
struct Source {
    rt: tokio::runtime::Runtime,
    rx: mpsc::Receiver<Change>,
    stats: Arc<SourceStats>,
    state: ClusterState,
    /// What the state found gone after a relist.
    gone: Vec<(Kind, ObjectKey)>,
    deleted: Vec<(Kind, ObjectKey)>,
    task: tokio::task::JoinHandle<()>,
}

impl Source {
    /// Starts the source as kproxy does: a client from the kubeconfig (kube-proxy's default
    /// qps/burst), production retries and list mode, asking for `content_types`.
    fn start(kubeconfig: &Path, content_types: &ContentTypes) -> Source {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let stats = Arc::new(SourceStats::new());
        let (tx, rx) = mpsc::channel(256);
        let client = rt.block_on(kproxy_kube_source::client(Some(kubeconfig), 0.0, 0)).unwrap();
        let mut options = KubeSourceOptions::new("node-a");
        options.content_types = content_types.clone();
        let task = rt.spawn(kproxy_kube_source::run(client, options, tx, stats.clone()));
        Source { rt, rx, stats, state: ClusterState::new(), gone: Vec::new(), deleted: Vec::new(), task }
    }

    /// Changes until `done` holds; fails the test after [`PATIENCE`].
    fn until(&mut self, what: &str, done: impl Fn(&ClusterState) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done(&self.state) {
            let left = deadline.saturating_duration_since(Instant::now());
            let rx = &mut self.rx;
            let change = self.rt.block_on(async { tokio::time::timeout(left, rx.recv()).await });
            let change = change.unwrap_or_else(|_| panic!("timed out waiting for {what}")).expect("source stopped");
            self.take(change);
        }
    }

    /// Every change that arrives until none has come for `quiet`.
    fn until_quiet(&mut self, quiet: Duration) {
        loop {
            let rx = &mut self.rx;
            let Ok(Some(change)) = self.rt.block_on(async { tokio::time::timeout(quiet, rx.recv()).await }) else {
                return;
            };
            self.take(change);
        }
    }

    fn take(&mut self, change: Change) {
        let kind = change.kind();
        if let Change::Deleted(kind, key) = &change {
            self.deleted.push((*kind, key.clone()));
        }
        let outcome = self.state.apply(change);
        assert!(outcome.rejected.is_empty(), "state rejected {:?}", outcome.rejected);
        self.gone.extend(outcome.gone.into_iter().map(|key| (kind, key)));
    }

    fn synced(&mut self) {
        self.until("every kind listed", |s| Kind::ALL.iter().all(|k| s.is_synced(*k)));
    }

    fn services(&self) -> BTreeSet<String> {
        self.state.services().filter(|s| s.key.namespace.as_ref() == NS).map(|s| s.key.name.to_string()).collect()
    }
}

impl Drop for Source {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// POSTs `body` to etcd's JSON gateway; the answer.
fn etcd(plane: &ControlPlane, path: &str, body: &Value) -> Value {
    let url = format!("{}{path}", plane.etcd_url());
    let mut response = ureq::post(&url).header("content-type", "application/json").send(&body.to_string()).unwrap();
    serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap()
}

/// Moves etcd's revision on (a key of kproxy's tests, outside what kube-apiserver stores) and
/// compacts etcd there.
fn bump_and_compact_etcd(plane: &ControlPlane) {
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let put = etcd(plane, "/v3/kv/put", &json!({"key": b64("/kproxy-tests/bump"), "value": b64("1")}));
    let revision = put["header"]["revision"].as_str().unwrap().to_owned();
    let compacted = etcd(plane, "/v3/kv/compaction", &json!({"revision": revision, "physical": true}));
    assert!(compacted.get("header").is_some(), "{compacted}");
}

/// Deletes the Service `name` in etcd behind the stopped API server's back and compacts etcd
/// at that revision.
fn delete_in_etcd_and_compact(plane: &ControlPlane, name: &str) {
    let key = base64::engine::general_purpose::STANDARD.encode(format!("/registry/services/specs/{NS}/{name}"));
    let deleted = etcd(plane, "/v3/kv/deleterange", &json!({"key": key}));
    assert_eq!(deleted["deleted"], "1", "{deleted}");
    let revision = deleted["header"]["revision"].as_str().unwrap().to_owned();
    let compacted = etcd(plane, "/v3/kv/compaction", &json!({"revision": revision, "physical": true}));
    assert!(compacted.get("header").is_some(), "{compacted}");
}

/// What every server configuration must do to the source: start (streaming, or through the
/// fallback: `fallbacks` per kind), follow changes, relist after `410 Gone`, come through an
/// API server restart; and an identity without RBAC is denied until it is granted.
/// The source's whole life against the real server, asking for `content_types` (the server's
/// answers in that encoding: every list, watch, streaming list, bookmark, `410` and `Status`).
fn the_source_follows_the_real_api_server(mut plane: ControlPlane, fallbacks: u64, content_types: &ContentTypes) {
    seed(&plane);
    let began = Instant::now();
    let mut source = Source::start(&plane.kubeconfig(&Identity::kube_proxy()).unwrap(), content_types);

    // Start.
    source.synced();
    eprintln!("synced in {:?}", began.elapsed());
    assert_eq!(source.services(), names(&["a", "b"]));
    assert_eq!(source.state.slices_of(&key("a")).count(), 1);
    assert!(source.state.service(&ObjectKey::new("default", "kubernetes")).is_some());
    assert_eq!(source.state.service_cidrs().count(), 1, "the default ServiceCIDR");
    for kind in Kind::ALL {
        assert_eq!(source.stats.streaming_fallbacks(kind), fallbacks, "{kind}");
        assert_eq!(source.stats.lists(kind), 1, "{kind}");
        assert_eq!(source.stats.malformed_objects(kind), 0, "{kind}");
    }

    let phase = |what: &str| eprintln!("{what} done at {:?}", began.elapsed());
    // Live events.
    apply(&plane, &service("c", 82));
    plane.kubectl(&["-n", NS, "delete", "endpointslice", "b-1"]).unwrap();
    plane
        .kubectl(&[
            "-n",
            NS,
            "patch",
            "service",
            "a",
            "--type=merge",
            "-p",
            r#"{"spec":{"ports":[{"name":"http","port":90,"protocol":"TCP"}]}}"#,
        ])
        .unwrap();
    source.until("c, b-1 gone, a's new port", |s| {
        s.service(&key("c")).is_some()
            && s.slices_of(&key("b")).count() == 0
            && s.service(&key("a")).is_some_and(|a| a.ports.iter().any(|p| p.port == 90))
    });
    assert_eq!(source.stats.lists(Kind::Service), 1, "events, no relist");
    assert!(source.gone.is_empty());
    assert_eq!(source.deleted, [(Kind::EndpointSlice, key("b-1"))]);
    source.deleted.clear();

    phase("live events");
    // 410 Gone: the API server down, `b` deleted in etcd and etcd compacted; the restarted
    // server answers the resumed watch "too old resource version", and the relist finds `b` gone.
    plane.stop_apiserver();
    phase("stop");
    delete_in_etcd_and_compact(&plane, "b");
    plane.start_apiserver().unwrap();
    phase("start");
    source.until("b gone", |s| s.service(&key("b")).is_none());
    phase("b gone");
    source.until_quiet(Duration::from_secs(2));
    assert_eq!(source.gone, [(Kind::Service, key("b"))], "found by the relist");
    assert!(source.deleted.is_empty(), "no watch event deleted anything: {:?}", source.deleted);
    assert!(source.stats.lists(Kind::Service) >= 2, "a relist");
    assert_eq!(source.services(), names(&["a", "c"]));

    phase("410 relist");
    // A restart with nothing changed: nothing is lost, and changes flow again.
    plane.restart_apiserver().unwrap();
    phase("restarted");
    apply(&plane, &service("d", 83));
    source.until("d", |s| s.service(&key("d")).is_some());
    source.until_quiet(Duration::from_secs(1));
    assert_eq!(source.services(), names(&["a", "c", "d"]));
    assert_eq!(source.gone, [(Kind::Service, key("b"))], "nothing else gone");
    assert!(source.deleted.is_empty());
    for kind in Kind::ALL {
        assert_eq!(source.stats.streaming_fallbacks(kind), fallbacks, "{kind}: no more fallbacks");
    }
    drop(source);
    phase("restart");

    // RBAC: an identity without a role is denied every kind, and starts once it is granted.
    let mut denied = Source::start(&plane.kubeconfig(&Identity::unprivileged("mallory")).unwrap(), content_types);
    let deadline = Instant::now() + PATIENCE;
    while Kind::ALL.iter().any(|kind| denied.stats.watch_errors(*kind) < 2) {
        assert!(Instant::now() < deadline, "no denial seen");
        denied.until_quiet(Duration::from_millis(200));
    }
    assert!(!Kind::ALL.iter().any(|kind| denied.state.is_synced(*kind)), "nothing listed");
    assert_eq!(denied.services(), BTreeSet::new());
    plane
        .kubectl(&["create", "clusterrolebinding", "kp-mallory", "--clusterrole=system:node-proxier", "--user=mallory"])
        .unwrap();
    denied.synced();
    assert_eq!(denied.services(), names(&["a", "c", "d"]));
    phase("RBAC");
}

/// A streaming list of Services to the real server and to a fake answering `answer`: the same
/// status, the same shape, the same `Status` (inside an ERROR event or as the body).
fn a_failed_streaming_list_looks_the_same(plane: &ControlPlane, answer: StreamingLists) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let fake = rt.block_on(FakeApiServer::start()).unwrap();
    fake.set_streaming_lists(answer);
    let path = "/api/v1/services?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2";
    let (r, f) = (real(plane, path), fake_get(&fake, path));
    let status =
        |answer: &Answer| if answer.status == 200 { answer.body[0]["object"].clone() } else { answer.body.clone() };
    compare(&format!("{answer:?}"), &r, &f);
    assert_eq!(status_fields(&status(&r)), status_fields(&status(&f)), "{answer:?}");
}

#[test]
fn etcd_3_6_the_source_starts_streaming_follows_relists_after_gone_and_survives_a_restart_and_rbac() {
    let Some(plane) = start(ControlPlaneOptions::default()) else { return };
    the_source_follows_the_real_api_server(plane, 0, &ContentTypes::protobuf());
}

#[test]
fn etcd_3_6_in_json_the_source_starts_streaming_follows_relists_after_gone_and_survives_a_restart_and_rbac() {
    let Some(plane) = start(ControlPlaneOptions::default()) else { return };
    the_source_follows_the_real_api_server(plane, 0, &ContentTypes::json());
}

#[test]
fn etcd_3_5_1_the_source_starts_through_the_fallback_follows_relists_after_gone_and_survives_a_restart_and_rbac() {
    let Some(plane) = start(ControlPlaneOptions { etcd: Etcd::V3_5_1, ..Default::default() }) else { return };
    a_failed_streaming_list_looks_the_same(&plane, StreamingLists::ErrorEvent(500));
    the_source_follows_the_real_api_server(plane, 1, &ContentTypes::protobuf());
}

#[test]
fn watchlist_off_in_json_the_source_starts_through_the_fallback_follows_relists_after_gone_and_survives_a_restart_and_rbac()
 {
    let Some(plane) = start(ControlPlaneOptions { watch_list: false, ..Default::default() }) else { return };
    a_failed_streaming_list_looks_the_same(&plane, StreamingLists::WatchListOff);
    the_source_follows_the_real_api_server(plane, 1, &ContentTypes::json());
}

#[test]
fn etcd_3_5_1_watchlist_off_the_source_starts_through_the_fallback_follows_relists_after_gone_and_survives_a_restart_and_rbac()
 {
    let options = ControlPlaneOptions { etcd: Etcd::V3_5_1, watch_list: false, ..Default::default() };
    let Some(plane) = start(options) else { return };
    a_failed_streaming_list_looks_the_same(&plane, StreamingLists::WatchListOff);
    the_source_follows_the_real_api_server(plane, 1, &ContentTypes::protobuf());
}

/// A response as a shape: every value replaced by its JSON type, objects by their keys' shapes,
/// arrays by the distinct shapes of their items (in order). What must be equal besides (codes,
/// reasons, event types) is compared apart.
fn shape(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        Value::Array(items) => {
            let mut shapes: Vec<Value> = Vec::new();
            for item in items.iter().map(shape) {
                if !shapes.contains(&item) {
                    shapes.push(item);
                }
            }
            Value::Array(shapes)
        }
        Value::String(_) => json!("string"),
        Value::Number(_) => json!("number"),
        Value::Bool(_) => json!("bool"),
        Value::Null => Value::Null,
    }
}

/// An HTTP answer: its status and body, as JSON (a watch's body as its events).
#[derive(Debug)]
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    fn of(status: u16, body: &str, watch: bool) -> Answer {
        let body = if watch && status == 200 {
            Value::Array(
                body.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect(),
            )
        } else {
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
        };
        Answer { status, body }
    }

    fn event_types(&self) -> Vec<&str> {
        self.body.as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect()
    }
}

fn real(plane: &ControlPlane, path: &str) -> Answer {
    let response = plane.get(Some(&Identity::admin()), path).unwrap();
    Answer::of(response.status, &response.body, path.contains("watch=1"))
}

fn fake_get(fake: &FakeApiServer, path: &str) -> Answer {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut response = agent.get(format!("{}{path}", fake.url())).call().unwrap();
    let status = response.status().as_u16();
    Answer::of(status, &response.body_mut().read_to_string().unwrap(), path.contains("watch=1"))
}

/// The same request to both; their status and shape must agree.
fn compare(what: &str, real: &Answer, fake: &Answer) {
    assert_eq!(real.status, fake.status, "{what}: status\nreal: {real:?}\nfake: {fake:?}");
    assert_eq!(shape(&real.body), shape(&fake.body), "{what}: shape\nreal: {:#}\nfake: {:#}", real.body, fake.body);
}

/// The fields of a `Status` that must be equal, not just alike.
fn status_fields(status: &Value) -> Value {
    json!([status["kind"], status["apiVersion"], status["status"], status["reason"], status["code"]])
}

const SERVICES: &str = "/api/v1/namespaces/kp/services";

#[test]
fn the_fake_api_server_answers_lists_streaming_lists_watches_and_410_like_kube_apiserver() {
    let Some(mut plane) = start(ControlPlaneOptions::default()) else { return };
    seed(&plane);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let fake = rt.block_on(FakeApiServer::start()).unwrap();
    // The fake serves the real server's Services, as the real server lists them.
    let listed = real(&plane, SERVICES);
    for item in listed.body["items"].as_array().unwrap() {
        fake.apply(Kind::Service, item.clone());
    }

    // A list.
    let (r, f) = (real(&plane, SERVICES), fake_get(&fake, SERVICES));
    compare("list", &r, &f);
    assert_eq!((&r.body["kind"], &r.body["apiVersion"]), (&f.body["kind"], &f.body["apiVersion"]));
    assert_eq!(r.body["items"].as_array().map(Vec::len), Some(2));

    // A paginated list: the first page, then the rest from its continue token.
    let page = format!("{SERVICES}?limit=1");
    let (r, f) = (real(&plane, &page), fake_get(&fake, &page));
    compare("first page", &r, &f);
    let next = |answer: &Answer| format!("{page}&continue={}", answer.body["metadata"]["continue"].as_str().unwrap());
    let (r2, f2) = (real(&plane, &next(&r)), fake_get(&fake, &next(&f)));
    compare("last page", &r2, &f2);
    assert_eq!(
        r2.body["metadata"]["resourceVersion"], r.body["metadata"]["resourceVersion"],
        "a page at the first's version"
    );
    assert_eq!(f2.body["metadata"]["resourceVersion"], f.body["metadata"]["resourceVersion"]);

    // A streaming list: every object ADDED, then the bookmark ending the initial events.
    let streaming = format!(
        "{SERVICES}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2"
    );
    let (r, f) = (real(&plane, &streaming), fake_get(&fake, &streaming));
    compare("streaming list", &r, &f);
    assert_eq!(r.event_types(), ["ADDED", "ADDED", "BOOKMARK"], "{:#}", r.body);
    assert_eq!(f.event_types(), r.event_types());
    let end =
        |answer: &Answer| answer.body[2]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"].clone();
    assert_eq!((end(&r), end(&f)), (json!("true"), json!("true")));

    // A watch with bookmarks, of every kind, as kproxy watches them. kube-apiserver sends one
    // 2 s before the watch's timeout when its cache has moved past the watch's version (here: an
    // object of the kind that the watch does not select); the fake sends one when told.
    let rv = real(&plane, SERVICES).body["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    let watches = [
        (Kind::Service, format!("{SERVICES}?watch=1")),
        (Kind::EndpointSlice, "/apis/discovery.k8s.io/v1/namespaces/kp/endpointslices?watch=1".to_owned()),
        (Kind::Node, "/api/v1/nodes?watch=1&fieldSelector=metadata.name%3Dnode-a".to_owned()),
        (
            Kind::ServiceCidr,
            "/apis/networking.k8s.io/v1/servicecidrs?watch=1&fieldSelector=metadata.name%3Dkubernetes".to_owned(),
        ),
    ];
    let with = |path: &str, rv: &str| format!("{path}&allowWatchBookmarks=true&resourceVersion={rv}&timeoutSeconds=5");
    let unseen = [
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "elsewhere", "namespace": "default"},
               "spec": {"ports": [{"port": 80}]}}),
        {
            let mut slice = slice("elsewhere", "elsewhere", "198.18.1.9");
            slice["metadata"]["namespace"] = json!("default");
            slice
        },
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b"}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR", "metadata": {"name": "extra"},
               "spec": {"cidrs": ["198.18.200.0/24"]}}),
    ];
    let fake_rv = fake.resource_version().to_string();
    let (reals, fakes) = std::thread::scope(|scope| {
        let reals: Vec<_> = watches.iter().map(|(_, path)| scope.spawn(|| real(&plane, &with(path, &rv)))).collect();
        let fakes: Vec<_> =
            watches.iter().map(|(_, path)| scope.spawn(|| fake_get(&fake, &with(path, &fake_rv)))).collect();
        std::thread::sleep(Duration::from_millis(500));
        // One kubectl call: each kind's cache must move before its watch's bookmark time (3 s in).
        apply(&plane, &json!({"apiVersion": "v1", "kind": "List", "items": unseen}));
        fake.bookmark();
        let join = |handles: Vec<std::thread::ScopedJoinHandle<'_, Answer>>| -> Vec<Answer> {
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        };
        (join(reals), join(fakes))
    });
    for ((kind, _), (r, f)) in watches.iter().zip(reals.iter().zip(&fakes)) {
        let what = format!("{kind} watch with bookmarks");
        assert!(
            !r.event_types().is_empty() && r.event_types().iter().all(|t| *t == "BOOKMARK"),
            "{what}: {:#}",
            r.body
        );
        assert_eq!(f.event_types(), ["BOOKMARK"], "{what}: {:#}", f.body);
        compare(&what, &Answer { status: r.status, body: json!([r.body[0]]) }, f);
    }

    // 410: a watch from a version older than the server's history. kube-apiserver v1.36 answers
    // a watch from long ago with the current objects while its watch cache still holds all it
    // has seen (measured: `resourceVersion=1` gave two ADDED events); a watch from before the
    // start of a restarted server's cache, with etcd moved on and compacted meanwhile, is `410`.
    let old = real(&plane, SERVICES).body["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    plane.stop_apiserver();
    bump_and_compact_etcd(&plane);
    plane.start_apiserver().unwrap();
    let fake_old = fake.resource_version();
    fake.apply(Kind::Service, listed.body["items"][0].clone());
    fake.compact();
    let gone = |rv: &str| format!("{SERVICES}?watch=1&resourceVersion={rv}&timeoutSeconds=2");
    let (r, f) = (real(&plane, &gone(&old)), fake_get(&fake, &gone(&fake_old.to_string())));
    compare("410", &r, &f);
    assert_eq!(r.event_types(), ["ERROR"], "{:#}", r.body);
    assert_eq!(status_fields(&r.body[0]["object"]), status_fields(&f.body[0]["object"]));
    assert_eq!(r.body[0]["object"]["code"], 410);
}

/// A GET through a kube-rs client with this Accept header: the status, `Content-Type` and body.
fn get_raw(rt: &tokio::runtime::Runtime, client: &kube::Client, path: &str, accept: &str) -> (u16, String, Vec<u8>) {
    use http_body_util::BodyExt as _;
    let request =
        http::Request::get(path).header(http::header::ACCEPT, accept).body(kube::client::Body::empty()).unwrap();
    rt.block_on(async {
        let response = client.send(request).await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default();
        (status, content_type, response.into_body().collect().await.unwrap().to_bytes().to_vec())
    })
}

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// What the state makes of an object, and the metadata it reads: equal for the two encodings.
fn record(object: &kproxy_state::Object) -> String {
    use kproxy_state::{NodeInfo, Object, ServiceInfo, SliceInfo};
    let meta = object.meta();
    let read = [kproxy_state::TRAFFIC_HINT_ANNOTATION, kproxy_state::LAST_CHANGE_TRIGGER_TIME_ANNOTATION];
    let annotations: Vec<_> = meta.annotations.iter().flatten().filter(|(k, _)| read.contains(&k.as_str())).collect();
    let info = match object {
        Object::Service(s) => format!("{:?}", ServiceInfo::from_object(s)),
        Object::EndpointSlice(s) => format!("{:?}", SliceInfo::from_object(s)),
        Object::Node(n) => {
            format!("{:?} unschedulable={:?}", NodeInfo::from_object(n), n.spec.as_ref().and_then(|s| s.unschedulable))
        }
        Object::ServiceCidr(c) => format!("{:?}", c.spec.as_ref().and_then(|s| s.cidrs.clone())),
    };
    format!(
        "{} rv={:?} labels={:?} annotations={annotations:?} deleting={:?} {info}",
        object.key(),
        meta.resource_version,
        meta.labels,
        meta.deletion_timestamp
    )
}

/// Every kind, read from kube-apiserver v1.36.2 as JSON and as protobuf: the field numbers of
/// `protobuf/messages.rs` are checked here, against the real encoder.
#[test]
fn every_kind_reads_the_same_from_kube_apiserver_in_protobuf_and_in_json() {
    let Some(mut plane) = start(ControlPlaneOptions::default()) else { return };
    seed(&plane);
    // What the seed lacks of what kproxy reads: a LoadBalancer Service with node ports, every
    // spec field kproxy reads, its status; a slice with every endpoint field; a Node.
    apply(
        &plane,
        &json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "lb", "namespace": NS, "labels": {"app": "lb"},
                     "annotations": {"service.kproxy.io/traffic-hint": "LongLived", "unread": "x"}},
        "spec": {"type": "LoadBalancer", "ipFamilyPolicy": "PreferDualStack",
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                           {"name": "dns", "port": 53, "protocol": "UDP"}],
                 "externalIPs": ["203.0.113.7"], "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local",
                 "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                 "loadBalancerSourceRanges": ["192.0.2.0/24"]}}),
    );
    plane
        .kubectl(&[
            "-n",
            NS,
            "patch",
            "service",
            "lb",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"loadBalancer":{"ingress":[{"ip":"198.51.100.1"},{"ip":"198.51.100.2","ipMode":"Proxy"}]}}}"#,
        ])
        .unwrap();
    apply(
        &plane,
        &json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "lb-1", "namespace": NS,
                     "labels": {"kubernetes.io/service-name": "lb", "endpointslice.kubernetes.io/managed-by": "kproxy-tests"},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-06T05:00:00Z"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}],
        "endpoints": [{"addresses": ["198.18.2.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
                       "nodeName": "node-a", "zone": "z1", "hints": {"forZones": [{"name": "z1"}]}},
                      {"addresses": ["198.18.2.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                      {"addresses": ["198.18.2.3"]}]}),
    );
    apply(
        &plane,
        &json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "z1"}},
        "spec": {"podCIDR": "198.19.0.0/24", "podCIDRs": ["198.19.0.0/24"], "unschedulable": true,
                 "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}}),
    );
    plane
        .kubectl(&["patch", "node", "node-a", "--subresource=status", "--type=merge", "-p",
            r#"{"status":{"addresses":[{"type":"InternalIP","address":"198.51.100.9"},{"type":"Hostname","address":"node-a"}]}}"#])
        .unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let client = rt.block_on(kproxy_kube_source::client(Some(plane.admin_kubeconfig()), -1.0, 0)).unwrap();
    let kinds = [
        (Kind::Service, "/api/v1/services"),
        (Kind::EndpointSlice, "/apis/discovery.k8s.io/v1/endpointslices"),
        (Kind::Node, "/api/v1/nodes"),
        (Kind::ServiceCidr, "/apis/networking.k8s.io/v1/servicecidrs"),
    ];
    for (kind, path) in kinds {
        let (status, content_type, json_body) = get_raw(&rt, &client, path, "application/json");
        assert_eq!((status, content_type.as_str()), (200, "application/json"), "{kind}");
        let list: Value = serde_json::from_slice(&json_body).unwrap();
        let from_json: Vec<String> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| record(&kproxy_kube_source::decode(kind, item.to_string().as_bytes()).unwrap()))
            .collect();
        let (status, content_type, proto_body) = get_raw(&rt, &client, path, &format!("{PROTOBUF}, */*"));
        assert_eq!((status, content_type.as_str()), (200, PROTOBUF), "{kind}");
        let (items, meta) = kproxy_kube_source::protobuf::read_list_body(kind, &proto_body);
        let from_protobuf: Vec<String> = items.iter().map(|item| record(item.as_ref().unwrap())).collect();
        assert!(meta.unwrap().is_some(), "{kind}: the list's resource version");
        assert!(!from_json.is_empty(), "{kind}");
        assert_eq!(from_protobuf, from_json, "{kind}");
        eprintln!(
            "{kind}: {} objects, {} bytes of JSON, {} of protobuf",
            items.len(),
            json_body.len(),
            proto_body.len()
        );
    }
    let lb = record(
        &kproxy_kube_source::decode(
            Kind::Service,
            real(&plane, "/api/v1/namespaces/kp/services/lb").body.to_string().as_bytes(),
        )
        .unwrap(),
    );
    assert!(
        lb.contains("198.51.100.1") && lb.contains("LongLived") && lb.contains("node_port: Some("),
        "the LoadBalancer is read whole: {lb}"
    );

    // A streaming list in protobuf: the objects, then the bookmark that ends them (its annotation
    // read); a watch from a version long gone: an ERROR event (410) with a protobuf Status.
    let stream = "/api/v1/namespaces/kp/services?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2";
    let (status, content_type, body) = get_raw(&rt, &client, stream, &format!("{PROTOBUF}, */*"));
    assert_eq!((status, content_type.as_str()), (200, "application/vnd.kubernetes.protobuf;stream=watch"));
    let events = kproxy_kube_source::protobuf::read_watch_body(Kind::Service, &body);
    let added: BTreeSet<String> =
        events.iter().filter_map(|e| e.as_ref().ok()?.strip_prefix("ADDED kp/").map(str::to_owned)).collect();
    assert_eq!(added, names(&["a", "b", "lb"]), "{events:?}");
    assert!(events.iter().any(|e| e.as_ref().is_ok_and(|e| e.ends_with(" initial-events-end"))), "{events:?}");
    assert!(events.iter().all(Result::is_ok), "{events:?}");
    // A watch from the start of history replays every change as a frame (the status patch a
    // MODIFIED); from before a restarted server's cache, with etcd compacted meanwhile, it is an
    // ERROR event whose object is a protobuf Status (410).
    let from = |rv: &str| format!("/api/v1/namespaces/kp/services?watch=1&resourceVersion={rv}&timeoutSeconds=2");
    let (status, _, body) = get_raw(&rt, &client, &from("1"), &format!("{PROTOBUF}, */*"));
    assert_eq!(status, 200);
    let events = kproxy_kube_source::protobuf::read_watch_body(Kind::Service, &body);
    assert!(events.iter().all(Result::is_ok) && events.contains(&Ok("MODIFIED kp/lb".to_owned())), "{events:?}");
    let old = real(&plane, SERVICES).body["metadata"]["resourceVersion"].as_str().unwrap().to_owned();
    plane.stop_apiserver();
    bump_and_compact_etcd(&plane);
    plane.start_apiserver().unwrap();
    let (status, _, body) = get_raw(&rt, &client, &from(&old), &format!("{PROTOBUF}, */*"));
    assert_eq!(status, 200);
    assert_eq!(kproxy_kube_source::protobuf::read_watch_body(Kind::Service, &body), [Ok("ERROR 410".to_owned())]);
    // An error answer is a protobuf Status.
    let (status, content_type, body) =
        get_raw(&rt, &client, "/api/v1/namespaces/kp/services/nope", &format!("{PROTOBUF}, */*"));
    assert_eq!((status, content_type.as_str()), (404, PROTOBUF), "{}", String::from_utf8_lossy(&body));
    assert!(body.starts_with(&kproxy_kube_source::protobuf::MAGIC));
}
