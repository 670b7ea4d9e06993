//! Turning a parsed document into kproxy objects: dispatch on `apiVersion`/`kind`, unwrap
//! `List`s, decode into the k8s-openapi type, and fill in what `kubectl` would (the `default`
//! namespace). Anything wrong becomes a [`ManifestError`] pointing at the file and line; anything
//! kproxy does not watch (ConfigMaps, Deployments, ...) is skipped quietly, so a directory can hold
//! a whole application's manifests.

use std::path::Path;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kproxy_state::{Object, ServiceObject};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::Value;

use super::documents::{Format, ParsedDocument};
use super::error::ManifestError;
use super::locate::{Segment, display_path, locate};

/// Lists inside lists are unwrapped up to this depth.
const MAX_LIST_DEPTH: usize = 4;

/// An object and the file line it was read from.
#[derive(Debug, Clone)]
pub(crate) struct Decoded {
    pub object: Object,
    pub line: usize,
}

/// Decodes every object of a document, appending objects and errors.
pub(crate) fn decode_document(
    file: &Path,
    doc: ParsedDocument<'_>,
    objects: &mut Vec<Decoded>,
    errors: &mut Vec<ManifestError>,
) {
    let ParsedDocument { doc, value } = doc;
    let mut decoder = Decoder { file, doc: &doc, objects, errors };
    decoder.value(value, Vec::new(), doc.line, None, 0);
}

struct Decoder<'a, 'd> {
    file: &'a Path,
    doc: &'a super::documents::Document<'d>,
    objects: &'a mut Vec<Decoded>,
    errors: &'a mut Vec<ManifestError>,
}

/// What the error is about, as far as it could be read.
struct Subject {
    kind: Option<String>,
    name: Option<String>,
}

impl Decoder<'_, '_> {
    /// Decodes the object (or list) at `path` whose first line is `line`. `item_kind` is the kind
    /// implied by a typed list (`ServiceList` items may omit `kind`).
    fn value(&mut self, value: Value, path: Vec<Segment>, line: usize, item_kind: Option<(&str, &str)>, depth: usize) {
        let subject = subject_of(&value, item_kind);
        let Value::Object(_) = value else {
            return self.error(&subject, line, format!("expected an object, found {}", type_name(&value)));
        };
        let field = |name: &str| value.get(name).and_then(Value::as_str).filter(|s| !s.is_empty());
        let (api_version, kind) = match (field("apiVersion"), field("kind"), item_kind) {
            (Some(api), Some(kind), _) => (api.to_owned(), kind.to_owned()),
            (None, None, Some((api, kind))) => (api.to_owned(), kind.to_owned()),
            (None, _, _) => return self.error(&subject, line, "apiVersion is missing".into()),
            (_, None, _) => return self.error(&subject, line, "kind is missing".into()),
        };
        match (api_version.as_str(), kind.as_str()) {
            (_, "List" | "ServiceList" | "EndpointSliceList" | "NodeList" | "ServiceCIDRList") => {
                if depth >= MAX_LIST_DEPTH {
                    return self.error(&subject, line, format!("lists nested deeper than {MAX_LIST_DEPTH}"));
                }
                let implied = kind.strip_suffix("List").filter(|k| !k.is_empty()).map(|k| (api_version.as_str(), k));
                self.list(value, path, line, implied, depth);
            }
            ("v1", "Service") => self.service(value, path, line, &subject),
            ("v1", "Node") => {
                self.typed::<Node>(value, path, line, &subject, Scope::Cluster, |n| Object::Node(Box::new(n)))
            }
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                self.typed::<EndpointSlice>(value, path, line, &subject, Scope::Namespaced, |s| {
                    Object::EndpointSlice(Box::new(s))
                })
            }
            ("networking.k8s.io/v1" | "networking.k8s.io/v1beta1", "ServiceCIDR") => {
                // v1beta1 has the same schema; k8s-openapi only accepts the v1 spelling.
                let value = with_field(value, "apiVersion", "networking.k8s.io/v1");
                self.typed::<ServiceCIDR>(value, path, line, &subject, Scope::Cluster, |c| {
                    Object::ServiceCidr(Box::new(c))
                })
            }
            (_, "Service" | "Node" | "EndpointSlice" | "ServiceCIDR") => {
                self.error(&subject, line, format!("unsupported apiVersion {api_version:?} for kind {kind}"))
            }
            _ => tracing::debug!(
                file = %self.file.display(), line, api_version, kind, "skipping a kind kproxy does not watch"
            ),
        }
    }

    fn list(&mut self, mut value: Value, path: Vec<Segment>, line: usize, implied: Option<(&str, &str)>, depth: usize) {
        let items = match value.get_mut("items").map(Value::take) {
            None | Some(Value::Null) => return,
            Some(Value::Array(items)) => items,
            Some(other) => {
                let subject = subject_of(&value, None);
                let at = self.line_of(&child(&path, Segment::Key("items".into()))).unwrap_or(line);
                return self.error(&subject, at, format!("items: expected a list, found {}", type_name(&other)));
            }
        };
        let item_lines = if path.is_empty() { item_lines(self.doc) } else { None };
        for (i, item) in items.into_iter().enumerate() {
            let item_path = child(&child(&path, Segment::Key("items".into())), Segment::Index(i));
            let item_line = item_lines.as_ref().and_then(|lines| lines.get(i)).copied().unwrap_or(line);
            self.value(item, item_path, item_line, implied, depth + 1);
        }
    }

    fn service(&mut self, value: Value, path: Vec<Segment>, line: usize, subject: &Subject) {
        let traffic_hint = match value.pointer("/spec/trafficHint") {
            None | Some(Value::Null) => None,
            Some(Value::String(hint)) => Some(hint.clone()),
            Some(other) => {
                let hint_path = [Segment::Key("spec".into()), Segment::Key("trafficHint".into())];
                let at = self.line_of(&[path.as_slice(), &hint_path].concat()).unwrap_or(line);
                let message = format!("spec.trafficHint: expected a string, found {}", type_name(other));
                return self.error(subject, at, message);
            }
        };
        self.typed::<Service>(value, path, line, subject, Scope::Namespaced, |service| {
            Object::Service(Box::new(ServiceObject { service, traffic_hint }))
        });
    }

    fn typed<T: DeserializeOwned + HasMeta>(
        &mut self,
        value: Value,
        path: Vec<Segment>,
        line: usize,
        subject: &Subject,
        scope: Scope,
        wrap: impl FnOnce(T) -> Object,
    ) {
        let mut typed: T = match serde_path_to_error::deserialize(value) {
            Ok(typed) => typed,
            Err(e) => {
                let field_path: Vec<Segment> = e
                    .path()
                    .iter()
                    .map_while(|segment| match segment {
                        serde_path_to_error::Segment::Map { key } => Some(Segment::Key(key.clone())),
                        serde_path_to_error::Segment::Seq { index } => Some(Segment::Index(*index)),
                        _ => None,
                    })
                    .collect();
                let at = self.line_of(&[path.as_slice(), &field_path].concat()).unwrap_or(line);
                let message = match display_path(&field_path) {
                    p if p.is_empty() => e.into_inner().to_string(),
                    p => format!("{p}: {}", e.into_inner()),
                };
                return self.error(subject, at, message);
            }
        };
        let meta = typed.meta_mut();
        if meta.name.as_deref().is_none_or(str::is_empty) {
            return self.error(subject, line, "metadata.name is missing".into());
        }
        match scope {
            // What kubectl does: a namespaced object without a namespace lands in "default".
            Scope::Namespaced if meta.namespace.as_deref().is_none_or(str::is_empty) => {
                meta.namespace = Some("default".into());
            }
            Scope::Namespaced => {}
            // The API server ignores a namespace on cluster-scoped objects.
            Scope::Cluster => meta.namespace = None,
        }
        self.objects.push(Decoded { object: wrap(typed), line });
    }

    fn line_of(&self, path: &[Segment]) -> Option<usize> {
        locate(self.doc, path)
    }

    fn error(&mut self, subject: &Subject, line: usize, message: String) {
        self.errors.push(ManifestError {
            file: self.file.to_path_buf(),
            line: Some(line),
            kind: subject.kind.clone(),
            name: subject.name.clone(),
            message,
        });
    }
}

#[derive(Debug, Clone, Copy)]
enum Scope {
    Namespaced,
    Cluster,
}

trait HasMeta {
    fn meta_mut(&mut self) -> &mut ObjectMeta;
}

macro_rules! has_meta {
    ($($t:ty),*) => {$(
        impl HasMeta for $t {
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    )*};
}
has_meta!(Service, Node, EndpointSlice, ServiceCIDR);

fn with_field(mut value: Value, field: &str, to: &str) -> Value {
    if let Some(object) = value.as_object_mut() {
        object.insert(field.to_owned(), Value::String(to.to_owned()));
    }
    value
}

fn child(path: &[Segment], segment: Segment) -> Vec<Segment> {
    let mut path = path.to_vec();
    path.push(segment);
    path
}

fn subject_of(value: &Value, item_kind: Option<(&str, &str)>) -> Subject {
    let text = |pointer: &str| value.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty());
    let kind = text("/kind").or(item_kind.map(|(_, kind)| kind)).map(str::to_owned);
    let name = text("/metadata/name").map(|name| match text("/metadata/namespace") {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    });
    Subject { kind, name }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The file line of each item of a top-level YAML `List`, read in one extra pass. JSON has no
/// positions to offer; its items report the list's line.
fn item_lines(doc: &super::documents::Document<'_>) -> Option<Vec<usize>> {
    #[derive(serde::Deserialize)]
    struct Items {
        items: Vec<serde_saphyr::Spanned<IgnoredAny>>,
    }
    if doc.format != Format::Yaml {
        return None;
    }
    let items: Items = serde_saphyr::from_str(doc.text).ok()?;
    // Spans are lost in some corner cases (reported as line 0): then fall back to the list's line.
    if items.items.iter().any(|item| item.referenced.line() == 0) {
        return None;
    }
    Some(items.items.iter().map(|item| doc.file_line(item.referenced.line() as usize)).collect())
}
