//! One error type for the whole harness, so every failure names the step and the thing that failed.

use std::path::PathBuf;

/// Everything that can stop the harness before the guest command produced an exit status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status})")]
    Failed { command: String, status: String },
    #[error("`{command}` did not finish within {secs} s and was killed")]
    Timeout { command: String, secs: u64 },
    #[error("usage: {0}")]
    Usage(String),
    #[error("{0}")]
    Setup(String),
    #[error("the guest {0}")]
    Guest(String),
}

impl Error {
    /// Wraps an I/O error with what was being done and to which path.
    pub fn io(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { what, path, source }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
