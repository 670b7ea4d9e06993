//! Errors of the Kubernetes source.

use std::path::PathBuf;

/// Why a Kubernetes client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No kubeconfig was given and the in-cluster configuration is not available.
    #[error("no --kubeconfig given and not running in a cluster: {0}")]
    InCluster(#[source] kube::config::InClusterError),
    /// The client could not be built from the configuration (e.g. bad TLS material).
    #[error("building the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// `clientConnection.contentType` names a type kproxy cannot speak.
    #[error(
        "unsupported clientConnection.contentType {0:?} (want application/json or application/vnd.kubernetes.protobuf)"
    )]
    UnsupportedContentType(String),
    /// `clientConnection.acceptContentTypes` names a type kproxy cannot read.
    #[error(
        "unsupported clientConnection.acceptContentTypes {0:?} (want a comma-separated list of application/json, \
         application/vnd.kubernetes.protobuf and */*)"
    )]
    UnsupportedAcceptContentTypes(String),
    /// `clientConnection.qps` is not a number kproxy can use.
    #[error("invalid clientConnection.qps {0}")]
    InvalidQps(f32),
}
