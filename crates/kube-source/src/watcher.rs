//! kproxy's watcher: kube-runtime's `watcher`, step for step, with kproxy's own requests and
//! readers.
//!
//! kube-runtime's `watcher` reads JSON only and whole (a list body is one string, then one
//! `ObjectList`): it can neither speak protobuf nor hand a list over as it arrives, and offers
//! no hook for either (its `ApiMode` is private). So this module makes the same requests with the
//! same parameters, and goes through the same states with the same events and errors, for the
//! three ways of listing ([`Strategy`]):
//!
//! - a streaming list: a watch with `sendInitialEvents=true` (from resource version `0`, as
//!   kube-runtime), whose ADDED events are the listing and whose bookmark annotated
//!   `k8s.io/initial-events-end` ends it; a resumed watch does not ask for initial events;
//! - a watch-cache list (`resourceVersion=0`, no `limit`, answered whole from the watch cache);
//! - a consistent list paged by `limit` and `continue`;
//!
//! then a watch from the listing's resource version. Recovery is kube-runtime's: a `410 Gone`
//! ERROR event starts over with a listing, any other failure of a watch resumes it from the
//! last resource version seen (bookmarks included), a watch silent for longer than its
//! server-side timeout is dropped and resumed; the caller's backoff applies after every error.
//!
//! Requests go through the client (its rate limit layer included) with the Accept header of
//! [`ContentTypes`]; each answer is read in the encoding it came in (`request.rs`). List bodies
//! are decoded on a blocking thread as they arrive (`list_stream.rs`); watch bodies event by
//! event: one JSON event per line, or protobuf frames (`protobuf/watch.rs`).

use std::collections::VecDeque;
use std::time::Duration;

use futures::io::AsyncBufReadExt as _;
use futures::stream::BoxStream;
use futures::{AsyncBufRead, Stream, StreamExt};
use kube::Api;
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::{self, Event};
use tokio::sync::mpsc;

use crate::list_stream::{Item, read_in_background};
use crate::protobuf::{self, MAX_OBJECT_BYTES};
use crate::raw::{ApiKind, Decoded};
use crate::request::{self, ContentTypes, Encoding};
use crate::watch::WatchEvent as SourceEvent;

/// The annotation on the bookmark that ends a streaming list's initial events.
pub(crate) const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// kube-runtime's margin over a watch's server-side timeout before a silent watch is dropped.
const WATCH_IDLE_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// How a listing is fetched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// A watch with `sendInitialEvents=true`.
    Streaming,
    /// `resourceVersion=0`: the whole list from the watch cache.
    WatchCache,
    /// A consistent list, this many objects a page.
    Paginated(u32),
}

/// The events of `api`'s objects, listed by `strategy`, then watched; relisting after `410 Gone`.
pub(crate) fn watcher<K: ApiKind>(
    api: Api<Decoded<K>>,
    config: watcher::Config,
    strategy: Strategy,
    accept: ContentTypes,
) -> impl Stream<Item = SourceEvent<K>> + Send + 'static {
    let lister = Lister { api, config, strategy, accept };
    futures::stream::unfold((lister, State::Empty), |(lister, state)| async move {
        let (event, state) = lister.step(state).await;
        Some((event, (lister, state)))
    })
}

type Events<K> = BoxStream<'static, kube::Result<WatchEvent<Decoded<K>>>>;

struct Lister<K: ApiKind> {
    api: Api<Decoded<K>>,
    config: watcher::Config,
    strategy: Strategy,
    accept: ContentTypes,
}

enum State<K: ApiKind> {
    /// The next step starts a listing.
    Empty,
    /// Listing began; the next step requests this page (`continue` token).
    Requesting {
        continue_token: Option<String>,
    },
    /// A page's objects are arriving; `ready`: the rest of the last batch.
    Listing {
        items: mpsc::Receiver<Item<K>>,
        ready: VecDeque<Decoded<K>>,
    },
    /// A streaming list's initial events are arriving.
    InitialWatch {
        stream: Events<K>,
    },
    /// Listed at this resource version; the next step starts a watch from it.
    Listed {
        resource_version: String,
    },
    Watching {
        resource_version: String,
        stream: Events<K>,
    },
}

impl<K: ApiKind> Lister<K> {
    /// One step: an event, and the state after it.
    async fn step(&self, mut state: State<K>) -> (SourceEvent<K>, State<K>) {
        loop {
            match self.step_once(state).await {
                (Some(event), next) => return (event, next),
                (None, next) => state = next,
            }
        }
    }

    async fn step_once(&self, state: State<K>) -> (Option<SourceEvent<K>>, State<K>) {
        match state {
            State::Empty if self.strategy == Strategy::Streaming => match self.watch("0", true).await {
                Ok(stream) => (Some(Ok(Event::Init)), State::InitialWatch { stream }),
                Err(error) => (Some(Err(watcher::Error::WatchStartFailed(error))), State::Empty),
            },
            State::Empty => (Some(Ok(Event::Init)), State::Requesting { continue_token: None }),
            State::Requesting { continue_token } => match self.list(continue_token).await {
                Ok(items) => (None, State::Listing { items, ready: VecDeque::new() }),
                Err(error) => (Some(Err(watcher::Error::InitialListFailed(error))), State::Empty),
            },
            State::Listing { items, mut ready } if !ready.is_empty() => {
                let object = ready.pop_front().map(Event::InitApply).map(Ok);
                (object, State::Listing { items, ready })
            }
            State::Listing { mut items, .. } => match items.recv().await {
                Some(Item::Objects(batch)) => (None, State::Listing { items, ready: batch.into() }),
                Some(Item::End(meta)) => {
                    let continue_token = meta.continue_.filter(|token| !token.is_empty());
                    let resource_version = meta.resource_version.filter(|rv| !rv.is_empty());
                    match (continue_token, resource_version) {
                        (Some(token), _) => (None, State::Requesting { continue_token: Some(token) }),
                        (None, Some(resource_version)) => {
                            (Some(Ok(Event::InitDone)), State::Listed { resource_version })
                        }
                        (None, None) => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
                    }
                }
                Some(Item::Failed(error)) => (Some(Err(watcher::Error::InitialListFailed(error))), State::Empty),
                None => {
                    let error = kube::Error::Service("the list's reader stopped".into());
                    (Some(Err(watcher::Error::InitialListFailed(error))), State::Empty)
                }
            },
            State::InitialWatch { mut stream } => match next_or_idle(&mut stream, self.config.timeout).await {
                Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                    (Some(Ok(Event::InitApply(object))), State::InitialWatch { stream })
                }
                Some(Ok(WatchEvent::Deleted(_))) => {
                    // The API server never sends one before the bookmark (kube-runtime drops it too).
                    tracing::error!(kind = %K::KIND, "a DELETED event among a streaming list's initial events; ignored");
                    (None, State::InitialWatch { stream })
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    if bookmark.metadata.annotations.contains_key(INITIAL_EVENTS_END_ANNOTATION) {
                        let resource_version = bookmark.metadata.resource_version;
                        (Some(Ok(Event::InitDone)), State::Watching { resource_version, stream })
                    } else {
                        (None, State::InitialWatch { stream })
                    }
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    let next = if status.code == 410 { State::Empty } else { State::InitialWatch { stream } };
                    (Some(Err(watcher::Error::WatchError(status))), next)
                }
                Some(Err(error)) => (Some(Err(watcher::Error::WatchFailed(error))), State::InitialWatch { stream }),
                None => (None, State::Empty),
            },
            State::Listed { resource_version } => match self.watch(&resource_version, false).await {
                Ok(stream) => (None, State::Watching { resource_version, stream }),
                Err(error) => (Some(Err(watcher::Error::WatchStartFailed(error))), State::Listed { resource_version }),
            },
            State::Watching { resource_version, mut stream } => match next_or_idle(&mut stream, self.config.timeout)
                .await
            {
                Some(Ok(WatchEvent::Added(object) | WatchEvent::Modified(object))) => {
                    match kube::Resource::meta(&object).resource_version.clone().filter(|rv| !rv.is_empty()) {
                        Some(resource_version) => {
                            (Some(Ok(Event::Apply(object))), State::Watching { resource_version, stream })
                        }
                        None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
                    }
                }
                Some(Ok(WatchEvent::Deleted(object))) => {
                    match kube::Resource::meta(&object).resource_version.clone().filter(|rv| !rv.is_empty()) {
                        Some(resource_version) => {
                            (Some(Ok(Event::Delete(object))), State::Watching { resource_version, stream })
                        }
                        None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
                    }
                }
                Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                    (None, State::Watching { resource_version: bookmark.metadata.resource_version, stream })
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    // 410 Gone: the resource version is compacted away; list again.
                    let next =
                        if status.code == 410 { State::Empty } else { State::Watching { resource_version, stream } };
                    (Some(Err(watcher::Error::WatchError(status))), next)
                }
                Some(Err(error)) => {
                    (Some(Err(watcher::Error::WatchFailed(error))), State::Watching { resource_version, stream })
                }
                None => (None, State::Listed { resource_version }),
            },
        }
    }

    /// kube-runtime's list parameters: a watch-cache list (`resourceVersion=0`, no `limit`: the
    /// watch cache would ignore it; a `continue` token, which the watch cache never sends, asks
    /// for the next page of the list it began), or a consistent list of pages of `limit`.
    fn list_params(&self, continue_token: Option<String>) -> ListParams {
        let (resource_version, version_match, limit) = match (self.strategy, &continue_token) {
            (Strategy::Paginated(size), _) => (None, None, Some(size)),
            (_, Some(_)) => (None, None, None),
            (_, None) => (Some("0".to_owned()), Some(VersionMatch::NotOlderThan), None),
        };
        ListParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            resource_version,
            version_match,
            limit,
            continue_token,
            ..ListParams::default()
        }
    }

    /// kube-runtime's watch parameters; `initial`: a streaming list's first watch.
    fn watch_params(&self, initial: bool) -> WatchParams {
        WatchParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            timeout: self.config.timeout,
            bookmarks: self.config.bookmarks,
            send_initial_events: initial,
        }
    }

    /// Sends the list request; its objects as they are decoded, once the server has answered
    /// with success.
    async fn list(&self, continue_token: Option<String>) -> kube::Result<mpsc::Receiver<Item<K>>> {
        let request = kube::core::Request::new(self.api.resource_url())
            .list(&self.list_params(continue_token))
            .map_err(kube::Error::BuildRequest)?;
        let (encoding, body) = request::send(&self.client(), request, &self.accept).await?;
        Ok(read_in_background(encoding, body))
    }

    /// Starts a watch from `resource_version`.
    async fn watch(&self, resource_version: &str, initial: bool) -> kube::Result<Events<K>> {
        let request = kube::core::Request::new(self.api.resource_url())
            .watch(&self.watch_params(initial), resource_version)
            .map_err(kube::Error::BuildRequest)?;
        let (encoding, body) = request::send(&self.client(), request, &self.accept).await?;
        Ok(match encoding {
            Encoding::Json => json_events(body).boxed(),
            Encoding::Protobuf => protobuf::events(body).boxed(),
        })
    }

    fn client(&self) -> kube::Client {
        self.api.clone().into_client()
    }
}

/// The events of a JSON watch body, one per line, read as kube-rs reads them (a line that is a
/// `Status` is that error; the stream ends at a line left unfinished), each at most
/// [`MAX_OBJECT_BYTES`] long (client-go's bound, as for protobuf frames).
pub(crate) fn json_events<K: ApiKind>(
    body: impl AsyncBufRead + Unpin + Send + 'static,
) -> impl Stream<Item = kube::Result<WatchEvent<Decoded<K>>>> + Send + 'static {
    futures::stream::unfold(Some(body), |body| async move {
        let mut body = body?;
        let mut line = Vec::new();
        let read =
            futures::io::AsyncReadExt::take(&mut body, MAX_OBJECT_BYTES as u64 + 1).read_until(b'\n', &mut line).await;
        match read {
            Ok(0) => None,
            Ok(_) if !line.ends_with(b"\n") && line.len() > MAX_OBJECT_BYTES => {
                let error = protobuf::DecodeError::TooLarge { what: "a watch event line", len: line.len() as u64 };
                let error = std::io::Error::new(std::io::ErrorKind::InvalidData, error);
                Some((Err(kube::Error::ReadEvents(error)), None))
            }
            Ok(_) => match serde_json::from_slice::<WatchEvent<Decoded<K>>>(&line) {
                Ok(event) => Some((Ok(event), Some(body))),
                // An unfinished last line: the connection broke (resumable).
                Err(e) if e.is_eof() => None,
                Err(e) => match serde_json::from_slice::<Status>(&line) {
                    Ok(status) => Some((Err(kube::Error::Api(Box::new(status))), Some(body))),
                    Err(_) => Some((Err(kube::Error::SerdeError(e)), Some(body))),
                },
            },
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => None,
            Err(e) => Some((Err(kube::Error::ReadEvents(e)), None)),
        }
    })
}

/// The next event of a watch; `None` when it ends or says nothing for longer than its
/// server-side timeout (kube-runtime's idle timeout: 290 s when none is set).
async fn next_or_idle<S: Stream + Unpin>(stream: &mut S, timeout: Option<u32>) -> Option<S::Item> {
    if timeout == Some(0) {
        return stream.next().await;
    }
    let idle = Duration::from_secs(u64::from(timeout.unwrap_or(290))) + WATCH_IDLE_TIMEOUT_MARGIN;
    tokio::time::timeout(idle, stream.next()).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;

    use super::*;

    fn lister(strategy: Strategy) -> Lister<Service> {
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let config = watcher::Config::default().labels("a=b").fields("metadata.name=n").timeout(30);
        Lister { api: Api::all(client), config, strategy, accept: ContentTypes::default() }
    }

    #[tokio::test]
    async fn lists_ask_as_kube_runtime_does_and_watches_follow_the_config() {
        let lister = lister(Strategy::WatchCache);
        let first = lister.list_params(None);
        assert_eq!(first.resource_version.as_deref(), Some("0"));
        assert_eq!(first.version_match, Some(VersionMatch::NotOlderThan));
        assert_eq!(first.limit, None, "kube-rs would drop resourceVersion=0 from a request with a limit");
        assert_eq!(
            (first.label_selector.as_deref(), first.field_selector.as_deref()),
            (Some("a=b"), Some("metadata.name=n"))
        );
        let next = lister.list_params(Some("token".into()));
        assert_eq!((next.resource_version, next.continue_token.as_deref()), (None, Some("token")));
        let paged = self::lister(Strategy::Paginated(500));
        let page = paged.list_params(Some("token".into()));
        assert_eq!(
            (page.resource_version, page.limit, page.continue_token.as_deref()),
            (None, Some(500), Some("token"))
        );
        assert_eq!(paged.list_params(None).resource_version, None, "a consistent list");
        let watch = lister.watch_params(false);
        assert_eq!((watch.label_selector.as_deref(), watch.timeout, watch.bookmarks), (Some("a=b"), Some(30), true));
        assert!(!watch.send_initial_events);
        assert!(lister.watch_params(true).send_initial_events, "a streaming list's first watch");
    }

    #[tokio::test]
    async fn json_watch_lines_are_events_and_a_status_line_is_an_error() {
        let body = concat!(
            r#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"p","resourceVersion":"5"}}}"#,
            "\n",
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"boom","reason":"InternalError","code":500}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{"kind":"Service","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#,
            "\n",
            r#"{"type":"ADDED","object":{"meta"#,
        );
        let events: Vec<_> = json_events::<Service>(futures::io::Cursor::new(body.as_bytes().to_vec())).collect().await;
        assert_eq!(events.len(), 3, "the unfinished last line ends the stream");
        assert!(matches!(&events[0], Ok(WatchEvent::Added(o)) if kube::Resource::meta(o).name.as_deref() == Some("a")));
        assert!(matches!(&events[1], Err(kube::Error::Api(s)) if s.code == 500));
        assert!(matches!(&events[2], Ok(WatchEvent::Bookmark(b)) if b.metadata.resource_version == "9"));
    }
}
