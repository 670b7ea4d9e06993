//! Watching the four kinds and turning watcher events into [`Change`]s.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::{BoxStream, SelectAll};
use kproxy_state::{Change, Kind, Object, ObjectKey};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::mpsc;

use crate::raw::{RawObject, api_resource, to_object};
use crate::stats::SourceStats;

/// Upstream's informer selector for Services and EndpointSlices: objects that belong to another
/// service proxy, and endpoints of headless services, are not ours.
pub const DEFAULT_LABEL_SELECTOR: &str = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// How long a failed watcher waits before it retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RetryBackoff {
    /// kube-runtime's default, taken from client-go's reflector: 0.8 s doubling up to 30 s, with
    /// jitter, reset after two quiet minutes.
    #[default]
    ClientGo,
    /// A fixed delay (tests).
    Fixed(Duration),
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
}

impl KubeSourceOptions {
    /// Upstream's defaults for the node `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            label_selector: DEFAULT_LABEL_SELECTOR.to_owned(),
            backoff: RetryBackoff::default(),
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

type KindEvent = (Kind, Result<Event<RawObject>, watcher::Error>);

fn watch_kind(
    client: &Client,
    kind: Kind,
    config: watcher::Config,
    backoff: RetryBackoff,
) -> BoxStream<'static, KindEvent> {
    let api: Api<RawObject> = Api::all_with(client.clone(), &api_resource(kind));
    let events = watcher::watcher(api, config);
    let events = match backoff {
        RetryBackoff::ClientGo => events.default_backoff().boxed(),
        RetryBackoff::Fixed(delay) => events.backoff(FixedBackoff(delay)).boxed(),
    };
    events.map(move |event| (kind, event)).boxed()
}

/// Watches Services, EndpointSlices, the own Node and ServiceCIDRs and sends their changes to
/// `tx` until the receiver is dropped.
///
/// Every kind starts with a [`Change::Replaced`] (its initial list) and gets another one after
/// every relist; single changes in between are [`Change::Applied`] / [`Change::Deleted`]. No
/// Service or EndpointSlice change is sent before both kinds have been listed, so a consumer that
/// drains the channel before syncing never sees Services without their endpoints. A cluster
/// without the ServiceCIDR API (404) gets an empty ServiceCIDR listing, logged once; the watcher
/// keeps retrying in case the API appears. Errors are never fatal: the watchers retry with
/// `opts.backoff`, and each error is logged and counted in `stats`.
///
/// A malformed object is skipped, logged and counted, and the consumer's last good version of it
/// stays in place: a relist after the first listing is sent as the difference to what the
/// consumer has (`Applied` for every listed object, `Deleted` for the keys that are gone), and a
/// key whose object could not be read is neither.
pub async fn run(client: Client, opts: KubeSourceOptions, tx: mpsc::Sender<Change>, stats: Arc<SourceStats>) {
    let selected = watcher::Config::default().labels(&opts.label_selector);
    let mut streams: SelectAll<BoxStream<'static, KindEvent>> = SelectAll::new();
    streams.push(watch_kind(&client, Kind::Service, selected.clone(), opts.backoff));
    streams.push(watch_kind(&client, Kind::EndpointSlice, selected, opts.backoff));
    streams.push(watch_kind(&client, Kind::ServiceCidr, watcher::Config::default(), opts.backoff));
    let mut emitter = Emitter::new(tx, stats);
    if opts.node_name.is_empty() {
        tracing::warn!("no node name: not watching the own Node");
        if !emitter.emit(Change::Replaced(Kind::Node, Vec::new())).await {
            return;
        }
    } else {
        let own = watcher::Config::default().fields(&format!("metadata.name={}", opts.node_name));
        streams.push(watch_kind(&client, Kind::Node, own, opts.backoff));
    }
    while let Some((kind, event)) = streams.next().await {
        if !emitter.handle(kind, event).await {
            return;
        }
    }
}

/// Per-kind list buffers, the first-sync gate, and the channel.
struct Emitter {
    tx: mpsc::Sender<Change>,
    stats: Arc<SourceStats>,
    /// Objects of a relist in progress, per kind (indexed like `Kind::ALL`).
    listing: [Option<Vec<Object>>; 4],
    /// Keys of the relist in progress whose objects could not be read.
    unreadable: [Vec<ObjectKey>; 4],
    /// Keys the consumer has, per kind (what a relist is compared with).
    known: [BTreeSet<ObjectKey>; 4],
    /// Kinds listed at least once.
    listed: [bool; 4],
    /// Service and EndpointSlice changes held until both kinds are listed; `None` once released.
    held: Option<Vec<Change>>,
    /// The ServiceCIDR API was found missing (logged once).
    no_service_cidr_api: bool,
}

fn slot(kind: Kind) -> usize {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or_default()
}

impl Emitter {
    fn new(tx: mpsc::Sender<Change>, stats: Arc<SourceStats>) -> Self {
        Self {
            tx,
            stats,
            listing: Default::default(),
            unreadable: Default::default(),
            known: Default::default(),
            listed: [false; 4],
            held: Some(Vec::new()),
            no_service_cidr_api: false,
        }
    }

    /// Handles one watcher event; false once the receiver is gone.
    async fn handle(&mut self, kind: Kind, event: Result<Event<RawObject>, watcher::Error>) -> bool {
        match event {
            Ok(Event::Init) => {
                self.listing[slot(kind)] = Some(Vec::new());
                self.unreadable[slot(kind)].clear();
                true
            }
            Ok(Event::InitApply(raw)) => {
                let key = raw.key();
                match self.convert(kind, raw) {
                    Some(object) => self.listing[slot(kind)].get_or_insert_with(Vec::new).push(object),
                    None => self.unreadable[slot(kind)].push(key),
                }
                true
            }
            Ok(Event::InitDone) => {
                let objects = self.listing[slot(kind)].take().unwrap_or_default();
                let unreadable = std::mem::take(&mut self.unreadable[slot(kind)]);
                tracing::debug!(%kind, objects = objects.len(), unreadable = unreadable.len(), "listed");
                self.stats.count_list(kind);
                if !self.listed[slot(kind)] {
                    return self.emit(Change::Replaced(kind, objects)).await;
                }
                self.emit_relist(kind, objects, &unreadable).await
            }
            Ok(Event::Apply(raw)) => match self.convert(kind, raw) {
                Some(object) => {
                    self.stats.count_event(kind);
                    self.emit(Change::Applied(object)).await
                }
                None => true,
            },
            Ok(Event::Delete(raw)) => {
                let key = raw.key();
                if key.name.is_empty() {
                    tracing::warn!(%kind, "deleted object without a name ignored");
                    self.stats.count_malformed(kind);
                    return true;
                }
                self.stats.count_event(kind);
                self.emit(Change::Deleted(kind, key)).await
            }
            Err(error) => self.on_error(kind, error).await,
        }
    }

    async fn on_error(&mut self, kind: Kind, error: watcher::Error) -> bool {
        self.stats.count_watch_error(kind);
        let not_found =
            matches!(&error, watcher::Error::InitialListFailed(kube::Error::Api(status)) if status.code == 404);
        if kind == Kind::ServiceCidr && not_found {
            if !self.no_service_cidr_api {
                self.no_service_cidr_api = true;
                tracing::info!(
                    "the API server does not serve networking.k8s.io/v1 ServiceCIDRs; treating them as none"
                );
            }
            if !self.listed[slot(kind)] {
                return self.emit(Change::Replaced(kind, Vec::new())).await;
            }
            return true;
        }
        match &error {
            watcher::Error::WatchError(status) if status.code == 410 => {
                tracing::info!(%kind, "watch expired (410 Gone); relisting");
            }
            _ => tracing::warn!(%kind, %error, "watch failed; retrying"),
        }
        true
    }

    fn convert(&self, kind: Kind, raw: RawObject) -> Option<Object> {
        match to_object(kind, raw) {
            Ok(object) => Some(object),
            Err(bad) => {
                tracing::warn!(kind = %bad.kind, namespace = %bad.key.namespace, name = %bad.key.name, reason = %bad.reason, "skipping malformed object");
                self.stats.count_malformed(kind);
                None
            }
        }
    }

    /// A relist, as the difference to what the consumer has: unreadable objects keep their last
    /// good version.
    async fn emit_relist(&mut self, kind: Kind, objects: Vec<Object>, unreadable: &[ObjectKey]) -> bool {
        let listed: BTreeSet<ObjectKey> = objects.iter().map(Object::key).chain(unreadable.iter().cloned()).collect();
        let gone: Vec<ObjectKey> = self.known[slot(kind)].difference(&listed).cloned().collect();
        for object in objects {
            if !self.emit(Change::Applied(object)).await {
                return false;
            }
        }
        for key in gone {
            if !self.emit(Change::Deleted(kind, key)).await {
                return false;
            }
        }
        true
    }

    /// Sends a change, or holds it while the first sync is incomplete; false once the receiver is gone.
    async fn emit(&mut self, change: Change) -> bool {
        let kind = match &change {
            Change::Applied(object) => object.kind(),
            Change::Deleted(kind, _) | Change::Replaced(kind, _) => *kind,
        };
        let known = &mut self.known[slot(kind)];
        match &change {
            Change::Applied(object) => {
                known.insert(object.key());
            }
            Change::Deleted(_, key) => {
                known.remove(key);
            }
            Change::Replaced(_, objects) => *known = objects.iter().map(Object::key).collect(),
        }
        if let Change::Replaced(..) = change {
            self.listed[slot(kind)] = true;
        }
        let gated = matches!(kind, Kind::Service | Kind::EndpointSlice);
        if let (true, Some(held)) = (gated, self.held.as_mut()) {
            held.push(change);
            if !(self.listed[slot(Kind::Service)] && self.listed[slot(Kind::EndpointSlice)]) {
                return true;
            }
            let released = self.held.take().unwrap_or_default();
            tracing::info!("Services and EndpointSlices listed: first sync can start");
            for change in released {
                if self.tx.send(change).await.is_err() {
                    return false;
                }
            }
            return true;
        }
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
