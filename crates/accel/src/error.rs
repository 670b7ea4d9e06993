//! Errors of the fast path.

/// Why the fast path could not be brought in line.
#[derive(Debug, thiserror::Error)]
pub enum AccelError {
    /// A program could not be run.
    #[error("running {program}: {source}")]
    Spawn {
        /// Program.
        program: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The kernel refused a transaction, or it could not be sent; transactions are atomic.
    #[error("fast-path transaction: {0}")]
    Apply(#[from] kproxy_nft_model::ExecError),
    /// A netlink socket failed.
    #[error("netlink: {0}")]
    Netlink(#[from] std::io::Error),
    /// The kernel sent something that could not be decoded.
    #[error("undecodable {what}: {detail}")]
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        detail: String,
    },
}
