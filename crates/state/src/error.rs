use crate::change::{Kind, ObjectKey};

/// Why one object from the cluster was rejected. The object is skipped; everything else keeps working.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {key}: {field}: {reason}")]
pub struct ObjectError {
    /// The kind of the rejected object.
    pub kind: Kind,
    /// Its namespace and name.
    pub key: ObjectKey,
    /// The field path that is wrong, e.g. `spec.ports[1].port`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ObjectError {
    pub(crate) fn new(kind: Kind, key: &ObjectKey, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { kind, key: key.clone(), field: field.into(), reason: reason.into() }
    }
}
