//! One error type for the whole testbed, so a failing kernel test says exactly which command or
//! syscall broke instead of panicking deep inside a helper.

use std::io;

/// Everything that can go wrong while building or driving a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// A command could not be started at all (binary missing, fork failed).
    #[error("could not run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },
    /// A command ran but exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command { command: String, status: String, stderr: String },
    /// Entering a network namespace failed.
    #[error("cannot enter network namespace {netns}: {source}")]
    Setns {
        netns: String,
        #[source]
        source: io::Error,
    },
    /// A socket or file operation failed in a way that is not a network outcome.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// The running kernel has no SCTP sockets (the host kernel of the development machine);
    /// SCTP cases run in the guest kernel.
    #[error("this kernel has no SCTP sockets ({0}); SCTP cases need the guest kernel")]
    SctpUnsupported(io::Error),
    /// A backend answered with something that is not `<name> <ip> <port>`.
    #[error("unexpected reply from backend: {0:?}")]
    BadReply(String),
    /// The caller asked for something the topology cannot do.
    #[error("invalid testbed request: {0}")]
    Invalid(String),
    /// A helper thread panicked.
    #[error("helper thread panicked: {0}")]
    ThreadPanicked(String),
}

/// Result alias used throughout the crate.
pub type Result<T, E = TestbedError> = std::result::Result<T, E>;

impl TestbedError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        TestbedError::Io { what: what.into(), source }
    }
}
