//! What sources emit: the same events whether they watch the API server or a directory.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The kinds of object kproxy watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `v1/Service`
    Service,
    /// `discovery.k8s.io/v1/EndpointSlice`
    EndpointSlice,
    /// `v1/Node`
    Node,
    /// `networking.k8s.io/v1/ServiceCIDR`
    ServiceCidr,
}

impl Kind {
    /// Every kind, in the order a consumer should apply a relist.
    pub const ALL: [Kind; 4] = [Kind::Node, Kind::ServiceCidr, Kind::Service, Kind::EndpointSlice];
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
        })
    }
}

/// Namespace and name of an object; the namespace is empty for cluster-scoped kinds.
///
/// Shared strings: the state indexes each Service and slice under several keys (the record, the
/// Service's slices, each slice's owner), and a copy of a key costs two reference counts, not two
/// allocations.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ObjectKey {
    /// Namespace, or "" for Nodes and ServiceCIDRs.
    pub namespace: Arc<str>,
    /// Object name.
    pub name: Arc<str>,
}

impl ObjectKey {
    /// A namespaced key.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }

    /// A cluster-scoped key.
    pub fn cluster(name: impl Into<Arc<str>>) -> Self {
        Self::new("", name)
    }

    /// The key of the object with this metadata (empty where a field is missing).
    pub fn of(meta: &ObjectMeta) -> Self {
        Self::new(meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() { f.write_str(&self.name) } else { write!(f, "{}/{}", self.namespace, self.name) }
    }
}

/// A Service as a source saw it, with the fields k8s-openapi may not know yet.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServiceObject {
    /// The typed object.
    pub service: Service,
    /// `spec.trafficHint` (KEP-4963), read from the raw object when the API server serves it.
    pub traffic_hint: Option<String>,
}

impl From<Service> for ServiceObject {
    fn from(service: Service) -> Self {
        Self { service, traffic_hint: None }
    }
}

/// One object of a watched kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Object {
    /// A Service.
    Service(Box<ServiceObject>),
    /// An EndpointSlice.
    EndpointSlice(Box<EndpointSlice>),
    /// A Node.
    Node(Box<Node>),
    /// A ServiceCIDR.
    ServiceCidr(Box<ServiceCIDR>),
}

impl Object {
    /// The object's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Object::Service(_) => Kind::Service,
            Object::EndpointSlice(_) => Kind::EndpointSlice,
            Object::Node(_) => Kind::Node,
            Object::ServiceCidr(_) => Kind::ServiceCidr,
        }
    }

    /// The object's namespace and name.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::of(self.meta())
    }

    /// The object's metadata.
    pub fn meta(&self) -> &ObjectMeta {
        match self {
            Object::Service(s) => &s.service.metadata,
            Object::EndpointSlice(s) => &s.metadata,
            Object::Node(n) => &n.metadata,
            Object::ServiceCidr(c) => &c.metadata,
        }
    }
}

/// An event from a source.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The object was added or updated.
    Applied(Object),
    /// The object was deleted.
    Deleted(Kind, ObjectKey),
    /// A complete listing of one kind: objects of that kind not in the list are gone; marks that
    /// kind as synced. For small listings (tests, the `plan` subcommand): a source that lists
    /// many objects streams them instead, as `Applied` events followed by [`Change::Synced`]
    /// (the manifest source) or between [`Change::ListStarted`] and [`Change::ListEnded`] (the
    /// API source), so that an object that could not be read keeps its last good version.
    Replaced(Kind, Vec<Object>),
    /// The initial listing of one kind is complete: every object of that kind was sent as
    /// `Applied` before this (and objects no longer there as `Deleted`). Marks the kind as
    /// synced. This lets a source hand over a listing object by object as it arrives, so neither
    /// the source nor the channel ever holds the whole list. (Also: a kind that counts as listed
    /// and empty, e.g. an API the server does not serve.)
    Synced(Kind),
    /// A listing of one kind starts, or starts over after breaking off: its objects follow as
    /// `Applied` (or [`Change::Unreadable`]), then [`Change::ListEnded`]. For a source that
    /// streams listings and relists (after `410 Gone`) without keeping the keys it sent: the
    /// state, which holds them anyway, works out what is gone.
    ListStarted(Kind),
    /// The listing in progress names this object but it could not be read: it is not gone, and
    /// its last good version stays.
    Unreadable(Kind, ObjectKey),
    /// The listing of one kind is complete: objects of that kind it did not name are gone.
    /// Marks the kind as synced.
    ListEnded(Kind),
}

impl Change {
    /// The kind of object the change is about.
    pub fn kind(&self) -> Kind {
        match self {
            Change::Applied(object) => object.kind(),
            Change::Deleted(kind, _)
            | Change::Replaced(kind, _)
            | Change::Synced(kind)
            | Change::ListStarted(kind)
            | Change::Unreadable(kind, _)
            | Change::ListEnded(kind) => *kind,
        }
    }
}
