//! An in-process fake Kubernetes API server for tests and benchmarks.
//!
//! For what a real kube-apiserver cannot be made to do on demand (a `410` at a chosen moment, a
//! slow list, a dropped connection, a streaming list failed a given way) and for benchmarks at
//! 100k objects without etcd's write cost. Its answers are checked against kube-apiserver
//! v1.36.2's for the same requests by `tests/real_apiserver.rs` (status codes, shapes, event
//! types, bookmarks, `Status` objects). It speaks the real HTTP protocol, in JSON or protobuf as the
//! `Accept` header asks (a client that asks for nothing, as kube-rs's own, gets JSON), for the four
//! kinds kproxy watches:
//!
//! - lists with `metadata.resourceVersion`: `resourceVersion=0` served whole from the "watch
//!   cache" (which ignores `limit`), otherwise paginated with `limit`/`continue` (and
//!   `remainingItemCount` when there is no selector, as etcd counts then);
//! - `?watch=true` streams of newline-delimited ADDED/MODIFIED/DELETED/BOOKMARK/ERROR events,
//!   resumed from a resource version, ending at `timeoutSeconds`;
//! - streaming lists (`sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`): the
//!   current objects as ADDED, then a BOOKMARK annotated `k8s.io/initial-events-end`; or, with
//!   [`FakeApiServer::set_streaming_lists`], failed the ways real servers fail them
//!   ([`StreamingLists`]);
//! - `410 Gone` (as an ERROR event, like kube-apiserver) for a version older than the compacted
//!   history, and for an expired `continue` token; label and field selectors.
//!
//! A control handle adds, updates and deletes objects and injects the failures a real cluster
//! has: bookmarks, expired watches, compaction, dropped connections, a server that stops and comes
//! back on the same port, slow lists and slow events, an API group that is not served, and a
//! kind the client is forbidden to read.
//! [`objects`] builds objects shaped like a real cluster's (managedFields, labels, annotations).

mod http;
pub mod objects;
mod selector;
mod store;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kproxy_state::{Kind, ObjectKey};
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use store::{Signal, Store};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How the fake answers a streaming list (a watch with `sendInitialEvents=true`): as current
/// kube-apiserver releases do, or failed the ways real servers fail one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamingLists {
    /// The current objects as ADDED, then the `k8s.io/initial-events-end` bookmark, then changes.
    Served,
    /// Refused with `422 Invalid` ("... unless the WatchList feature gate is enabled"), as a
    /// kube-apiserver with the WatchList feature off does.
    WatchListOff,
    /// Refused at the start with this status code (`403`, `500`, a proxy's `400`, ...).
    Refused(u16),
    /// Accepted (`200`), then an ERROR event with this code, and the stream ends: kube-apiserver
    /// 1.36 on etcd 3.5 sends `500 InternalError` ("... the required storage feature
    /// RequestWatchProgress is disabled").
    ErrorEvent(u16),
    /// Accepted, the current objects sent, then the stream ends without the bookmark.
    ClosedEarly,
    /// `sendInitialEvents` ignored: a plain watch (the current objects as ADDED, then changes,
    /// never the initial-events-end bookmark).
    Ignored,
}

/// The accept loop and open connections of a running server.
#[derive(Debug)]
struct Running {
    accept: JoinHandle<()>,
    connections: Arc<Mutex<JoinSet<()>>>,
}

/// A fake API server on `127.0.0.1`, running until dropped.
#[derive(Debug)]
pub struct FakeApiServer {
    store: Arc<Mutex<Store>>,
    addr: SocketAddr,
    running: Mutex<Option<Running>>,
}

impl FakeApiServer {
    /// Starts an empty server on a free loopback port.
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let server = Self { store: Arc::new(Mutex::new(Store::new())), addr, running: Mutex::new(None) };
        server.serve(listener);
        Ok(server)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube-rs configuration pointing at this server (no auth, plain HTTP).
    pub fn kube_config(&self) -> Result<kube::Config, ::http::uri::InvalidUri> {
        Ok(kube::Config::new(self.url().parse()?))
    }

    /// Adds or updates an object (as ADDED or MODIFIED); sets its `kind`, `apiVersion` and a new
    /// `metadata.resourceVersion`, which is returned.
    pub fn apply(&self, kind: Kind, object: Value) -> u64 {
        lock(&self.store).apply(kind, object)
    }

    /// Deletes an object; returns the resource version of the deletion, or `None` if it did not exist.
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) -> Option<u64> {
        lock(&self.store).delete(kind, &ObjectKey::new(namespace, name))
    }

    /// The latest resource version.
    pub fn resource_version(&self) -> u64 {
        lock(&self.store).rv
    }

    /// Sends a BOOKMARK at the latest resource version to every open watch that asked for bookmarks.
    pub fn bookmark(&self) {
        let store = lock(&self.store);
        let _ = store.signals.send(Signal::Bookmark(store.rv));
    }

    /// Ends every open watch with an ERROR event `410 Expired`, as kube-apiserver does when a
    /// watcher falls behind the compacted history.
    pub fn expire_watches(&self) {
        let _ = lock(&self.store).signals.send(Signal::Expire);
    }

    /// Forgets the event history: a watch resumed from an older resource version gets `410 Gone`.
    pub fn compact(&self) {
        lock(&self.store).compact();
    }

    /// Delays every list of `kind` by `delay`, streaming lists included (zero to stop).
    pub fn set_list_delay(&self, kind: Kind, delay: Duration) {
        lock(&self.store).list_delay.insert(kind, delay);
    }

    /// Holds every list of `kind`, streaming lists included, until [`Self::release_lists`]: a
    /// listing that is still pending when a test looks, however slow the machine.
    pub fn hold_lists(&self, kind: Kind) {
        lock(&self.store).held_lists.insert(kind);
    }

    /// Lets the lists of `kind` that [`Self::hold_lists`] held go on.
    pub fn release_lists(&self, kind: Kind) {
        lock(&self.store).held_lists.remove(&kind);
    }

    /// Writes the body of each list answered from now on item by item, `delay` before each
    /// item (zero: the whole body at once).
    pub fn set_list_item_delay(&self, delay: Duration) {
        lock(&self.store).list_item_delay = delay;
    }

    /// How many list bodies (pages included) of `kind` were written in full.
    pub fn lists_sent(&self, kind: Kind) -> usize {
        lock(&self.store).lists_sent.get(&kind).copied().unwrap_or_default()
    }

    /// Delays each event of watches opened from now on by `delay`.
    pub fn set_event_delay(&self, delay: Duration) {
        lock(&self.store).event_delay = delay;
    }

    /// Serves `kind` or answers 404 for it (an API server without that API group).
    pub fn set_served(&self, kind: Kind, served: bool) {
        let mut store = lock(&self.store);
        if served {
            store.unserved.remove(&kind);
        } else {
            store.unserved.insert(kind);
        }
    }

    /// Answers requests for `kind` with `403 Forbidden`, as when the client's RBAC role lacks it
    /// (e.g. revoked while kproxy runs), or serves it again.
    pub fn set_forbidden(&self, kind: Kind, forbidden: bool) {
        let mut store = lock(&self.store);
        if forbidden {
            store.forbidden.insert(kind);
        } else {
            store.forbidden.remove(&kind);
        }
    }

    /// How watches with `sendInitialEvents=true` are answered from now on (default:
    /// [`StreamingLists::Served`], as in current kube-apiserver releases).
    pub fn set_streaming_lists(&self, answer: StreamingLists) {
        lock(&self.store).streaming_lists = answer;
    }

    /// How many watch requests of `kind` asked for initial events (`sendInitialEvents=true`),
    /// whatever the answer.
    pub fn streaming_list_requests(&self, kind: Kind) -> usize {
        lock(&self.store).streaming_list_requests.get(&kind).copied().unwrap_or_default()
    }

    /// How many watches of `kind` were opened as streaming lists (accepted with initial events
    /// asked for, whatever followed).
    pub fn streamed_lists(&self, kind: Kind) -> usize {
        lock(&self.store).initial_event_streams.get(&kind).copied().unwrap_or_default()
    }

    /// How many streaming lists of `kind` were sent in full (their initial-events-end bookmark
    /// written).
    pub fn streamed_lists_completed(&self, kind: Kind) -> usize {
        lock(&self.store).initial_events_ends.get(&kind).copied().unwrap_or_default()
    }

    /// How many list requests (pages included) of `kind` were answered.
    pub fn list_count(&self, kind: Kind) -> usize {
        lock(&self.store).lists.get(&kind).copied().unwrap_or_default()
    }

    /// How many list and watch requests were answered with success in protobuf and in JSON
    /// (as the `Accept` header asked).
    pub fn answers_by_encoding(&self) -> (usize, usize) {
        let answers = lock(&self.store).answers;
        (answers[0], answers[1])
    }

    /// How many watches of `kind` were opened.
    pub fn watch_count(&self, kind: Kind) -> usize {
        lock(&self.store).watches.get(&kind).copied().unwrap_or_default()
    }

    /// How many watch streams are open now.
    pub fn open_watches(&self) -> usize {
        lock(&self.store).signals.receiver_count()
    }

    /// Closes every open connection (clients see their watches break) but keeps listening.
    pub async fn drop_connections(&self) {
        let connections = lock(&self.running).as_ref().map(|r| r.connections.clone());
        if let Some(connections) = connections {
            let mut set = std::mem::take(&mut *lock(&connections));
            set.shutdown().await;
        }
    }

    /// Stops listening and closes every connection, keeping the stored objects (like an API server
    /// restart: etcd keeps the data).
    pub async fn stop(&self) {
        let running = lock(&self.running).take();
        if let Some(running) = running {
            running.accept.abort();
            let _ = running.accept.await;
            let mut set = std::mem::take(&mut *lock(&running.connections));
            set.shutdown().await;
        }
    }

    /// Listens again on the same port after [`stop`](Self::stop).
    pub async fn restart(&self) -> std::io::Result<()> {
        self.stop().await;
        let mut attempt = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(e) if attempt < 50 => {
                    attempt += 1;
                    tracing::debug!(error = %e, "rebinding the fake API server");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        };
        self.serve(listener);
        Ok(())
    }

    fn serve(&self, listener: TcpListener) {
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let accept = tokio::spawn(accept_loop(listener, self.store.clone(), connections.clone()));
        *lock(&self.running) = Some(Running { accept, connections });
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(running) = lock(&self.running).take() {
            running.accept.abort();
            lock(&running.connections).abort_all();
        }
    }
}

async fn accept_loop(listener: TcpListener, store: Arc<Mutex<Store>>, connections: Arc<Mutex<JoinSet<()>>>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::debug!(error = %e, "fake API server accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let store = store.clone();
        let service = service_fn(move |request| http::handle(store.clone(), request));
        let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
        let mut set = lock(&connections);
        while set.try_join_next().is_some() {}
        set.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "fake API server connection ended");
            }
        });
    }
}
