//! Errors that name the field at fault.
//!
//! Every message a user sees names the configuration field path in the file's spelling
//! (`iptables.syncPeriod`, `nodePortAddresses[1]`) and, when the value came from the command
//! line, the flag too, so a failing DaemonSet can be fixed without reading source.

use std::fmt;
use std::path::PathBuf;

/// One invalid value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Field path in KubeProxyConfiguration spelling, e.g. `iptables.masqueradeBit`.
    pub field: String,
    /// The flag the value came from, e.g. `--iptables-masquerade-bit`, when it came from one.
    pub flag: Option<String>,
    /// The offending value, as text.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.flag {
            Some(flag) => write!(f, "{} (flag {flag})", self.field)?,
            None => f.write_str(&self.field)?,
        }
        write!(f, ": invalid value {:?}: {}", self.value, self.reason)
    }
}

/// Why the configuration could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The `--config` file could not be read.
    #[error("reading config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The `--config` file is not a well-formed KubeProxyConfiguration (syntax, types, unknown fields,
    /// apiVersion/kind).
    #[error("config file {}: {}{message}", path.display(), field.as_deref().map(|f| format!("{f}: ")).unwrap_or_default())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The field path at fault, when known (`iptables.syncPeriod`, `apiVersion`).
        field: Option<String>,
        /// What is wrong.
        message: String,
    },
    /// One or more values are well-formed but not allowed.
    #[error("invalid configuration: {}", join(.0))]
    Invalid(Vec<FieldError>),
    /// The effective configuration could not be written (`--write-config-to`).
    #[error("writing config file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The effective configuration could not be serialized.
    #[error("serializing the configuration: {0}")]
    Serialize(String),
}

fn join(errors: &[FieldError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

impl ConfigError {
    /// The first field path at fault, if the error is about a field.
    pub fn field(&self) -> Option<&str> {
        self.fields().into_iter().next()
    }

    /// Every field path at fault, in the order found.
    pub fn fields(&self) -> Vec<&str> {
        match self {
            ConfigError::Parse { field: Some(field), .. } => vec![field.as_str()],
            ConfigError::Invalid(errors) => errors.iter().map(|e| e.field.as_str()).collect(),
            _ => Vec::new(),
        }
    }
}
