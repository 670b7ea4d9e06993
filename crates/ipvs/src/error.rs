//! Errors of the IPVS dataplane. A failed sync leaves the kernel partly updated; the next sync
//! is a full reconcile against what the kernel has.

use crate::netlink::NetlinkError;

/// Why a kernel operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The IPVS generic netlink family is missing (no `ip_vs` module).
    #[error("the kernel has no IPVS (generic netlink family {0:?} not found; is ip_vs loaded?)")]
    NoIpvs(&'static str),
    /// An IPVS request failed.
    #[error("IPVS {op}: {source}")]
    Ipvs {
        /// What was asked.
        op: String,
        /// The kernel's answer.
        source: NetlinkError,
    },
    /// An rtnetlink request failed.
    #[error("interface {op}: {source}")]
    Link {
        /// What was asked.
        op: String,
        /// The kernel's answer.
        source: NetlinkError,
    },
    /// An interface of the expected name exists but is not a dummy.
    #[error("interface {0} exists and is not a dummy interface")]
    NotDummy(String),
    /// A sysctl could not be read or written.
    #[error("sysctl {path}: {source}")]
    Sysctl {
        /// `/proc/sys/...`.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The auxiliary nftables transaction was rejected.
    #[error("nftables: {0}")]
    Nft(#[from] kproxy_nftables::ExecError),
    /// A test host was told to fail.
    #[error("injected failure")]
    Injected,
}

impl Error {
    /// The kernel's errno, when the kernel answered with one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Ipvs { source, .. } | Error::Link { source, .. } => source.errno(),
            _ => None,
        }
    }
}
