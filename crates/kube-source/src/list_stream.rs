//! List bodies decoded as they arrive, in either encoding (for `watcher.rs`).
//!
//! A `resourceVersion=0` list is answered by kube-apiserver's watch cache in one response,
//! however large. kube-rs's `watcher` reads it with `Api::list`: the whole body as one string,
//! then the whole `ObjectList` decoded, so at 100k Services the text and every object exist at
//! once (about 0.9 GB peak heap). Here the body is read on a blocking thread as it arrives and
//! each item is decoded and handed over as soon as it is read:
//!
//! - JSON: serde_json's streaming deserializer over a reader of the body. A visitor takes the
//!   top-level object's fields one by one; `items` is read one element at a time, each decoded
//!   as every object is (`raw.rs`: a bad one is kept aside with its name, never breaks the list);
//! - protobuf: the list's framing read field by field (`protobuf/list.rs`), each item's message
//!   decoded by [`Decoded::from_protobuf`].
//!
//! Items are handed over through a small bounded channel, in batches of up to [`BATCH`] and
//! whenever the reader would wait for more of the body (so no decoded object waits for bytes
//! that have not come, and the consumer is not woken per object). Only those batches and the
//! reader's buffer of the current item exist besides what the consumer keeps, and a slow
//! consumer slows the reading of the body instead of growing a buffer. `metadata` (the resource
//! version to watch from, a `continue` token) may come before or after `items`.
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
use std::io::{self, Read};
use std::rc::Rc;

use futures::AsyncBufRead;
use futures::FutureExt as _;
use futures::io::AsyncReadExt as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::protobuf;
use crate::raw::{ApiKind, Decoded};
use crate::request::Encoding;

/// Decoded objects are handed over in batches of at most this many, and whenever the reader
/// is about to wait for more of the body (so none waits for bytes that have not come): one
/// wake-up of the consumer per batch, not per object.
const BATCH: usize = 64;

/// How many batches may wait between the body's reader and the consumer.
const AHEAD: usize = 4;

/// What the body's reader hands over.
pub(crate) enum Item<K> {
    Objects(Vec<Decoded<K>>),
    /// The page was read whole: its metadata.
    End(ListMeta),
    /// The body could not be read or is not a list.
    Failed(kube::Error),
}

/// Reads a list body in `encoding` on a blocking thread, handing its items over as they are
/// decoded.
pub(crate) fn read_in_background<K: ApiKind>(
    encoding: Encoding,
    body: impl AsyncBufRead + Send + Unpin + 'static,
) -> mpsc::Receiver<Item<K>> {
    let (tx, rx) = mpsc::channel(AHEAD);
    let handle = Handle::current();
    tokio::task::spawn_blocking(move || {
        let outbox = Rc::new(RefCell::new(Outbox { tx: tx.clone(), batch: Vec::with_capacity(BATCH) }));
        let body = BodyReader { body, handle, outbox: outbox.clone(), dropped: tx.clone() };
        let reader = io::BufReader::with_capacity(64 * 1024, body);
        let item = match encoding {
            Encoding::Json => match read_list(reader, &outbox) {
                Ok(meta) => Item::End(meta),
                Err(error) => Item::Failed(kube::Error::SerdeError(error)),
            },
            Encoding::Protobuf => {
                let read = protobuf::read_list(reader, |raw| {
                    let object = match raw {
                        Ok(raw) => Decoded::from_protobuf(raw),
                        Err(error) => Decoded::unreadable(error.to_string()),
                    };
                    outbox.borrow_mut().push(object)
                });
                match read {
                    Ok(meta) => Item::End(meta),
                    Err(error) => Item::Failed(kube::Error::ReadEvents(error)),
                }
            }
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

    use std::time::Duration;

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
        (chunks, read_in_background(Encoding::Json, rx.into_async_read()))
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
}
