//! `kubeproxy_sync_proxy_rules_{endpoint,service}_changes_{total,pending}`, counted from the
//! source's events the way upstream's change trackers count informer events: every EndpointSlice
//! add, update or delete is one endpoint change, every Service add, update or delete one service
//! change (an initial listing counts one per object listed). Pending is what arrived since the
//! last sync: endpoint changes one per event, service changes one per Service (upstream's
//! `len(serviceChangeTracker.items)`); both drop to 0 when a sync takes them.

use std::collections::BTreeSet;

use kproxy_servers::Metrics;
use kproxy_state::{Change, Kind, ObjectKey};

/// Counts changes into the metrics.
#[derive(Debug, Default)]
pub struct ChangeCounts {
    endpoints_pending: u64,
    services_pending: BTreeSet<ObjectKey>,
}

impl ChangeCounts {
    /// One event from the source.
    pub fn record(&mut self, change: &Change, metrics: &Metrics) {
        let (kind, keys): (Kind, Vec<ObjectKey>) = match change {
            Change::Applied(object) => (object.kind(), vec![object.key()]),
            Change::Deleted(kind, key) => (*kind, vec![key.clone()]),
            Change::Replaced(kind, objects) => (*kind, objects.iter().map(|object| object.key()).collect()),
            // A streamed listing's bounds and unreadable objects: its objects were counted as
            // they came, and what it no longer names is counted as deleted once the state has
            // worked it out (`Proxier::apply`).
            Change::Synced(kind)
            | Change::ListStarted(kind)
            | Change::ListEnded(kind)
            | Change::Unreadable(kind, _) => (*kind, Vec::new()),
        };
        match kind {
            Kind::EndpointSlice => {
                let events = keys.len() as u64;
                metrics.add_endpoint_changes(events);
                self.endpoints_pending += events;
                metrics.set_endpoint_changes_pending(self.endpoints_pending);
            }
            Kind::Service => {
                metrics.add_service_changes(keys.len() as u64);
                self.services_pending.extend(keys);
                metrics.set_service_changes_pending(self.services_pending.len() as u64);
            }
            _ => {}
        }
    }

    /// A sync took every pending change (whether it succeeded or will be retried in full).
    pub fn taken(&mut self, metrics: &Metrics) {
        self.endpoints_pending = 0;
        self.services_pending.clear();
        metrics.set_endpoint_changes_pending(0);
        metrics.set_service_changes_pending(0);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use kproxy_servers::{DataplaneMode, Exposition};
    use kproxy_state::Object;
    use serde_json::json;

    use super::*;

    fn service(name: &str) -> Object {
        let svc: Service =
            serde_json::from_value(json!({"metadata": {"namespace": "ns", "name": name}, "spec": {}})).unwrap();
        Object::Service(Box::new(svc.into()))
    }

    fn value(metrics: &Metrics, series: &str) -> String {
        let text = metrics.encode(Exposition::PrometheusText).unwrap();
        let line = text.lines().find(|line| line.split(' ').next() == Some(series));
        line.and_then(|line| line.split(' ').nth(1)).unwrap_or_else(|| panic!("no {series} in\n{text}")).to_owned()
    }

    #[test]
    fn services_count_per_event_and_pend_per_service() {
        let metrics = Metrics::new(DataplaneMode::Nftables);
        let mut counts = ChangeCounts::default();
        counts.record(&Change::Replaced(Kind::Service, vec![service("a"), service("b")]), &metrics);
        counts.record(&Change::Applied(service("a")), &metrics);
        counts.record(&Change::Deleted(Kind::EndpointSlice, ObjectKey::new("ns", "a-1")), &metrics);
        assert_eq!(value(&metrics, "kubeproxy_sync_proxy_rules_service_changes_total"), "3");
        assert_eq!(value(&metrics, "kubeproxy_sync_proxy_rules_service_changes_pending"), "2");
        assert_eq!(value(&metrics, "kubeproxy_sync_proxy_rules_endpoint_changes_total"), "1");
        assert_eq!(value(&metrics, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"), "1");
        counts.taken(&metrics);
        assert_eq!(value(&metrics, "kubeproxy_sync_proxy_rules_service_changes_pending"), "0");
        assert_eq!(value(&metrics, "kubeproxy_sync_proxy_rules_endpoint_changes_pending"), "0");
        assert_eq!(value(&metrics, "kubeproxy_sync_proxy_rules_service_changes_total"), "3", "totals stay");
    }
}
