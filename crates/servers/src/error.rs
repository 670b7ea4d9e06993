//! Errors of the HTTP servers.

use std::net::SocketAddr;

/// Why a server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// Accepting connections failed for good.
    #[error("server on {addr} failed: {source}")]
    Accept {
        /// The address served.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// The server task panicked or was cancelled.
    #[error("server task on {addr} ended abnormally: {reason}")]
    Task {
        /// The address served.
        addr: SocketAddr,
        /// What the runtime reported.
        reason: String,
    },
}
