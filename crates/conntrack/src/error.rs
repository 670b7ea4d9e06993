//! Errors of the conntrack crate.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong talking to the kernel's connection tracker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The netfilter netlink socket could not be opened or bound.
    #[error("opening a netfilter netlink socket: {0}")]
    Socket(#[source] io::Error),
    /// Sending a request failed.
    #[error("sending a ctnetlink {request} request: {source}")]
    Send {
        /// What was being sent.
        request: &'static str,
        /// The system error.
        #[source]
        source: io::Error,
    },
    /// Receiving a reply failed.
    #[error("receiving the reply to a ctnetlink {request} request: {source}")]
    Receive {
        /// What the reply was for.
        request: &'static str,
        /// The system error.
        #[source]
        source: io::Error,
    },
    /// The kernel answered a request with an error.
    #[error("the kernel refused a ctnetlink {request} request: {source}")]
    Kernel {
        /// The refused request.
        request: &'static str,
        /// The errno the kernel returned.
        #[source]
        source: io::Error,
    },
    /// A reply could not be decoded.
    #[error("malformed ctnetlink reply: {0}")]
    Decode(String),
    /// A sysctl or sysfs file could not be read or written.
    #[error("{action} {path}: {source}")]
    File {
        /// "reading" or "writing".
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The system error.
        #[source]
        source: io::Error,
    },
    /// A sysctl or sysfs file did not hold an integer.
    #[error("{path} does not hold an integer: {content:?}")]
    NotAnInteger {
        /// The file.
        path: PathBuf,
        /// What it held.
        content: String,
    },
}
