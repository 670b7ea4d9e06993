//! Fuzzing the Kubernetes API source's stream readers, end to end through the unmodified
//! kube-rs client: the watch-cache list decoded as its body arrives (`list_stream.rs`), the
//! paginated list, the watch event stream (newline-delimited events), and the streaming list
//! with its `k8s.io/initial-events-end` bookmark and the fall back to list + watch
//! (`streaming.rs`). The API server is a function that answers each request from a script, with
//! bodies handed over in chunks cut anywhere (a chunk boundary inside a JSON string, an escape,
//! a line end); no socket, no fake server process.
//!
//! Bodies start as a real API server's (lists and events of objects shaped like a real
//! cluster's, `kproxy_kube_source::fake::objects`) and are restructured as JSON or edited as
//! text; statuses other than 200 come with a `Status` body. For every case:
//! - nothing panics, on any thread of the source, and no allocation is out of proportion;
//! - the changes the source emits do not depend on where the chunks were cut;
//! - they keep the source's contract: `ListEnded` only closes a `ListStarted`, an unreadable
//!   object is only reported inside a listing, a deletion only outside one, no object is made
//!   up (each one applied is named in a body), and the counters agree with the changes;
//! - bodies left whole give exactly the changes they describe, however they are cut.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

mod bounds;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use http_body_util::StreamBody;
use kproxy_fuzz::{mutated_json, mutated_text};
use kproxy_kube_source::fake::objects::{self, Endpoint};
use kproxy_kube_source::{KubeSourceOptions, ListMode, RetryBackoff, SourceStats};
use kproxy_state::{Change, Kind};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Value, json};

/// How long a case may go without its source asking for what follows the script: far beyond
/// the few milliseconds a case takes, on a loaded machine too. Past it, a reader hangs.
const PATIENCE: Duration = Duration::from_secs(120);

/// One answer of the API server: to a list or to a watch request.
#[derive(Debug, Clone)]
struct Answer {
    watch: bool,
    status: u16,
    body: Vec<u8>,
}

/// What the source made of a script.
#[derive(Debug, Clone, PartialEq)]
struct Outcome {
    /// The changes of the kind under test, in order.
    changes: Vec<Change>,
    /// Malformed objects, watch errors, lists, events and streaming fallbacks counted.
    counted: [u64; 5],
    /// Panics on the source's threads.
    panics: Vec<String>,
}

fn ip(text: &str) -> std::net::IpAddr {
    text.parse().unwrap()
}

/// Three objects of `kind` as a list's items (no `kind`/`apiVersion`) at resource version `rv`.
fn items(kind: Kind) -> Vec<Value> {
    let eps = [Endpoint { ip: ip("198.18.17.2"), node: "node-a" }, Endpoint { ip: ip("198.18.18.2"), node: "node-b" }];
    let mut items = match kind {
        Kind::Service => vec![
            objects::service("prod", "web", ip("198.18.128.10"), 80, 8080),
            objects::service("prod", "api", ip("198.18.128.11"), 443, 8443),
            objects::service("kube-system", "dns", ip("fd00:96::a"), 53, 53),
        ],
        Kind::EndpointSlice => vec![
            objects::endpoint_slice("prod", "web", "web-x1", &eps, 8080),
            objects::endpoint_slice("prod", "api", "api-x2", &eps[..1], 8443),
            objects::endpoint_slice("kube-system", "dns", "dns-x3", &eps[1..], 53),
        ],
        other => unreachable!("{other} is not fuzzed"),
    };
    for (i, item) in items.iter_mut().enumerate() {
        item["metadata"]["resourceVersion"] = (5 + i).to_string().into();
    }
    items
}

fn api_version(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Service => ("v1", "Service"),
        Kind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
        other => unreachable!("{other} is not fuzzed"),
    }
}

/// A watch event's object: the item with its `kind`, `apiVersion` and resource version.
fn watched(kind: Kind, item: &Value, rv: u64) -> Value {
    let (api_version, kind_name) = api_version(kind);
    let mut object = item.clone();
    object["apiVersion"] = api_version.into();
    object["kind"] = kind_name.into();
    object["metadata"]["resourceVersion"] = rv.to_string().into();
    object
}

/// A BOOKMARK as kube-apiserver writes it; `end`: the one ending a streaming list's initial
/// events.
fn bookmark(kind: Kind, rv: u64, end: bool) -> Value {
    let (api_version, kind_name) = api_version(kind);
    let mut object =
        json!({"kind": kind_name, "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}});
    if end {
        object["metadata"]["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"type": "BOOKMARK", "object": object})
}

fn event(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

/// The list body of `items` at resource version 10.
fn list_body(kind: Kind, items: &[Value]) -> Value {
    let (api_version, kind_name) = api_version(kind);
    json!({"kind": format!("{kind_name}List"), "apiVersion": api_version, "metadata": {"resourceVersion": "10"}, "items": items})
}

/// The events after a list at version 10: the first object changed, the second deleted, a
/// fourth added, a bookmark.
fn changes_after_list(kind: Kind, items: &[Value]) -> Vec<Value> {
    let mut changed = watched(kind, &items[0], 11);
    changed["metadata"]["labels"]["changed"] = "yes".into();
    let mut added = watched(kind, &items[2], 13);
    added["metadata"]["name"] = "added".into();
    vec![
        event("MODIFIED", changed),
        event("DELETED", watched(kind, &items[1], 12)),
        event("ADDED", added),
        bookmark(kind, 14, false),
    ]
}

/// A streaming list: every object ADDED, the end bookmark, then changes.
fn streaming_events(kind: Kind, items: &[Value]) -> Vec<Value> {
    let mut events: Vec<Value> = items.iter().map(|item| event("ADDED", watched(kind, item, 10))).collect();
    events.push(bookmark(kind, 10, true));
    events.extend(changes_after_list(kind, items).into_iter().take(2));
    events
}

/// Events as a watch body: one JSON document per line.
fn lines(events: &[Value]) -> Vec<u8> {
    events.iter().flat_map(|e| format!("{e}\n").into_bytes()).collect()
}

/// The script of a valid exchange in `mode`: what the API server answers, request by request.
fn seed_script(kind: Kind, mode: ListMode) -> Vec<(bool, Value)> {
    let items = items(kind);
    let list = (false, list_body(kind, &items));
    let after = (true, Value::Array(changes_after_list(kind, &items)));
    match mode {
        ListMode::Streaming => vec![
            (true, Value::Array(streaming_events(kind, &items))),
            // A resumed watch after the first ends; or a second streaming list, after which
            // the kind falls back to the list and watch that follow.
            (true, Value::Array(vec![event("ADDED", watched(kind, &items[2], 20))])),
            list,
            after,
        ],
        ListMode::WatchCache | ListMode::Paginated(_) => vec![list, after],
    }
}

/// The body of one scripted answer: a watch's events one per line, a list as one document.
fn body_of(watch: bool, value: &Value) -> Vec<u8> {
    match (watch, value) {
        (true, Value::Array(events)) => lines(events),
        _ => value.to_string().into_bytes(),
    }
}

/// A status other than 200, with kube-apiserver's `Status` body.
fn status_body(code: u16) -> Vec<u8> {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": "the fuzzed API server says no", "reason": "Fuzzed", "code": code})
    .to_string()
    .into_bytes()
}

/// One scripted answer as fuzzed: its body restructured, or edited as text, or left whole; now
/// and then a refusal.
fn fuzzed_answer(watch: bool, seed: Value) -> impl Strategy<Value = Answer> {
    let text = String::from_utf8(body_of(watch, &seed)).unwrap();
    let status = prop_oneof![12 => Just(200u16), 1 => proptest::sample::select(vec![403u16, 410, 422, 429, 500])];
    let body = prop_oneof![
        2 => Just(body_of(watch, &seed)),
        3 => mutated_json(seed).prop_map(move |value| body_of(watch, &value)),
        3 => mutated_text(text).prop_map(String::into_bytes),
    ];
    (status, body).prop_map(move |(status, body)| {
        let body = if status == 200 { body } else { status_body(status) };
        Answer { watch, status, body }
    })
}

fn mode() -> impl Strategy<Value = ListMode> {
    proptest::sample::select(vec![ListMode::Streaming, ListMode::WatchCache, ListMode::Paginated(500)])
}

fn kind() -> impl Strategy<Value = Kind> {
    proptest::sample::select(vec![Kind::Service, Kind::EndpointSlice])
}

/// A kind, a mode and a fuzzed script, with where to cut the bodies.
fn fuzzed_case() -> impl Strategy<Value = (Kind, ListMode, Vec<Answer>, Vec<Index>)> {
    (kind(), mode()).prop_flat_map(|(kind, mode)| {
        let answers: Vec<_> =
            seed_script(kind, mode).into_iter().map(|(watch, seed)| fuzzed_answer(watch, seed).boxed()).collect();
        (Just(kind), Just(mode), answers, proptest::collection::vec(any::<Index>(), 0..24))
    })
}

/// Cuts `body` at `cuts` (positions as indexes into it).
fn chunks(body: &[u8], cuts: &[Index]) -> Vec<Bytes> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
    at.extend([0, body.len()]);
    at.sort_unstable();
    at.dedup();
    at.windows(2).map(|w| Bytes::copy_from_slice(&body[w[0]..w[1]])).collect()
}

/// The path of `kind`'s objects.
fn plural(kind: Kind) -> &'static str {
    match kind {
        Kind::Service => "/services",
        Kind::EndpointSlice => "/endpointslices",
        Kind::Node => "/nodes",
        Kind::ServiceCidr => "/servicecidrs",
    }
}

type Response = http::Response<StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>>;

/// A response whose body comes in `chunks`, each after the reader was made to wait.
fn response(status: u16, chunks: Vec<Bytes>) -> Response {
    use futures::StreamExt as _;
    let frames = futures::stream::iter(chunks)
        .then(|chunk| async move {
            // Pending once before each chunk: a reader sees the body arrive piece by piece.
            tokio::task::yield_now().await;
            Ok(Frame::data(chunk))
        })
        .boxed();
    let mut response = http::Response::new(StreamBody::new(frames));
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static CASES: AtomicUsize = AtomicUsize::new(0);
const THREAD_PREFIX: &str = "kube-streams-";

/// Notes every panic on a source's thread (tokio catches them in its tasks, and `run` does not
/// report a task that ended), besides printing it as usual.
fn note_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current();
            if let Some(name) = thread.name().filter(|n| n.starts_with(THREAD_PREFIX)) {
                PANICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(format!("{name}: {info}"));
            }
            previous(info);
        }));
    });
}

/// Runs the API source for `kind` against an API server that answers from `script` (each body
/// cut at `cuts`), until the source asks for more than the script holds.
fn follow(kind: Kind, mode: ListMode, script: &[Answer], cuts: &[Index]) -> Outcome {
    note_panics();
    let thread = format!("{THREAD_PREFIX}{}", CASES.fetch_add(1, Ordering::Relaxed));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(thread.clone())
        .on_thread_start(bounds::join_measurement)
        .enable_all()
        .build()
        .unwrap();
    let stats = Arc::new(SourceStats::new());
    let changes = runtime.block_on(async {
        let script: Arc<Mutex<VecDeque<Answer>>> = Arc::new(Mutex::new(script.iter().cloned().collect()));
        let done = Arc::new(tokio::sync::Notify::new());
        let cuts = cuts.to_vec();
        let served = done.clone();
        let api_server = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let path = request.uri().path().to_owned();
            let query = request.uri().query().unwrap_or_default().to_owned();
            let watch = query.split('&').any(|p| p == "watch=true" || p == "watch=1");
            let answer = if path.ends_with(plural(kind)) {
                let mut script = script.lock().unwrap();
                match script.front() {
                    Some(next) if next.watch == watch => script.pop_front(),
                    _ => None,
                }
            } else {
                // The other kinds' requests are never answered.
                Some(Answer { watch, status: 0, body: Vec::new() })
            };
            let (done, cuts) = (served.clone(), cuts.clone());
            async move {
                match answer {
                    Some(Answer { status: 0, .. }) => std::future::pending().await,
                    Some(answer) => Ok::<_, Infallible>(response(answer.status, chunks(&answer.body, &cuts))),
                    None => {
                        // The script is played out: the source asked for what follows it.
                        done.notify_one();
                        std::future::pending().await
                    }
                }
            }
        });
        let client = kube::Client::new(api_server, "default");
        let options = KubeSourceOptions {
            backoff: RetryBackoff::Fixed(Duration::ZERO),
            list_mode: mode,
            ..KubeSourceOptions::new("")
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
        let source = tokio::spawn(kproxy_kube_source::run(client, options, tx, stats.clone()));
        let mut changes = Vec::new();
        let played_out = tokio::time::timeout(PATIENCE, async {
            loop {
                tokio::select! {
                    biased;
                    Some(change) = rx.recv() => changes.push(change),
                    () = done.notified() => break,
                }
            }
        })
        .await;
        assert!(played_out.is_ok(), "the source stopped short of the end of its script: {changes:?}");
        // Whatever was sent before the request that ended the script.
        while let Ok(change) = rx.try_recv() {
            changes.push(change);
        }
        source.abort();
        let _ = source.await;
        changes
    });
    runtime.shutdown_background();
    let panics = std::mem::take(&mut *PANICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    let (mine, others): (Vec<String>, Vec<String>) =
        panics.into_iter().partition(|p| p.starts_with(&format!("{thread}:")));
    PANICS.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(others);
    Outcome {
        changes: changes.into_iter().filter(|c| c.kind() == kind).collect(),
        counted: [
            stats.malformed_objects(kind),
            stats.watch_errors(kind),
            stats.lists(kind),
            stats.events(kind),
            stats.streaming_fallbacks(kind),
        ],
        panics: mine,
    }
}

/// The contract of the source's changes for one kind, and what it counted.
fn check_contract(outcome: &Outcome, script: &[Answer]) {
    assert!(outcome.panics.is_empty(), "the source panicked: {:?}", outcome.panics);
    let bodies: Vec<String> = script.iter().map(|a| String::from_utf8_lossy(&a.body).into_owned()).collect();
    let mut listing = false;
    let (mut lists, mut events, mut unreadable) = (0, 0, 0);
    for change in &outcome.changes {
        match change {
            Change::ListStarted(_) => listing = true,
            Change::ListEnded(_) => {
                assert!(listing, "ListEnded without ListStarted: {:?}", outcome.changes);
                listing = false;
                lists += 1;
            }
            Change::Unreadable(_, key) => {
                assert!(listing, "an unreadable object {key} outside a listing: {:?}", outcome.changes);
                unreadable += 1;
            }
            Change::Applied(object) => {
                let name = &object.key().name;
                assert!(
                    bodies.iter().any(|b| b.contains(&**name)),
                    "{} is named in no body: {:?}",
                    object.key(),
                    outcome.changes
                );
                events += u64::from(!listing);
            }
            Change::Deleted(_, key) => {
                assert!(!listing, "a deletion of {key} inside a listing: {:?}", outcome.changes);
                assert!(!key.name.is_empty());
                events += 1;
            }
            other => panic!("the API source does not send {other:?}"),
        }
    }
    let [malformed, _, counted_lists, counted_events, _] = outcome.counted;
    assert_eq!(counted_lists, lists, "lists counted: {outcome:?}");
    assert_eq!(counted_events, events, "events counted: {outcome:?}");
    assert!(malformed >= unreadable, "every unreadable object is counted: {outcome:?}");
}

proptest! {
    #![proptest_config(bounds::cases(64))]

    /// The fuzz target: a script of fuzzed answers, its bodies cut at random and left whole.
    #[test]
    fn decode_fuzzed_list_and_watch_bodies_keep_the_source_contract_however_they_are_cut(
        (kind, mode, script, cuts) in fuzzed_case()
    ) {
        let size: usize = script.iter().map(|a| a.body.len()).sum();
        let (cut, largest) = bounds::largest_allocation_of_threads(|| follow(kind, mode, &script, &cuts));
        prop_assert!(
            largest <= bounds::allowance(size, 4 << 20),
            "{} bytes at once for {} bytes of bodies: {:?}",
            largest,
            size,
            script.iter().map(|a| String::from_utf8_lossy(&a.body).into_owned()).collect::<Vec<_>>()
        );
        check_contract(&cut, &script);
        let whole = follow(kind, mode, &script, &[]);
        prop_assert_eq!(cut, whole, "the chunks' boundaries changed what was read");
    }

    /// Bodies left whole give exactly the changes they describe, however they are cut.
    #[test]
    fn decode_valid_list_and_watch_bodies_give_their_objects_however_they_are_cut(
        kind in kind(),
        mode in mode(),
        cuts in proptest::collection::vec(any::<Index>(), 0..64),
    ) {
        let script: Vec<Answer> = seed_script(kind, mode)
            .into_iter()
            .map(|(watch, value)| Answer { watch, status: 200, body: body_of(watch, &value) })
            .collect();
        let outcome = follow(kind, mode, &script, &cuts);
        check_contract(&outcome, &script);
        prop_assert_eq!(outcome.changes, expected(kind, mode));
        prop_assert_eq!(outcome.counted, [0, 0, 1, 3, 0]);
    }
}

/// The changes a valid script of `mode` describes.
fn expected(kind: Kind, mode: ListMode) -> Vec<Change> {
    let decode = |object: &Value| kproxy_kube_source::decode(kind, object.to_string().as_bytes()).unwrap();
    let items = items(kind);
    let mut changes = vec![Change::ListStarted(kind)];
    changes.extend(items.iter().map(|item| match mode {
        ListMode::Streaming => Change::Applied(decode(&watched(kind, item, 10))),
        _ => Change::Applied(decode(item)),
    }));
    changes.push(Change::ListEnded(kind));
    let after = changes_after_list(kind, &items);
    changes.push(Change::Applied(decode(&after[0]["object"])));
    changes.push(Change::Deleted(kind, decode(&after[1]["object"]).key()));
    match mode {
        // The resumed watch's one event.
        ListMode::Streaming => changes.push(Change::Applied(decode(&watched(kind, &items[2], 20)))),
        _ => changes.push(Change::Applied(decode(&after[2]["object"]))),
    }
    changes
}

#[test]
fn every_seed_is_valid() {
    for kind in [Kind::Service, Kind::EndpointSlice] {
        for item in items(kind) {
            kproxy_kube_source::decode(kind, item.to_string().as_bytes()).unwrap();
        }
    }
}
