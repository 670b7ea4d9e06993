//! Well-known labels and annotations kproxy reads.

/// Objects carrying this label (any value) belong to another service proxy: kube-proxy ignores them.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// EndpointSlices of headless services carry this label; kube-proxy ignores objects with it.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// The label tying an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Opt-in to Services acceleration for clusters whose API server does not serve `spec.trafficHint`.
pub const TRAFFIC_HINT_ANNOTATION: &str = "service.kproxy.io/traffic-hint";
/// When the change an EndpointSlice version reflects happened (set by the EndpointSlice controller).
pub const LAST_CHANGE_TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// The node label holding the node's topology zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// True when upstream's informer label selectors would filter this object out.
pub(crate) fn ignored_by_selectors(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|l| l.contains_key(SERVICE_PROXY_NAME_LABEL) || l.contains_key(HEADLESS_LABEL))
}
