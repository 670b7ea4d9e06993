//! Sources of cluster state: a directory of manifests (and the Kubernetes API).
