//! Watching the four kinds and turning watcher events into [`Change`]s, object by object as
//! they arrive.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kproxy_state::{Change, Kind, Object};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::raw::{ApiKind, Decoded, Malformed};
use crate::relist::relisting;
use crate::request::ContentTypes;
use crate::retry::{LastError, RecoveryBackoff};
use crate::stats::SourceStats;
use crate::streaming;
use crate::watcher::Strategy;

/// Upstream's informer selector for Services and EndpointSlices: objects that belong to another
/// service proxy, and endpoints of headless services, are not ours.
pub const DEFAULT_LABEL_SELECTOR: &str = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// How long a failed watcher waits before it retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetryBackoff {
    /// client-go's reflector backoff (0.8 s doubling up to 30 s, with jitter) where the API
    /// server may be overloaded, quick retries where a retry costs it nothing (see
    /// `crates/kube-source/src/retry.rs`): converges within seconds of the server's recovery.
    #[default]
    Recovery,
    /// A fixed delay (tests).
    Fixed(Duration),
}

/// How the initial list (and every relist after `410 Gone`) is fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ListMode {
    /// A streaming list: one watch with `sendInitialEvents=true` that sends the current objects
    /// as events and a bookmark when they are all out (KEP-3157, the WatchList feature, on by
    /// default in current kube-apiserver releases). One request per kind, so the client rate
    /// limit never throttles a start, and objects arrive one at a time.
    ///
    /// Any failure of a streaming list before its `k8s.io/initial-events-end` bookmark (refused
    /// at the start with any status, an ERROR event of any code inside the watch, the stream
    /// ending early, no progress for [`KubeSourceOptions::initial_events_timeout`]) makes the
    /// kind fall back to [`ListMode::WatchCache`], logged once with the reason and counted in
    /// [`SourceStats::streaming_fallbacks`](crate::SourceStats::streaming_fallbacks); only no
    /// answer at all and a start refused `401`, `403` or `429` are retried as streaming lists,
    /// within that bound. A kind that
    /// fell back tries streaming again at the first relist that comes at least
    /// [`KubeSourceOptions::streaming_retry_after`] (30 minutes) after the failure: see
    /// `crates/kube-source/src/streaming.rs` for why.
    #[default]
    Streaming,
    /// A list from the API server's watch cache (`resourceVersion=0`, no `limit`: the watch
    /// cache would ignore it), then a watch from the list's resource version. Answered in one
    /// response, whose objects are decoded and handed over one at a time as the body arrives
    /// (`crates/kube-source/src/list_stream.rs`), never held as a whole list.
    WatchCache,
    /// A consistent list (`resourceVersion` unset) paginated by this many objects a request,
    /// then a watch. Each page is a request under the client rate limit.
    Paginated(u32),
}

/// What to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSourceOptions {
    /// This node's name (`--hostname-override` or the host name). Only this Node is watched;
    /// empty means no Node is watched (and Nodes count as synced and empty).
    pub node_name: String,
    /// Label selector for Services and EndpointSlices ([`DEFAULT_LABEL_SELECTOR`]).
    pub label_selector: String,
    /// Retry policy of every watcher.
    pub backoff: RetryBackoff,
    /// How lists are fetched.
    pub list_mode: ListMode,
    /// [`ListMode::Streaming`]: how long a streaming list may make no progress (no answer to its
    /// request, no event) before its bookmark before the kind falls back
    /// ([`INITIAL_EVENTS_TIMEOUT`](crate::INITIAL_EVENTS_TIMEOUT)).
    pub initial_events_timeout: Duration,
    /// [`ListMode::Streaming`]: after a fallback, the first relist at least this long after the
    /// failure tries streaming again ([`STREAMING_RETRY_AFTER`](crate::STREAMING_RETRY_AFTER)).
    pub streaming_retry_after: Duration,
    /// What lists and watches ask for (`clientConnection.contentType` and `acceptContentTypes`);
    /// protobuf first by default, as kube-proxy.
    pub content_types: ContentTypes,
}

impl KubeSourceOptions {
    /// Upstream's defaults for the node `node_name`: streaming lists, protobuf.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            label_selector: DEFAULT_LABEL_SELECTOR.to_owned(),
            backoff: RetryBackoff::default(),
            list_mode: ListMode::default(),
            initial_events_timeout: streaming::INITIAL_EVENTS_TIMEOUT,
            streaming_retry_after: streaming::STREAMING_RETRY_AFTER,
            content_types: ContentTypes::default(),
        }
    }
}

#[derive(Debug, Clone)]
struct FixedBackoff(Duration);

impl Iterator for FixedBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.0)
    }
}

impl Backoff for FixedBackoff {
    fn reset(&mut self) {}
}

/// A watcher's event for objects of kind `K`.
pub(crate) type WatchEvent<K> = Result<Event<Decoded<K>>, watcher::Error>;
pub(crate) type WatchEvents<K> = BoxStream<'static, WatchEvent<K>>;
/// One object as read: the state's object, or why it could not be.
type Read = Result<Object, Malformed>;
/// A watcher's event with its objects read, whatever their kind.
type ReadEvent = Result<Event<Read>, watcher::Error>;

pub(crate) fn with_backoff<K: ApiKind>(
    events: impl Stream<Item = WatchEvent<K>> + Send + 'static,
    backoff: RetryBackoff,
) -> WatchEvents<K> {
    match backoff {
        RetryBackoff::Recovery => {
            let last_error = LastError::new();
            let seen = last_error.clone();
            let events = events.inspect(move |event| {
                if let Err(error) = event {
                    seen.record(error);
                }
            });
            events.backoff(RecoveryBackoff::new(last_error)).boxed()
        }
        RetryBackoff::Fixed(delay) => events.backoff(FixedBackoff(delay)).boxed(),
    }
}

/// The events of one kind's watcher, its objects read.
fn watch_kind(
    client: &Client,
    kind: Kind,
    config: watcher::Config,
    opts: &KubeSourceOptions,
    stats: &Arc<SourceStats>,
) -> BoxStream<'static, ReadEvent> {
    match kind {
        Kind::Service => watch::<Service>(client, config, opts, stats),
        Kind::EndpointSlice => watch::<EndpointSlice>(client, config, opts, stats),
        Kind::Node => watch::<Node>(client, config, opts, stats),
        Kind::ServiceCidr => watch::<ServiceCIDR>(client, config, opts, stats),
    }
}

fn watch<K: ApiKind>(
    client: &Client,
    config: watcher::Config,
    opts: &KubeSourceOptions,
    stats: &Arc<SourceStats>,
) -> BoxStream<'static, ReadEvent> {
    let api: Api<Decoded<K>> = Api::all(client.clone());
    let accept = opts.content_types.clone();
    let events = match opts.list_mode {
        ListMode::Streaming => {
            let bounds =
                streaming::Bounds { progress: opts.initial_events_timeout, retry_after: opts.streaming_retry_after };
            streaming::lists(api, config, accept, opts.backoff, bounds, stats.clone())
        }
        ListMode::WatchCache => {
            let start =
                move || crate::watcher::watcher(api.clone(), config.clone(), Strategy::WatchCache, accept.clone());
            with_backoff(relisting(move || start().boxed()), opts.backoff)
        }
        ListMode::Paginated(size) => {
            let strategy = Strategy::Paginated(size);
            let start = move || crate::watcher::watcher(api.clone(), config.clone(), strategy, accept.clone());
            with_backoff(relisting(move || start().boxed()), opts.backoff)
        }
    };
    events.map(|event| event.map(read)).boxed()
}

/// The event with its object read.
fn read<K: ApiKind>(event: Event<Decoded<K>>) -> Event<Read> {
    match event {
        Event::Apply(decoded) => Event::Apply(decoded.into_result()),
        Event::Delete(decoded) => Event::Delete(decoded.into_result()),
        Event::Init => Event::Init,
        Event::InitApply(decoded) => Event::InitApply(decoded.into_result()),
        Event::InitDone => Event::InitDone,
    }
}

/// Watches Services, EndpointSlices, the own Node and ServiceCIDRs and sends their changes to
/// `tx` until the receiver is dropped.
///
/// Lists are handed over object by object as they arrive: [`Change::ListStarted`], every listed
/// object as [`Change::Applied`] (or [`Change::Unreadable`]), then [`Change::ListEnded`], after
/// which the consumer removes what the listing did not name and counts the kind as synced.
/// Neither the source nor the channel holds a whole list, and the source keeps no key of what
/// it sent; the consumer knows both Services and EndpointSlices are complete once both are
/// synced. Single changes between lists are `Applied` / `Deleted`. A
/// cluster without the ServiceCIDR API (404) gets an empty, synced ServiceCIDR listing, logged
/// once; the watcher keeps retrying in case the API appears. Errors are never fatal: the
/// watchers retry with `opts.backoff`, and each error is logged and counted in `stats`.
///
/// Each kind is followed by its own task, so decoding and converting Services and
/// EndpointSlices (the bulk of a start) use two cores where there are two.
///
/// A malformed object is skipped, logged and counted, and the consumer's last good version of it
/// stays in place: a key whose object could not be read is neither applied nor deleted.
pub async fn run(client: Client, opts: KubeSourceOptions, tx: mpsc::Sender<Change>, stats: Arc<SourceStats>) {
    let selected = watcher::Config::default().labels(&opts.label_selector);
    let mut watches = vec![
        (Kind::Service, selected.clone()),
        (Kind::EndpointSlice, selected),
        (Kind::ServiceCidr, watcher::Config::default()),
    ];
    if opts.node_name.is_empty() {
        tracing::warn!("no node name: not watching the own Node");
        if tx.send(Change::Synced(Kind::Node)).await.is_err() {
            return;
        }
    } else {
        watches.push((Kind::Node, watcher::Config::default().fields(&format!("metadata.name={}", opts.node_name))));
    }
    // Dropping the set (when `run` is dropped) aborts the tasks.
    let mut tasks = JoinSet::new();
    for (kind, config) in watches {
        let events = watch_kind(&client, kind, config, &opts, &stats);
        let emitter = KindEmitter::new(kind, tx.clone(), stats.clone());
        tasks.spawn(emitter.follow(events));
    }
    drop(tx);
    // Each task ends when the receiver is gone.
    while tasks.join_next().await.is_some() {}
}

/// One kind's watcher and the channel. It keeps nothing per object: on a relist, the consumer
/// works out what is gone (see [`Change::ListStarted`]).
struct KindEmitter {
    kind: Kind,
    tx: mpsc::Sender<Change>,
    stats: Arc<SourceStats>,
    /// Listed at least once.
    listed: bool,
    /// The ServiceCIDR API was found missing (logged once).
    no_service_cidr_api: bool,
}

impl KindEmitter {
    fn new(kind: Kind, tx: mpsc::Sender<Change>, stats: Arc<SourceStats>) -> Self {
        Self { kind, tx, stats, listed: false, no_service_cidr_api: false }
    }

    /// Handles the watcher's events until the receiver is gone.
    async fn follow(mut self, mut events: BoxStream<'static, ReadEvent>) {
        while let Some(event) = events.next().await {
            if !self.handle(event).await {
                return;
            }
        }
    }

    /// Handles one watcher event; false once the receiver is gone.
    async fn handle(&mut self, event: ReadEvent) -> bool {
        let kind = self.kind;
        match event {
            // A listing, or one that broke off starting over.
            Ok(Event::Init) => self.send(Change::ListStarted(kind)).await,
            Ok(Event::InitApply(read)) => match read {
                Ok(object) => self.send(Change::Applied(object)).await,
                // Listed, though unreadable: not gone, and the last good version stays.
                Err(malformed) => {
                    self.skip(&malformed);
                    self.send(Change::Unreadable(kind, malformed.key)).await
                }
            },
            Ok(Event::InitDone) => {
                self.stats.count_list(kind);
                self.first_listing_done();
                self.send(Change::ListEnded(kind)).await
            }
            Ok(Event::Apply(read)) => match read {
                Ok(object) => {
                    self.stats.count_event(kind);
                    self.send(Change::Applied(object)).await
                }
                Err(malformed) => {
                    self.skip(&malformed);
                    true
                }
            },
            Ok(Event::Delete(read)) => {
                let key = match read {
                    Ok(object) => object.key(),
                    Err(malformed) => malformed.key,
                };
                if key.name.is_empty() {
                    tracing::warn!(%kind, "deleted object without a name ignored");
                    self.stats.count_malformed(kind);
                    return true;
                }
                self.stats.count_event(kind);
                self.send(Change::Deleted(kind, key)).await
            }
            Err(error) => self.on_error(error).await,
        }
    }

    async fn on_error(&mut self, error: watcher::Error) -> bool {
        let kind = self.kind;
        self.stats.count_watch_error(kind);
        let not_found = matches!(&error,
            watcher::Error::InitialListFailed(kube::Error::Api(status))
            | watcher::Error::WatchStartFailed(kube::Error::Api(status)) if status.code == 404);
        if kind == Kind::ServiceCidr && not_found {
            if !self.no_service_cidr_api {
                self.no_service_cidr_api = true;
                tracing::info!(
                    "the API server does not serve networking.k8s.io/v1 ServiceCIDRs; treating them as none"
                );
            }
            return self.listed || self.synced().await;
        }
        match &error {
            watcher::Error::WatchError(status) if status.code == 410 => {
                tracing::info!(%kind, "watch expired (410 Gone); relisting");
            }
            _ => tracing::warn!(%kind, %error, "watch failed; retrying"),
        }
        true
    }

    /// Logs and counts an object that could not be read.
    fn skip(&self, bad: &Malformed) {
        tracing::warn!(kind = %bad.kind, namespace = %bad.key.namespace, name = %bad.key.name, reason = %bad.reason, "skipping malformed object");
        self.stats.count_malformed(self.kind);
    }

    /// Notes (and logs, once) that the kind has been listed.
    fn first_listing_done(&mut self) {
        if !self.listed {
            self.listed = true;
            tracing::info!(kind = %self.kind, "listed");
        }
    }

    /// Marks the kind as listed and empty without a listing; false once the receiver is gone.
    async fn synced(&mut self) -> bool {
        self.first_listing_done();
        self.send(Change::Synced(self.kind)).await
    }

    /// Sends a change; false once the receiver is gone.
    async fn send(&self, change: Change) -> bool {
        self.tx.send(change).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use kproxy_state::{HEADLESS_LABEL, SERVICE_PROXY_NAME_LABEL};

    use super::*;

    #[test]
    fn default_selector_excludes_upstreams_labels() {
        let terms: Vec<&str> = DEFAULT_LABEL_SELECTOR.split(',').collect();
        assert_eq!(terms, [format!("!{SERVICE_PROXY_NAME_LABEL}"), format!("!{HEADLESS_LABEL}")]);
    }
}
