//! The fake API server's storage: objects, one global resource version, and the event history
//! watches resume from (like etcd behind a real API server).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use kproxy_state::{Kind, ObjectKey};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::StreamingLists;
use super::selector::Filter;

/// Where a kind is served and how it is spelled.
pub(crate) struct KindInfo {
    pub(crate) api_version: &'static str,
    pub(crate) kind: &'static str,
    /// `/api/v1` or `/apis/<group>/<version>`.
    pub(crate) prefix: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) namespaced: bool,
}

pub(crate) fn info(kind: Kind) -> KindInfo {
    match kind {
        Kind::Service => {
            KindInfo { api_version: "v1", kind: "Service", prefix: "/api/v1", plural: "services", namespaced: true }
        }
        Kind::EndpointSlice => KindInfo {
            api_version: "discovery.k8s.io/v1",
            kind: "EndpointSlice",
            prefix: "/apis/discovery.k8s.io/v1",
            plural: "endpointslices",
            namespaced: true,
        },
        Kind::Node => {
            KindInfo { api_version: "v1", kind: "Node", prefix: "/api/v1", plural: "nodes", namespaced: false }
        }
        Kind::ServiceCidr => KindInfo {
            api_version: "networking.k8s.io/v1",
            kind: "ServiceCIDR",
            prefix: "/apis/networking.k8s.io/v1",
            plural: "servicecidrs",
            namespaced: false,
        },
    }
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Added,
    Modified,
    Deleted,
}

/// One entry of the history.
#[derive(Debug)]
pub(crate) struct Record {
    pub(crate) rv: u64,
    pub(crate) kind: Kind,
    pub(crate) op: Op,
    /// The version before the change (for selector transitions).
    pub(crate) old: Option<Arc<Value>>,
    /// The version after the change (the last version for a delete).
    pub(crate) new: Arc<Value>,
}

/// What open watches are told.
#[derive(Debug, Clone)]
pub(crate) enum Signal {
    Change(Arc<Record>),
    Bookmark(u64),
    Expire,
}

/// What a watcher with these selectors sees of a record, as a watch event type and object.
pub(crate) fn visible(record: &Record, filter: &Filter) -> Option<(&'static str, Arc<Value>)> {
    let before = record.old.as_ref().is_some_and(|v| filter.matches(v));
    let after = record.op != Op::Deleted && filter.matches(&record.new);
    let kind = match (record.op, before, after) {
        (Op::Deleted, true, _) | (_, true, false) => "DELETED",
        (Op::Deleted, false, _) | (_, false, false) => return None,
        (_, true, true) => "MODIFIED",
        (_, false, true) => "ADDED",
    };
    Some((kind, record.new.clone()))
}

/// A watch event line.
///
/// `type` comes first, as kube-apiserver writes it (Go's field order). It matters: a client
/// decodes the object straight away when it knows the type, and buffers it first otherwise.
pub(crate) fn event_line(kind: &str, object: &Value) -> String {
    let mut line = format!("{{\"type\":{},\"object\":", Value::from(kind));
    line.push_str(&object.to_string());
    line.push_str("}\n");
    line
}

/// The `Status` a real API server sends for an expired resource version.
pub(crate) fn expired(message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": "Expired", "code": 410})
}

/// The mutable state behind the server. Objects are shared (`Arc`) between the current state,
/// the history and the lists and watches being served, so a large cluster is held once.
#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) rv: u64,
    objects: BTreeMap<Kind, BTreeMap<ObjectKey, Arc<Value>>>,
    history: Vec<Arc<Record>>,
    /// Watches from a resource version below this get `410 Gone`.
    pub(crate) compacted: u64,
    pub(crate) unserved: BTreeSet<Kind>,
    /// Kinds answered with `403 Forbidden` (the client's RBAC role lacks them).
    pub(crate) forbidden: BTreeSet<Kind>,
    pub(crate) list_delay: BTreeMap<Kind, Duration>,
    /// Kinds whose lists (streaming lists included) wait until released.
    pub(crate) held_lists: BTreeSet<Kind>,
    pub(crate) event_delay: Duration,
    pub(crate) lists: BTreeMap<Kind, usize>,
    /// List bodies written in full, per kind.
    pub(crate) lists_sent: BTreeMap<Kind, usize>,
    /// Successful list and watch answers, in protobuf and in JSON.
    pub(crate) answers: [usize; 2],
    /// When not zero, list bodies are written item by item, this long before each.
    pub(crate) list_item_delay: Duration,
    pub(crate) watches: BTreeMap<Kind, usize>,
    /// Watches that asked for `sendInitialEvents=true`, per kind.
    pub(crate) initial_event_streams: BTreeMap<Kind, usize>,
    /// Bookmarks ending a streaming list's initial events that were written, per kind.
    pub(crate) initial_events_ends: BTreeMap<Kind, usize>,
    /// How watches with `sendInitialEvents=true` are answered.
    pub(crate) streaming_lists: StreamingLists,
    /// Watch requests with `sendInitialEvents=true`, per kind, whatever the answer.
    pub(crate) streaming_list_requests: BTreeMap<Kind, usize>,
    pub(crate) signals: broadcast::Sender<Signal>,
}

impl Store {
    pub(crate) fn new() -> Self {
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            history: Vec::new(),
            compacted: 0,
            unserved: BTreeSet::new(),
            forbidden: BTreeSet::new(),
            list_delay: BTreeMap::new(),
            held_lists: BTreeSet::new(),
            event_delay: Duration::ZERO,
            lists: BTreeMap::new(),
            lists_sent: BTreeMap::new(),
            answers: [0; 2],
            list_item_delay: Duration::ZERO,
            watches: BTreeMap::new(),
            initial_event_streams: BTreeMap::new(),
            initial_events_ends: BTreeMap::new(),
            streaming_lists: StreamingLists::Served,
            streaming_list_requests: BTreeMap::new(),
            signals: broadcast::channel(4096).0,
        }
    }

    /// Stores `object` (adding `kind`, `apiVersion` and a new `resourceVersion`); returns that version.
    pub(crate) fn apply(&mut self, kind: Kind, mut object: Value) -> u64 {
        self.rv += 1;
        let info = info(kind);
        if let Some(map) = object.as_object_mut() {
            map.insert("apiVersion".into(), info.api_version.into());
            map.insert("kind".into(), info.kind.into());
            let meta = map.entry("metadata").or_insert_with(|| json!({}));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert("resourceVersion".into(), self.rv.to_string().into());
            }
        }
        let key = key_of(&object);
        let object = Arc::new(object);
        let old = self.objects.entry(kind).or_default().insert(key, object.clone());
        let op = if old.is_some() { Op::Modified } else { Op::Added };
        self.record(Record { rv: self.rv, kind, op, old, new: object });
        self.rv
    }

    /// Deletes an object; returns the resource version of the deletion, if it existed.
    pub(crate) fn delete(&mut self, kind: Kind, key: &ObjectKey) -> Option<u64> {
        let old = self.objects.get_mut(&kind)?.remove(key)?;
        self.rv += 1;
        let mut last = Value::clone(&old);
        if let Some(meta) = last.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), self.rv.to_string().into());
        }
        self.record(Record { rv: self.rv, kind, op: Op::Deleted, old: Some(old), new: Arc::new(last) });
        Some(self.rv)
    }

    fn record(&mut self, record: Record) {
        let record = Arc::new(record);
        self.history.push(record.clone());
        // No receiver is not an error: nobody is watching.
        let _ = self.signals.send(Signal::Change(record));
    }

    /// Forgets the history: watches from an older resource version get `410 Gone`.
    pub(crate) fn compact(&mut self) {
        self.compacted = self.rv;
        self.history.clear();
    }

    /// Current objects of `kind` passing `filter`.
    pub(crate) fn list(&self, kind: Kind, filter: &Filter) -> Vec<Arc<Value>> {
        self.page(kind, filter, None, usize::MAX).0
    }

    /// Up to `limit` current objects of `kind` passing `filter`, in key order after `after`, and
    /// the key of the last one returned when more remain (where the next page starts).
    pub(crate) fn page(
        &self,
        kind: Kind,
        filter: &Filter,
        after: Option<&ObjectKey>,
        limit: usize,
    ) -> (Vec<Arc<Value>>, Option<ObjectKey>) {
        let (page, next, _) = self.page_counted(kind, filter, after, limit);
        (page, next)
    }

    /// [`Store::page`], and how many objects remain after the page when more do and `filter`
    /// has no selectors: kube-apiserver's `remainingItemCount`, which etcd can count only then.
    pub(crate) fn page_counted(
        &self,
        kind: Kind,
        filter: &Filter,
        after: Option<&ObjectKey>,
        limit: usize,
    ) -> (Vec<Arc<Value>>, Option<ObjectKey>, Option<usize>) {
        let Some(objects) = self.objects.get(&kind) else { return (Vec::new(), None, None) };
        let range = match after {
            Some(after) => objects.range::<ObjectKey, _>((Bound::Excluded(after), Bound::Unbounded)),
            None => objects.range::<ObjectKey, _>(..),
        };
        let mut matching = range.filter(|(_, v)| filter.matches(v));
        let page: Vec<(&ObjectKey, &Arc<Value>)> = matching.by_ref().take(limit).collect();
        let more = matching.next().is_some();
        let next = page.last().filter(|_| more).map(|(key, _)| (*key).clone());
        let remaining = (more && filter.labels.is_empty() && filter.fields.is_empty()).then(|| matching.count() + 1);
        (page.into_iter().map(|(_, v)| v.clone()).collect(), next, remaining)
    }

    /// History records of `kind` after `rv`.
    pub(crate) fn since(&self, kind: Kind, rv: u64) -> Vec<Arc<Record>> {
        self.history.iter().filter(|r| r.kind == kind && r.rv > rv).cloned().collect()
    }
}

pub(crate) fn key_of(object: &Value) -> ObjectKey {
    let field = |name: &str| object.pointer(&format!("/metadata/{name}")).and_then(Value::as_str).unwrap_or_default();
    ObjectKey::new(field("namespace"), field("name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_put_the_type_first_like_kube_apiserver() {
        let line = event_line("ADDED", &json!({"metadata": {"name": "web"}, "apiVersion": "v1"}));
        assert_eq!(line, "{\"type\":\"ADDED\",\"object\":{\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"web\"}}}\n");
        let parsed: Value = serde_json::from_str(&line).unwrap_or_default();
        assert_eq!(parsed["object"]["metadata"]["name"], "web");
    }
}
