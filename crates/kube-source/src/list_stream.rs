//! Watch-cache lists decoded as their body arrives, then a watch from the list's resource
//! version ([`ListMode::WatchCache`](crate::ListMode::WatchCache), and the fallback of a
//! streaming list).
//!
//! A `resourceVersion=0` list is answered by kube-apiserver's watch cache in one response,
//! however large. kube-rs's `watcher` reads it with `Api::list`: the whole body as one string,
//! then the whole `ObjectList` decoded, so at 100k Services the text and every object exist at
//! once (about 0.9 GB peak heap). `watcher` offers no hook for the list step (its `ApiMode` is
//! private), and it cannot be started from a resource version either (it always lists first).
//! So this module makes its own list request and runs its own watch from the list's
//! `metadata.resourceVersion`, step for step as kube-runtime's `watcher` does (same requests
//! and parameters, same events and errors, same recovery: a `410 Gone` relists, any other
//! failure of a watch resumes it from the last resource version seen, bookmarks included; the
//! caller's backoff applies after every error).
//!
//! The list: the request goes through the client (its rate limit layer included) and its body
//! is read on a blocking thread by serde_json's streaming deserializer over a reader of the
//! body. A visitor takes the top-level object's fields one by one; `items` is read one element
//! at a time, each decoded as every object is (`raw.rs`: a bad one is kept aside with its name,
//! never breaks the list) and handed over through a small bounded channel, in batches of up to
//! [`BATCH`] and whenever the reader would wait for more of the body (so no decoded object waits
//! for bytes that have not come, and the consumer is not woken per object). Only those batches
//! and serde_json's buffer of the current item exist besides what the consumer keeps, and a
//! slow consumer slows the reading of the body instead of growing a buffer. `metadata` (the
//! resource version to watch from, a `continue` token) may come before or after `items`.
//!
//! Why serde_json's reader and not a splitter of the items' text written here: JSON's strings,
//! escapes and nesting are serde_json's to get right, and a hand-written scanner would be one
//! more parser to trust with every object. The price: serde_json reads an `io::Read` byte by
//! byte and copies each item's text once more: about 1.4 s more user CPU at 100k Services and
//! 100k slices than kube-rs's whole-body decode, which spends as much more in the kernel
//! faulting in its 1.4 GB (docs/benchmarks.md): the same CPU in all, for 0.8 GB less memory.
//!
//! The body reader waits for the next bytes or for the list to be dropped (a relist that
//! replaces it, the source stopped), so a dropped list never leaves a thread waiting on a body
//! that does not come.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, Read};
use std::rc::Rc;
use std::time::Duration;

use futures::FutureExt as _;
use futures::io::AsyncReadExt as _;
use futures::{AsyncBufRead, Stream, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::Api;
use kube::api::{ListParams, VersionMatch, WatchEvent, WatchParams};
use kube::runtime::watcher::{self, Event};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::raw::{ApiKind, Decoded};
use crate::watch::WatchEvent as SourceEvent;

/// Decoded objects are handed over in batches of at most this many, and whenever the reader
/// is about to wait for more of the body (so none waits for bytes that have not come): one
/// wake-up of the consumer per batch, not per object.
const BATCH: usize = 64;

/// How many batches may wait between the body's reader and the consumer.
const AHEAD: usize = 4;

/// kube-runtime's margin over a watch's server-side timeout before a silent watch is dropped.
const WATCH_IDLE_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// The events of `api`'s objects: a watch-cache list decoded as it arrives, then a watch from
/// its resource version; relisting after `410 Gone` (see the module documentation).
pub(crate) fn list_watch<K: ApiKind>(
    api: Api<Decoded<K>>,
    config: watcher::Config,
) -> impl Stream<Item = SourceEvent<K>> + Send + 'static {
    let lister = Lister { api, config };
    futures::stream::unfold((lister, State::Empty), |(lister, state)| async move {
        let (event, state) = lister.step(state).await;
        Some((event, (lister, state)))
    })
}

struct Lister<K: ApiKind> {
    api: Api<Decoded<K>>,
    config: watcher::Config,
}

enum State<K: ApiKind> {
    /// The next step starts a listing.
    Empty,
    /// Listing began; the next step requests this page (`continue` token).
    Requesting { continue_token: Option<String> },
    /// A page's objects are arriving; `ready`: the rest of the last batch.
    Listing { items: mpsc::Receiver<Item<K>>, ready: VecDeque<Decoded<K>> },
    /// Listed at this resource version; the next step starts a watch from it.
    Listed { resource_version: String },
    Watching {
        resource_version: String,
        stream: futures::stream::BoxStream<'static, kube::Result<WatchEvent<Decoded<K>>>>,
    },
}

/// What the body's reader hands over.
enum Item<K> {
    Objects(Vec<Decoded<K>>),
    /// The page was read whole: its metadata.
    End(ListMeta),
    /// The body could not be read or is not a list.
    Failed(kube::Error),
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
            State::Empty => (Some(Ok(Event::Init)), State::Requesting { continue_token: None }),
            State::Requesting { continue_token } => match self.request(continue_token).await {
                Ok(body) => (None, State::Listing { items: read_in_background(body), ready: VecDeque::new() }),
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
            State::Listed { resource_version } => match self.api.watch(&self.watch_params(), &resource_version).await {
                Ok(stream) => (None, State::Watching { resource_version, stream: stream.boxed() }),
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

    /// kube-runtime's list parameters for [`watcher::ListSemantic::Any`] without a page size:
    /// `resourceVersion=0`, served from the watch cache; a `continue` token (which the watch
    /// cache never sends) asks for the next page of the list it began.
    fn list_params(&self, continue_token: Option<String>) -> ListParams {
        let (resource_version, version_match) = match continue_token {
            Some(_) => (None, None),
            None => (Some("0".to_owned()), Some(VersionMatch::NotOlderThan)),
        };
        ListParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            resource_version,
            version_match,
            limit: None,
            continue_token,
            ..ListParams::default()
        }
    }

    /// kube-runtime's parameters of a watch that follows a list.
    fn watch_params(&self) -> WatchParams {
        WatchParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            timeout: self.config.timeout,
            bookmarks: self.config.bookmarks,
            send_initial_events: false,
        }
    }

    /// Sends the list request; its body, once the server has answered with success.
    async fn request(
        &self,
        continue_token: Option<String>,
    ) -> kube::Result<impl AsyncBufRead + Send + Unpin + 'static> {
        let request = kube::core::Request::new(self.api.resource_url())
            .list(&self.list_params(continue_token))
            .map_err(kube::Error::BuildRequest)?;
        let body = self.api.clone().into_client().request_stream(request).await?;
        Ok(Box::pin(body))
    }
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

/// Reads a list body on a blocking thread, handing its items over as they are decoded.
fn read_in_background<K: ApiKind>(body: impl AsyncBufRead + Send + Unpin + 'static) -> mpsc::Receiver<Item<K>> {
    let (tx, rx) = mpsc::channel(AHEAD);
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || {
        let outbox = Rc::new(RefCell::new(Outbox { tx: tx.clone(), batch: Vec::with_capacity(BATCH) }));
        let body = BodyReader { body, handle, outbox: outbox.clone(), dropped: tx.clone() };
        let reader = io::BufReader::with_capacity(64 * 1024, body);
        let item = match read_list(reader, &outbox) {
            Ok(meta) => Item::End(meta),
            Err(error) => Item::Failed(kube::Error::SerdeError(error)),
        };
        // Nothing to do when the list was dropped meanwhile.
        if outbox.borrow_mut().flush() {
            let _ = tx.blocking_send(item);
        }
    });
    rx
}

/// Reads one list from `reader`, handing each item to `outbox` as it is decoded; the list's
/// metadata.
fn read_list<K: ApiKind>(reader: impl Read, outbox: &Rc<RefCell<Outbox<K>>>) -> serde_json::Result<ListMeta> {
    let mut deserializer = serde_json::Deserializer::from_reader(reader);
    let meta = ListSeed { outbox }.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(meta)
}

/// The batch being filled, and where it goes.
struct Outbox<K> {
    tx: mpsc::Sender<Item<K>>,
    batch: Vec<Decoded<K>>,
}

impl<K> Outbox<K> {
    /// Adds an object, sending the batch when it is full; false once the list was dropped.
    fn push(&mut self, object: Decoded<K>) -> bool {
        self.batch.push(object);
        self.batch.len() < BATCH || self.flush()
    }

    /// Sends the batch (waiting while [`AHEAD`] batches wait); false once the list was dropped.
    fn flush(&mut self) -> bool {
        if self.batch.is_empty() {
            return true;
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        self.tx.blocking_send(Item::Objects(batch)).is_ok()
    }
}

/// A sync reader of the body, for serde_json. When the next bytes are not there yet, it hands
/// the objects decoded so far over, then waits on the runtime for the bytes, or for the list's
/// receiver to be dropped.
struct BodyReader<R, K> {
    body: R,
    handle: Handle,
    outbox: Rc<RefCell<Outbox<K>>>,
    dropped: mpsc::Sender<Item<K>>,
}

impl<R: AsyncBufRead + Unpin, K> Read for BodyReader<R, K> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Self { body, handle, outbox, dropped } = self;
        if let Some(read) = body.read(buf).now_or_never() {
            return read;
        }
        if !outbox.borrow_mut().flush() {
            return Err(io::Error::other("the list was dropped"));
        }
        handle.block_on(async {
            tokio::select! {
                read = body.read(buf) => read,
                () = dropped.closed() => Err(io::Error::other("the list was dropped")),
            }
        })
    }
}

/// The top-level list object: `metadata` kept, each of `items` sent, the rest skipped.
struct ListSeed<'a, K> {
    outbox: &'a Rc<RefCell<Outbox<K>>>,
}

impl<'de, K: ApiKind> DeserializeSeed<'de> for ListSeed<'_, K> {
    type Value = ListMeta;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<ListMeta, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, K: ApiKind> Visitor<'de> for ListSeed<'_, K> {
    type Value = ListMeta;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a list of {} objects", K::KIND)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ListMeta, A::Error> {
        let mut meta = None;
        let mut items = false;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" => meta = Some(map.next_value::<ListMeta>()?),
                "items" => {
                    map.next_value_seed(ItemsSeed { outbox: self.outbox })?;
                    items = true;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !items {
            return Err(de::Error::missing_field("items"));
        }
        Ok(meta.unwrap_or_default())
    }
}

/// A list's `items`, each decoded and sent as soon as it is read (`null`: none).
struct ItemsSeed<'a, K> {
    outbox: &'a Rc<RefCell<Outbox<K>>>,
}

impl<'de, K: ApiKind> DeserializeSeed<'de> for ItemsSeed<'_, K> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, K: ApiKind> Visitor<'de> for ItemsSeed<'_, K> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an array of {} objects", K::KIND)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(object) = seq.next_element::<Decoded<K>>()? {
            if !self.outbox.borrow_mut().push(object) {
                return Err(de::Error::custom("the list was dropped"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt as _;
    use k8s_openapi::api::core::v1::Service;
    use kproxy_state::ObjectKey;
    use serde_json::json;

    use super::*;

    const PATIENCE: Duration = Duration::from_secs(10);

    fn service(name: &str) -> String {
        json!({"metadata": {"namespace": "prod", "name": name, "resourceVersion": "5"},
               "spec": {"clusterIP": "198.18.0.1", "ports": [{"port": 80, "protocol": "TCP"}]}})
        .to_string()
    }

    type Chunks = futures::channel::mpsc::UnboundedSender<io::Result<Vec<u8>>>;

    /// A list body fed by the test, and the items read from it.
    fn body() -> (Chunks, mpsc::Receiver<Item<Service>>) {
        let (chunks, rx) = futures::channel::mpsc::unbounded();
        (chunks, read_in_background(rx.into_async_read()))
    }

    fn send(chunks: &Chunks, text: &str) {
        chunks.unbounded_send(Ok(text.as_bytes().to_vec())).unwrap();
    }

    async fn next(items: &mut mpsc::Receiver<Item<Service>>) -> Item<Service> {
        tokio::time::timeout(PATIENCE, items.recv()).await.expect("an item in time").expect("the reader stopped")
    }

    /// The objects of the next batch: each one's key, or the key of a bad one.
    fn objects(item: Item<Service>) -> Vec<Result<String, ObjectKey>> {
        match item {
            Item::Objects(batch) => batch
                .into_iter()
                .map(|decoded| decoded.into_result().map(|o| o.key().to_string()).map_err(|bad| bad.key))
                .collect(),
            Item::End(_) => panic!("the end of the list, not objects"),
            Item::Failed(error) => panic!("failed: {error}"),
        }
    }

    #[tokio::test]
    async fn items_are_handed_over_one_by_one_before_the_body_ends() {
        let (chunks, mut items) = body();
        send(&chunks, &format!(r#"{{"kind":"ServiceList","apiVersion":"v1","items":[{},"#, service("a")));
        // The rest of the body has not been written: the first item is out already.
        assert_eq!(objects(next(&mut items).await), [Ok("prod/a".to_owned())]);
        assert!(items.try_recv().is_err(), "nothing more before more of the body");
        // The metadata may come after the items.
        send(&chunks, &format!(r#"{}],"metadata":{{"resourceVersion":"42"}}}}"#, service("b")));
        drop(chunks);
        assert_eq!(objects(next(&mut items).await), [Ok("prod/b".to_owned())]);
        match next(&mut items).await {
            Item::End(meta) => assert_eq!(meta.resource_version.as_deref(), Some("42")),
            _ => panic!("expected the end of the list"),
        }
    }

    #[tokio::test]
    async fn a_body_that_is_all_there_is_handed_over_in_full_batches() {
        let (chunks, mut items) = body();
        let list: Vec<String> = (0..150).map(|i| service(&format!("s{i:03}"))).collect();
        send(&chunks, &format!(r#"{{"metadata":{{"resourceVersion":"7"}},"items":[{}]}}"#, list.join(",")));
        drop(chunks);
        let mut sizes = Vec::new();
        let mut names = Vec::new();
        loop {
            match next(&mut items).await {
                Item::End(_) => break,
                batch => {
                    let batch = objects(batch);
                    sizes.push(batch.len());
                    names.extend(batch.into_iter().map(Result::unwrap));
                }
            }
        }
        assert_eq!(sizes, [BATCH, BATCH, 150 - 2 * BATCH]);
        assert_eq!(names, (0..150).map(|i| format!("prod/s{i:03}")).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_malformed_item_is_handed_over_with_its_name_between_the_others() {
        let (chunks, mut items) = body();
        let bad = r#"{"metadata":{"namespace":"prod","name":"b"},"spec":{"ports":"eighty"}}"#;
        let list =
            format!(r#"{{"metadata":{{"resourceVersion":"7"}},"items":[{},{bad},{}]}}"#, service("a"), service("c"));
        send(&chunks, &list);
        drop(chunks);
        let batch = objects(next(&mut items).await);
        assert_eq!(batch, [Ok("prod/a".to_owned()), Err(ObjectKey::new("prod", "b")), Ok("prod/c".to_owned())]);
        assert!(matches!(next(&mut items).await, Item::End(_)));
    }

    #[tokio::test]
    async fn a_body_that_is_not_a_whole_list_fails_the_list() {
        for body_text in [
            r#"{"kind":"Status","code":500}"#.to_owned(),
            format!(r#"{{"metadata":{{"resourceVersion":"7"}},"items":[{},{{"metad"#, service("a")),
            "not json".to_owned(),
        ] {
            let (chunks, mut items) = body();
            send(&chunks, &body_text);
            drop(chunks);
            let item = loop {
                match next(&mut items).await {
                    Item::Objects(_) => {}
                    other => break other,
                }
            };
            assert!(matches!(item, Item::Failed(kube::Error::SerdeError(_))), "{body_text}");
        }
    }

    #[tokio::test]
    async fn a_dropped_list_stops_its_reader_while_the_body_is_still_open() {
        let (chunks, items) = body();
        send(&chunks, r#"{"items":["#);
        drop(items);
        // The reader ends without more of the body: the sender of the chunks sees it gone.
        tokio::time::timeout(PATIENCE, async {
            while !chunks.is_closed() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the reader let go of the body");
    }

    #[tokio::test]
    async fn lists_ask_the_watch_cache_without_a_limit_and_watches_follow_the_config() {
        let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let config = watcher::Config::default().labels("a=b").fields("metadata.name=n").timeout(30);
        let lister = Lister::<Service> { api: Api::all(client), config };
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
        let watch = lister.watch_params();
        assert_eq!((watch.label_selector.as_deref(), watch.timeout, watch.bookmarks), (Some("a=b"), Some(30), true));
        assert!(!watch.send_initial_events);
    }
}
