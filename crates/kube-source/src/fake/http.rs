//! The HTTP side of the fake API server: list and `?watch=true` requests, answered the way
//! kube-apiserver answers them (lists with a resourceVersion, paginated with `limit`/`continue`;
//! watch events; streaming lists with `sendInitialEvents` ending in the
//! `k8s.io/initial-events-end` bookmark; `410 Gone`; `Status` bodies for errors), in JSON or, when
//! the `Accept` header asks for it first, protobuf (lists and `Status` bodies in the envelope,
//! watches as length-delimited frames: `crate::protobuf::encode`).

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use kproxy_state::{Kind, ObjectKey};
use serde::Serialize;
use serde::ser::SerializeMap;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::selector::{Filter, Selector};
use super::store::{Signal, Store, event_line, expired, info, visible};
use super::{StreamingLists, lock};
use crate::protobuf;

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// The annotation on the bookmark that ends a streaming list's initial events.
pub(crate) const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// A watch response body frame collects ready events up to this size (the first event of a frame
/// is sent as soon as it is there).
const FRAME_BYTES: usize = 64 * 1024;

type Query = BTreeMap<String, String>;

/// The encoding of an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Json,
    Protobuf,
}

impl Encoding {
    /// The first media type of `Accept` the fake serves (`*/*`: JSON, as kube-apiserver), as a
    /// client's preference order; JSON when none.
    fn of(accept: Option<&hyper::header::HeaderValue>) -> Self {
        let accept = accept.and_then(|a| a.to_str().ok()).unwrap_or_default();
        for part in accept.split(',') {
            match part.split(';').next().unwrap_or_default().trim() {
                protobuf::MEDIA_TYPE => return Encoding::Protobuf,
                "application/json" | "*/*" | "application/*" => return Encoding::Json,
                _ => {}
            }
        }
        Encoding::Json
    }

    fn content_type(self, watch: bool) -> &'static str {
        match (self, watch) {
            (Encoding::Json, _) => "application/json",
            (Encoding::Protobuf, false) => "application/vnd.kubernetes.protobuf",
            (Encoding::Protobuf, true) => "application/vnd.kubernetes.protobuf;stream=watch",
        }
    }

    /// A `Status` body.
    fn status(self, status: &Value) -> Vec<u8> {
        match self {
            Encoding::Json => status.to_string().into_bytes(),
            Encoding::Protobuf => protobuf::encode::status(status),
        }
    }
}

/// Serves one request.
pub(crate) async fn handle(store: Arc<Mutex<Store>>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let query: Query =
        form_urlencoded::parse(request.uri().query().unwrap_or_default().as_bytes()).into_owned().collect();
    let encoding = Encoding::of(request.headers().get(hyper::header::ACCEPT));
    let answer = handle_in(&store, &query, request.uri().path(), request.method(), encoding).await;
    if answer.status() == StatusCode::OK {
        lock(&store).answers[usize::from(encoding == Encoding::Json)] += 1;
    }
    Ok(answer)
}

async fn handle_in(
    store: &Arc<Mutex<Store>>,
    query: &Query,
    path: &str,
    method: &Method,
    encoding: Encoding,
) -> Response<Body> {
    let status = |code, reason: &str, message: &str| status(encoding, code, reason, message);
    let Some((kind, namespace)) = route(path) else {
        return status(StatusCode::NOT_FOUND, "NotFound", "the server could not find the requested resource");
    };
    if *method != Method::GET {
        return status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "the fake API server is read-only");
    }
    if lock(store).unserved.contains(&kind) {
        return status(StatusCode::NOT_FOUND, "NotFound", "the server could not find the requested resource");
    }
    if lock(store).forbidden.contains(&kind) {
        let message = format!(
            "{kind} is forbidden: User \"system:serviceaccount:kube-system:kube-proxy\" cannot list or watch it"
        );
        return status(StatusCode::FORBIDDEN, "Forbidden", &message);
    }
    let selector = |name: &str| Selector::parse(query.get(name).map(String::as_str).unwrap_or_default());
    let filter = match (selector("labelSelector"), selector("fieldSelector")) {
        (Ok(labels), Ok(fields)) => Filter { labels, fields, namespace },
        (Err(e), _) | (_, Err(e)) => return status(StatusCode::BAD_REQUEST, "BadRequest", &e),
    };
    let param = |name: &str| query.get(name).map(String::as_str);
    let rv = match param("resourceVersion").filter(|rv| !rv.is_empty()).map(str::parse::<u64>).transpose() {
        Ok(rv) => rv,
        Err(_) => return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid resourceVersion"),
    };
    if matches!(param("watch"), Some("true" | "1")) {
        let answer = {
            let mut store = lock(store);
            if param("sendInitialEvents") == Some("true") {
                *store.streaming_list_requests.entry(kind).or_default() += 1;
            }
            store.streaming_lists
        };
        let mut send_initial_events = match check_watch_options(query, answer != StreamingLists::WatchListOff) {
            Ok(send) => send,
            Err(message) => {
                return response(encoding, StatusCode::UNPROCESSABLE_ENTITY, &invalid_list_options(&message));
            }
        };
        let mut failure = None;
        if send_initial_events {
            match answer {
                StreamingLists::Served | StreamingLists::WatchListOff => {}
                StreamingLists::Refused(code) => {
                    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    return status(code, reason_of(code), "the fake API server refuses this streaming list");
                }
                StreamingLists::ErrorEvent(code) => failure = Some(InitialEventsFailure::ErrorEvent(code)),
                StreamingLists::ClosedEarly => failure = Some(InitialEventsFailure::ClosedEarly),
                StreamingLists::Ignored => send_initial_events = false,
            }
        }
        let timeout =
            param("timeoutSeconds").and_then(|t| t.parse().ok()).map_or(Duration::from_secs(1800), Duration::from_secs);
        let bookmarks = param("allowWatchBookmarks") == Some("true");
        let options = WatchOptions { rv: rv.filter(|rv| *rv != 0), send_initial_events, failure, timeout, bookmarks };
        watch(store, kind, filter, options, encoding)
    } else {
        let limit = match param("limit").map(str::parse::<usize>).transpose() {
            Ok(limit) => limit.filter(|l| *l > 0),
            Err(_) => return status(StatusCode::BAD_REQUEST, "BadRequest", "invalid limit"),
        };
        let request = ListRequest { rv, limit, continue_token: param("continue").filter(|c| !c.is_empty()) };
        list(store, kind, &filter, request, encoding).await
    }
}

/// Checks the watch options as kube-apiserver validates them; says whether initial events were
/// asked for.
///
/// `sendInitialEvents` needs `resourceVersionMatch=NotOlderThan` and `allowWatchBookmarks=true`;
/// `resourceVersionMatch` on a watch needs `sendInitialEvents`; a server without the WatchList
/// feature refuses `sendInitialEvents` altogether. All of these are `422 Invalid` there.
fn check_watch_options(query: &Query, streaming_lists: bool) -> Result<bool, String> {
    let send = query.get("sendInitialEvents").map(|v| v == "true");
    let version_match = query.get("resourceVersionMatch").map(String::as_str).filter(|m| !m.is_empty());
    let bookmarks = query.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    if send.is_some() {
        if !streaming_lists {
            return Err("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList \
                        feature gate is enabled"
                .into());
        }
        if version_match != Some("NotOlderThan") {
            return Err("resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to \
                        NotOlderThan"
                .into());
        }
    }
    if let Some(version_match) = version_match {
        if send.is_none() {
            return Err("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless \
                        sendInitialEvents is provided"
                .into());
        }
        if version_match != "NotOlderThan" {
            return Err(format!("resourceVersionMatch: Unsupported value: {version_match:?}"));
        }
        if !bookmarks {
            return Err(
                "allowWatchBookmarks: Forbidden: allowWatchBookmarks required when resourceVersionMatch is set".into(),
            );
        }
    }
    Ok(send == Some(true))
}

/// kube-apiserver's `422 Invalid` for watch options that do not validate, from a message
/// `field: Forbidden: detail` (or `Unsupported value`), with its `details.causes` (as checked
/// against v1.36.2 by `tests/real_apiserver.rs`).
fn invalid_list_options(message: &str) -> Value {
    let (field, cause) = message.split_once(": ").unwrap_or(("", message));
    let reason = if cause.starts_with("Unsupported value") { "FieldValueNotSupported" } else { "FieldValueForbidden" };
    let mut body = status_body(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        &format!("ListOptions.meta.k8s.io \"\" is invalid: {message}"),
    );
    body["details"] = json!({"group": "meta.k8s.io", "kind": "ListOptions",
                             "causes": [{"reason": reason, "message": cause, "field": field}]});
    body
}

/// The kind (and namespace) a path names.
fn route(path: &str) -> Option<(Kind, Option<String>)> {
    Kind::ALL.into_iter().find_map(|kind| {
        let info = info(kind);
        let rest = path.strip_prefix(info.prefix)?;
        if rest.strip_prefix('/')? == info.plural {
            return Some((kind, None));
        }
        let (namespace, plural) = rest.strip_prefix("/namespaces/")?.split_once('/')?;
        (info.namespaced && plural == info.plural).then(|| (kind, Some(namespace.to_owned())))
    })
}

/// What a list request asked for.
struct ListRequest<'a> {
    rv: Option<u64>,
    limit: Option<usize>,
    continue_token: Option<&'a str>,
}

/// A continue token: the resource version of the list's first page and the last key served.
fn continue_token(rv: u64, key: &ObjectKey) -> String {
    format!("{rv}/{}/{}", key.namespace, key.name)
}

fn parse_continue(token: &str) -> Option<(u64, ObjectKey)> {
    let mut parts = token.splitn(3, '/');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, ObjectKey::new(parts.next()?, parts.next()?)))
}

/// Answers a list:
///
/// - `resourceVersion=0` is served from the watch cache, which ignores `limit`: the whole list in
///   one response, as kube-apiserver's watch cache does (client-go's reflector relies on that);
/// - otherwise `limit` pages the list in key order; `continue` resumes after the last key of the
///   previous page and every page carries the first page's resource version. A token older than
///   the compacted history is `410 Expired`, as for etcd. Unlike etcd, a later page reads the
///   current objects rather than a snapshot; a client that watches from the list's version gets
///   the changes in between as events, so it converges all the same.
async fn list(
    store: &Arc<Mutex<Store>>,
    kind: Kind,
    filter: &Filter,
    request: ListRequest<'_>,
    encoding: Encoding,
) -> Response<Body> {
    let status = |code, reason: &str, message: &str| status(encoding, code, reason, message);
    wait_while_held(store, kind).await;
    let delay = lock(store).list_delay.get(&kind).copied().unwrap_or_default();
    pause(delay).await;
    let (items, rv, next, remaining) = {
        let mut store = lock(store);
        *store.lists.entry(kind).or_default() += 1;
        match request.continue_token {
            Some(token) => {
                let Some((rv, after)) = parse_continue(token) else {
                    return status(StatusCode::BAD_REQUEST, "BadRequest", "continue key is not valid");
                };
                if rv < store.compacted {
                    let message = "The provided continue parameter is too old to display a consistent list result. \
                                   You can start a new list without the continue parameter.";
                    return response(encoding, StatusCode::GONE, &expired(message));
                }
                let (items, next, remaining) =
                    store.page_counted(kind, filter, Some(&after), request.limit.unwrap_or(usize::MAX));
                (items, rv, next, remaining)
            }
            None if request.rv == Some(0) => (store.list(kind, filter), store.rv, None, None),
            None => {
                let (items, next, remaining) =
                    store.page_counted(kind, filter, None, request.limit.unwrap_or(usize::MAX));
                (items, store.rv, next, remaining)
            }
        }
    };
    let info = info(kind);
    let body = ListBody {
        kind: format!("{}List", info.kind),
        api_version: info.api_version,
        metadata: ListMeta {
            resource_version: rv.to_string(),
            continue_: next.map(|key| continue_token(rv, &key)),
            remaining_item_count: remaining,
        },
        items: Vec::new(),
    };
    let item_delay = lock(store).list_item_delay;
    if encoding == Encoding::Protobuf {
        return protobuf_list(store.clone(), kind, &body.metadata, &items, item_delay);
    }
    if !item_delay.is_zero() {
        return trickled_list(store.clone(), kind, &body, items, item_delay);
    }
    let body = ListBody { items: items.iter().map(|item| ListItem(item)).collect(), ..body };
    let response = match serde_json::to_vec(&body) {
        Ok(bytes) => bytes_response(Encoding::Json, StatusCode::OK, bytes),
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", &e.to_string()),
    };
    *lock(store).lists_sent.entry(kind).or_default() += 1;
    response
}

/// A list whose body is written item by item, `delay` before each (kube-apiserver streams the
/// encoding of a large list too); counted as sent once its last byte is written.
fn trickled_list(
    store: Arc<Mutex<Store>>,
    kind: Kind,
    head: &ListBody<'_>,
    items: Vec<Arc<Value>>,
    delay: Duration,
) -> Response<Body> {
    // The body without items, cut before its closing `]}`.
    let mut head = serde_json::to_string(head).unwrap_or_default();
    head.truncate(head.len().saturating_sub(2));
    let items: VecDeque<String> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let text = serde_json::to_string(&ListItem(item)).unwrap_or_default();
            if i == 0 { text } else { format!(",{text}") }
        })
        .collect();
    let chunks =
        futures::stream::unfold((Some(head), items, Some(store)), move |(head, mut items, store)| async move {
            if let Some(head) = head {
                return Some((head, (None, items, store)));
            }
            if let Some(item) = items.pop_front() {
                pause(delay).await;
                return Some((item, (None, items, store)));
            }
            let store = store?;
            *lock(&store).lists_sent.entry(kind).or_default() += 1;
            Some(("]}".to_owned(), (None, items, None)))
        });
    streamed(Encoding::Json, false, futures::StreamExt::map(chunks, String::into_bytes))
}

/// A protobuf list: the envelope and list message up to the items, then each item's field,
/// `delay` before each (zero: the whole body at once); counted as sent once written.
fn protobuf_list(
    store: Arc<Mutex<Store>>,
    kind: Kind,
    meta: &ListMeta,
    items: &[Arc<Value>],
    delay: Duration,
) -> Response<Body> {
    let messages: Vec<Vec<u8>> = items
        .iter()
        .map(|item| protobuf::encode::message(kind, item).unwrap_or_else(|_| protobuf::encode::broken_message(item)))
        .collect();
    let remaining = meta.remaining_item_count.and_then(|r| i64::try_from(r).ok());
    let body = protobuf::encode::list(kind, &messages, &meta.resource_version, meta.continue_.as_deref(), remaining);
    if delay.is_zero() {
        *lock(&store).lists_sent.entry(kind).or_default() += 1;
        return bytes_response(Encoding::Protobuf, StatusCode::OK, body);
    }
    // Cut the body at each item: the items are its last fields, in order.
    let item_bytes: usize = messages.iter().map(|m| m.len() + field_overhead(m.len())).sum();
    let head = body.len() - item_bytes;
    let mut chunks = VecDeque::from([body[..head].to_vec()]);
    let mut at = head;
    for message in &messages {
        let len = message.len() + field_overhead(message.len());
        chunks.push_back(body[at..at + len].to_vec());
        at += len;
    }
    let chunks = futures::stream::unfold((chunks, true, Some(store)), move |(mut chunks, first, store)| async move {
        if let Some(chunk) = chunks.pop_front() {
            if !first {
                pause(delay).await;
            }
            return Some((chunk, (chunks, false, store)));
        }
        let store = store?;
        *lock(&store).lists_sent.entry(kind).or_default() += 1;
        Some((Vec::new(), (chunks, false, None)))
    });
    streamed(Encoding::Protobuf, false, chunks)
}

/// The bytes of a length-delimited field's key and length before `len` bytes of value.
fn field_overhead(len: usize) -> usize {
    1 + prost::length_delimiter_len(len)
}

#[derive(Serialize)]
struct ListBody<'a> {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: ListMeta,
    items: Vec<ListItem<'a>>,
}

#[derive(Serialize)]
struct ListMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_: Option<String>,
    /// As kube-apiserver: set on a page with more after it, when the list has no selectors.
    #[serde(rename = "remainingItemCount", skip_serializing_if = "Option::is_none")]
    remaining_item_count: Option<usize>,
}

/// A list item: like kube-apiserver's, without its own `kind` and `apiVersion`.
struct ListItem<'a>(&'a Value);

impl Serialize for ListItem<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Some(map) = self.0.as_object() else { return self.0.serialize(serializer) };
        let mut out = serializer.serialize_map(None)?;
        for (key, value) in map.iter().filter(|(key, _)| !matches!(key.as_str(), "kind" | "apiVersion")) {
            out.serialize_entry(key, value)?;
        }
        out.end()
    }
}

/// What a watch request asked for.
struct WatchOptions {
    /// Resume after this version; `None` (absent or 0) starts with the current objects as ADDED.
    rv: Option<u64>,
    /// A streaming list: the current objects, then the bookmark ending the initial events.
    send_initial_events: bool,
    /// How the streaming list fails, if it does.
    failure: Option<InitialEventsFailure>,
    timeout: Duration,
    bookmarks: bool,
}

/// How an accepted streaming list fails.
#[derive(Debug, Clone, Copy)]
enum InitialEventsFailure {
    /// An ERROR event with this code instead of the initial events; the stream ends.
    ErrorEvent(u16),
    /// The initial events without the bookmark; the stream ends.
    ClosedEarly,
}

/// The message and reason of kube-apiserver's ERROR event for a failed streaming list.
fn initial_events_error(code: u16) -> Value {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let message = if code == StatusCode::INTERNAL_SERVER_ERROR {
        "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled"
    } else {
        "the fake API server fails this streaming list"
    };
    status_body(code, reason_of(code), message)
}

/// The `reason` kube-apiserver gives a status code.
fn reason_of(code: StatusCode) -> &'static str {
    match code.as_u16() {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// An event waiting to be written; objects are serialized when their turn comes.
enum Pending {
    Object(&'static str, Arc<Value>),
    /// An ERROR event with this `Status`.
    Error(Value),
    /// A BOOKMARK; the one ending a streaming list's initial events is counted when written.
    Bookmark {
        rv: u64,
        initial_events_end: bool,
    },
}

impl Pending {
    fn into_bytes(self, state: &WatchState) -> Vec<u8> {
        if let Pending::Bookmark { initial_events_end: true, .. } = self {
            *lock(&state.store).initial_events_ends.entry(state.kind).or_default() += 1;
        }
        match state.encoding {
            Encoding::Json => match self {
                Pending::Object(event, object) => event_line(event, &object),
                Pending::Error(status) => event_line("ERROR", &status),
                Pending::Bookmark { rv, initial_events_end } => {
                    event_line("BOOKMARK", &bookmark(state.kind, rv, initial_events_end))
                }
            }
            .into_bytes(),
            Encoding::Protobuf => {
                let (event, object) = match self {
                    Pending::Object(event, object) => (
                        event,
                        protobuf::encode::object(state.kind, &object)
                            .unwrap_or_else(|_| protobuf::encode::broken_object(state.kind, &object)),
                    ),
                    Pending::Error(status) => ("ERROR", protobuf::encode::status(&status)),
                    Pending::Bookmark { rv, initial_events_end } => {
                        ("BOOKMARK", protobuf::encode::bookmark(state.kind, rv, initial_events_end))
                    }
                };
                protobuf::encode::watch_frame(event, object)
            }
        }
    }
}

/// Where one open watch stands.
struct WatchState {
    store: Arc<Mutex<Store>>,
    kind: Kind,
    encoding: Encoding,
    filter: Filter,
    pending: VecDeque<Pending>,
    signals: broadcast::Receiver<Signal>,
    /// Close after `pending` drains (after an ERROR event).
    closing: bool,
    bookmarks: bool,
    deadline: Instant,
    delay: Duration,
    /// Before the first event (a slow streaming list).
    start_delay: Duration,
    /// A streaming list, held before its first event while [`Store::held_lists`] names its kind.
    held_start: bool,
}

/// A BOOKMARK as kube-apiserver v1.36 writes it (checked by `tests/real_apiserver.rs`): the
/// kind's empty object as Go serializes it, with only the resource version in its metadata, and
/// the annotation on the one that ends a streaming list's initial events.
fn bookmark(kind: Kind, rv: u64, initial_events_end: bool) -> Value {
    let info = info(kind);
    let mut object = json!({"kind": info.kind, "apiVersion": info.api_version,
                            "metadata": {"resourceVersion": rv.to_string()}});
    if initial_events_end {
        object["metadata"]["annotations"] = json!({INITIAL_EVENTS_END_ANNOTATION: "true"});
    }
    let empty = match kind {
        Kind::Service => json!({"spec": {}, "status": {"loadBalancer": {}}}),
        Kind::EndpointSlice => json!({"addressType": "", "endpoints": null, "ports": null}),
        Kind::Node => json!({"spec": {}, "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                             "nodeInfo": {"architecture": "", "bootID": "", "containerRuntimeVersion": "",
                                          "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "",
                                          "machineID": "", "operatingSystem": "", "osImage": "",
                                          "systemUUID": ""}}}),
        Kind::ServiceCidr => json!({"spec": {}, "status": {}}),
    };
    if let (Some(object), Value::Object(fields)) = (object.as_object_mut(), empty) {
        object.extend(fields);
    }
    object
}

fn watch(
    shared: &Arc<Mutex<Store>>,
    kind: Kind,
    filter: Filter,
    options: WatchOptions,
    encoding: Encoding,
) -> Response<Body> {
    let mut store = lock(shared);
    *store.watches.entry(kind).or_default() += 1;
    let signals = store.signals.subscribe();
    let mut closing = false;
    let pending: VecDeque<Pending> = match options.failure.filter(|_| options.send_initial_events) {
        Some(failure) => {
            *store.initial_event_streams.entry(kind).or_default() += 1;
            closing = true;
            match failure {
                InitialEventsFailure::ErrorEvent(code) => VecDeque::from([Pending::Error(initial_events_error(code))]),
                InitialEventsFailure::ClosedEarly => {
                    let mut pending = initial_events(&store, kind, &filter);
                    pending.pop_back();
                    pending
                }
            }
        }
        None => match options.rv {
            Some(rv) if options.send_initial_events || rv >= store.compacted => {
                if options.send_initial_events {
                    *store.initial_event_streams.entry(kind).or_default() += 1;
                    initial_events(&store, kind, &filter)
                } else {
                    store
                        .since(kind, rv)
                        .iter()
                        .filter_map(|record| visible(record, &filter))
                        .map(|(event, object)| Pending::Object(event, object))
                        .collect()
                }
            }
            Some(rv) => {
                closing = true;
                let message = format!("too old resource version: {rv} ({})", store.compacted);
                VecDeque::from([Pending::Error(expired(&message))])
            }
            None if options.send_initial_events => {
                *store.initial_event_streams.entry(kind).or_default() += 1;
                initial_events(&store, kind, &filter)
            }
            None => store.list(kind, &filter).into_iter().map(|o| Pending::Object("ADDED", o)).collect(),
        },
    };
    // A streaming list is as slow as a list would be.
    let start_delay = if options.send_initial_events {
        store.list_delay.get(&kind).copied().unwrap_or_default()
    } else {
        Duration::ZERO
    };
    let state = WatchState {
        store: shared.clone(),
        kind,
        encoding,
        filter,
        pending,
        signals,
        closing,
        bookmarks: options.bookmarks,
        deadline: Instant::now() + options.timeout,
        delay: store.event_delay,
        start_delay,
        held_start: options.send_initial_events,
    };
    drop(store);
    let chunks = futures::stream::unfold(state, next_chunk);
    streamed(encoding, true, chunks)
}

/// A streaming list's start: every current object as ADDED, then the bookmark that ends the
/// initial events, at the version they were read at.
fn initial_events(store: &Store, kind: Kind, filter: &Filter) -> VecDeque<Pending> {
    let mut pending: VecDeque<Pending> =
        store.list(kind, filter).into_iter().map(|o| Pending::Object("ADDED", o)).collect();
    pending.push_back(Pending::Bookmark { rv: store.rv, initial_events_end: true });
    pending
}

/// The next body chunk: the events that are ready (one at a time when events are delayed).
///
/// A zero delay is no sleep at all: tokio rounds a timer up to its next millisecond tick, and a
/// sleep per 64 KiB frame held a 100k-Service streaming list to about 40 MB/s, with this server
/// using a quarter of a core (kube-apiserver has no such pause).
async fn next_chunk(mut state: WatchState) -> Option<(Vec<u8>, WatchState)> {
    if std::mem::take(&mut state.held_start) {
        wait_while_held(&state.store, state.kind).await;
    }
    pause(std::mem::take(&mut state.start_delay)).await;
    loop {
        if let Some(first) = state.pending.pop_front() {
            pause(state.delay).await;
            let mut chunk = first.into_bytes(&state);
            while state.delay.is_zero() && chunk.len() < FRAME_BYTES {
                let Some(next) = state.pending.pop_front() else { break };
                chunk.extend_from_slice(&next.into_bytes(&state));
            }
            return Some((chunk, state));
        }
        if state.closing {
            return None;
        }
        let signal = tokio::select! {
            signal = state.signals.recv() => signal,
            () = tokio::time::sleep_until(state.deadline) => return None,
        };
        match signal {
            Ok(Signal::Change(record)) if record.kind == state.kind => {
                if let Some((event, object)) = visible(&record, &state.filter) {
                    state.pending.push_back(Pending::Object(event, object));
                }
            }
            Ok(Signal::Bookmark(rv)) if state.bookmarks => {
                state.pending.push_back(Pending::Bookmark { rv, initial_events_end: false });
            }
            Ok(Signal::Expire) => {
                state.pending.push_back(Pending::Error(expired("too old resource version")));
                state.closing = true;
            }
            Ok(_) => {}
            // A watcher that cannot keep up is closed, as kube-apiserver does.
            Err(_) => return None,
        }
    }
}

/// Sleeps for `delay`, unless it is zero.
/// Waits while the lists of `kind` are held ([`super::FakeApiServer::hold_lists`]).
async fn wait_while_held(store: &Arc<Mutex<Store>>, kind: Kind) {
    while lock(store).held_lists.contains(&kind) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

/// A `200` response (a watch's when `watch`) whose body is written chunk by chunk as `chunks`
/// yields them.
fn streamed(
    encoding: Encoding,
    watch: bool,
    chunks: impl futures::Stream<Item = Vec<u8>> + Send + 'static,
) -> Response<Body> {
    let body = StreamBody::new(futures::StreamExt::map(chunks, |chunk| Ok(Frame::data(Bytes::from(chunk)))));
    let mut response = Response::new(BodyExt::boxed_unsync(body));
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(encoding.content_type(watch)));
    response
}

fn bytes_response(encoding: Encoding, code: StatusCode, body: Vec<u8>) -> Response<Body> {
    let mut response = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::from(body))));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(encoding.content_type(false)));
    response
}

/// A `Status` answer.
fn response(encoding: Encoding, code: StatusCode, status: &Value) -> Response<Body> {
    bytes_response(encoding, code, encoding.status(status))
}

fn status_body(code: StatusCode, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code.as_u16()})
}

fn status(encoding: Encoding, code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    response(encoding, code, &status_body(code, reason, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("/api/v1/services"), Some((Kind::Service, None)));
        assert_eq!(route("/api/v1/namespaces/prod/services"), Some((Kind::Service, Some("prod".into()))));
        assert_eq!(route("/apis/discovery.k8s.io/v1/endpointslices"), Some((Kind::EndpointSlice, None)));
        assert_eq!(route("/api/v1/nodes"), Some((Kind::Node, None)));
        assert_eq!(route("/api/v1/namespaces/x/nodes"), None);
        assert_eq!(route("/apis/networking.k8s.io/v1/servicecidrs"), Some((Kind::ServiceCidr, None)));
        assert_eq!(route("/api/v1/pods"), None);
    }

    fn query(pairs: &[(&str, &str)]) -> Query {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn watch_options_validated_like_kube_apiserver() {
        let streaming = query(&[
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "NotOlderThan"),
            ("allowWatchBookmarks", "true"),
        ]);
        assert_eq!(check_watch_options(&streaming, true), Ok(true));
        let refused = check_watch_options(&streaming, false).unwrap_err();
        assert!(refused.contains("WatchList feature gate"), "{refused}");
        let no_match = query(&[("sendInitialEvents", "true"), ("allowWatchBookmarks", "true")]);
        assert!(check_watch_options(&no_match, true).unwrap_err().contains("NotOlderThan"));
        let no_bookmarks = query(&[("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]);
        assert!(check_watch_options(&no_bookmarks, true).unwrap_err().contains("allowWatchBookmarks"));
        let match_alone = query(&[("resourceVersionMatch", "NotOlderThan"), ("allowWatchBookmarks", "true")]);
        assert!(check_watch_options(&match_alone, true).unwrap_err().contains("unless sendInitialEvents"));
        assert_eq!(check_watch_options(&query(&[("allowWatchBookmarks", "true")]), false), Ok(false));
    }

    #[test]
    fn continue_tokens_round_trip() {
        let key = ObjectKey::new("prod", "web-1");
        assert_eq!(parse_continue(&continue_token(42, &key)), Some((42, key)));
        assert_eq!(parse_continue("x/y/z"), None);
        assert_eq!(parse_continue("7"), None);
    }
}
