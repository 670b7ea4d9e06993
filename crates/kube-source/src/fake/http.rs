//! The HTTP side of the fake API server: list and `?watch=true` requests, answered the way
//! kube-apiserver answers them (JSON lists with a resourceVersion, newline-delimited watch events,
//! `410 Gone` as an ERROR event, `Status` bodies for errors).

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use kproxy_state::Kind;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::lock;
use super::selector::{Filter, Selector};
use super::store::{Signal, Store, event_line, expired, info, visible};

pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Serves one request.
pub(crate) async fn handle(store: Arc<Mutex<Store>>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let query: BTreeMap<String, String> =
        form_urlencoded::parse(request.uri().query().unwrap_or_default().as_bytes()).into_owned().collect();
    let Some((kind, namespace)) = route(request.uri().path()) else {
        return Ok(status(StatusCode::NOT_FOUND, "NotFound", "the server could not find the requested resource"));
    };
    if request.method() != Method::GET {
        return Ok(status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "the fake API server is read-only"));
    }
    if lock(&store).unserved.contains(&kind) {
        return Ok(status(StatusCode::NOT_FOUND, "NotFound", "the server could not find the requested resource"));
    }
    let selector = |name: &str| Selector::parse(query.get(name).map(String::as_str).unwrap_or_default());
    let filter = match (selector("labelSelector"), selector("fieldSelector")) {
        (Ok(labels), Ok(fields)) => Filter { labels, fields, namespace },
        (Err(e), _) | (_, Err(e)) => return Ok(status(StatusCode::BAD_REQUEST, "BadRequest", &e)),
    };
    let param = |name: &str| query.get(name).map(String::as_str);
    if matches!(param("watch"), Some("true" | "1")) {
        let rv = param("resourceVersion").filter(|rv| !rv.is_empty() && *rv != "0");
        let rv = match rv.map(str::parse::<u64>).transpose() {
            Ok(rv) => rv,
            Err(_) => return Ok(status(StatusCode::BAD_REQUEST, "BadRequest", "invalid resourceVersion")),
        };
        let timeout =
            param("timeoutSeconds").and_then(|t| t.parse().ok()).map_or(Duration::from_secs(1800), Duration::from_secs);
        let bookmarks = param("allowWatchBookmarks") == Some("true");
        Ok(watch(&store, kind, filter, rv, timeout, bookmarks))
    } else {
        Ok(list(&store, kind, &filter).await)
    }
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

async fn list(store: &Mutex<Store>, kind: Kind, filter: &Filter) -> Response<Body> {
    let delay = lock(store).list_delay.get(&kind).copied().unwrap_or_default();
    tokio::time::sleep(delay).await;
    let (items, rv) = {
        let mut store = lock(store);
        *store.lists.entry(kind).or_default() += 1;
        (store.list(kind, filter), store.rv)
    };
    // Like kube-apiserver, list items carry no kind/apiVersion of their own.
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut item| {
            if let Some(map) = item.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            item
        })
        .collect();
    let info = info(kind);
    let body = json!({"kind": format!("{}List", info.kind), "apiVersion": info.api_version,
                      "metadata": {"resourceVersion": rv.to_string()}, "items": items});
    json_response(StatusCode::OK, &body)
}

/// Where one open watch stands.
struct WatchState {
    kind: Kind,
    filter: Filter,
    pending: VecDeque<String>,
    signals: broadcast::Receiver<Signal>,
    /// Close after `pending` drains (after an ERROR event).
    closing: bool,
    bookmarks: bool,
    deadline: Instant,
    delay: Duration,
}

fn watch(
    store: &Mutex<Store>,
    kind: Kind,
    filter: Filter,
    rv: Option<u64>,
    timeout: Duration,
    bookmarks: bool,
) -> Response<Body> {
    let mut store = lock(store);
    *store.watches.entry(kind).or_default() += 1;
    let signals = store.signals.subscribe();
    let mut closing = false;
    let pending: VecDeque<String> = match rv {
        None => store.list(kind, &filter).iter().map(|o| event_line("ADDED", o)).collect(),
        Some(rv) if rv < store.compacted => {
            closing = true;
            let message = format!("too old resource version: {rv} ({})", store.compacted);
            VecDeque::from([event_line("ERROR", &expired(&message))])
        }
        Some(rv) => store
            .since(kind, rv)
            .iter()
            .filter_map(|record| visible(record, &filter))
            .map(|(event, object)| event_line(event, &object))
            .collect(),
    };
    let state = WatchState {
        kind,
        filter,
        pending,
        signals,
        closing,
        bookmarks,
        deadline: Instant::now() + timeout,
        delay: store.event_delay,
    };
    drop(store);
    let lines = futures::stream::unfold(state, next_line);
    let body = StreamBody::new(futures::StreamExt::map(lines, |line| Ok(Frame::data(Bytes::from(line)))));
    let mut response = Response::new(BodyExt::boxed_unsync(body));
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

async fn next_line(mut state: WatchState) -> Option<(String, WatchState)> {
    loop {
        if let Some(line) = state.pending.pop_front() {
            tokio::time::sleep(state.delay).await;
            return Some((line, state));
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
                    state.pending.push_back(event_line(event, &object));
                }
            }
            Ok(Signal::Bookmark(rv)) if state.bookmarks => {
                let info = info(state.kind);
                let object = json!({"kind": info.kind, "apiVersion": info.api_version,
                                    "metadata": {"resourceVersion": rv.to_string()}});
                state.pending.push_back(event_line("BOOKMARK", &object));
            }
            Ok(Signal::Expire) => {
                state.pending.push_back(event_line("ERROR", &expired("too old resource version")));
                state.closing = true;
            }
            Ok(_) => {}
            // A watcher that cannot keep up is closed, as kube-apiserver does.
            Err(_) => return None,
        }
    }
}

fn json_response(code: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(BodyExt::boxed_unsync(Full::new(Bytes::from(body.to_string()))));
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code.as_u16()});
    json_response(code, &body)
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
}
