//! kube-proxy compatible configuration: flags and the KubeProxyConfiguration file.
