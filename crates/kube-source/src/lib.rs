//! The Kubernetes API source.
