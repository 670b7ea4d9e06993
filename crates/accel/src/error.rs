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
    /// `nft` rejected a batch; nothing of it was applied.
    #[error("nft rejected the fast-path batch: {stderr}")]
    Rejected {
        /// What nft said.
        stderr: String,
        /// The batch, for the debug log.
        script: String,
    },
    /// A netlink socket failed.
    #[error("rtnetlink: {0}")]
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
