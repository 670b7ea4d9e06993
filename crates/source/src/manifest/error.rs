//! The two ways reading manifests can fail: the whole source cannot work (hard), or one file,
//! document or object is bad and is skipped while everything else keeps working (soft).

use std::fmt;
use std::path::PathBuf;

/// A failure that stops the source: there is nothing to read or watch.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The manifest directory cannot be listed.
    #[error("cannot read manifest directory {}: {source}", dir.display())]
    ReadDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// A file, document or object that was skipped. The rest of the directory still loads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ManifestError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line, when known (unknown when the whole file could not be read).
    pub line: Option<usize>,
    /// The object's `kind` as written, when it could be read.
    pub kind: Option<String>,
    /// `namespace/name` (or `name`) of the object, when it could be read.
    pub name: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl ManifestError {
    pub(crate) fn new(file: impl Into<PathBuf>, line: Option<usize>, message: impl Into<String>) -> Self {
        Self { file: file.into(), line, kind: None, name: None, message: message.into() }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        f.write_str(": ")?;
        match (&self.kind, &self.name) {
            (Some(kind), Some(name)) => write!(f, "{kind} {name}: ")?,
            (Some(kind), None) => write!(f, "{kind}: ")?,
            (None, Some(name)) => write!(f, "{name}: ")?,
            (None, None) => {}
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ManifestError {}
