//! The feature gates kube-proxy consults, with their stage and default in Kubernetes v1.37
//! (UPSTREAM.md B.3), so that a gate's effective value and the `kubernetes_feature_enabled`
//! metric come from one table.

use std::collections::BTreeMap;

/// A gate's maturity, as the `stage` label of `kubernetes_feature_enabled` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Alpha: off by default.
    Alpha,
    /// Beta.
    Beta,
    /// Generally available (the label is empty, as upstream).
    Ga,
    /// Deprecated.
    Deprecated,
}

impl Stage {
    /// The `stage` label value upstream's component-base exports.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Alpha => "ALPHA",
            Stage::Beta => "BETA",
            Stage::Ga => "",
            Stage::Deprecated => "DEPRECATED",
        }
    }
}

/// One known gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureGate {
    /// The gate's name.
    pub name: &'static str,
    /// Its stage.
    pub stage: Stage,
    /// Its value when not set.
    pub default: bool,
}

const fn gate(name: &'static str, stage: Stage, default: bool) -> FeatureGate {
    FeatureGate { name, stage, default }
}

/// Every gate kproxy knows (`AllAlpha` / `AllBeta` are switches over the others, not gates).
pub const FEATURE_GATES: &[FeatureGate] = &[
    gate("AllowServiceExternalIPs", Stage::Beta, true),
    gate("IPTablesOwnershipCleanup", Stage::Ga, true),
    gate("KubeProxyAcceleration", Stage::Alpha, false),
    gate("KubeProxyDrainingTerminatingNodes", Stage::Ga, true),
    gate("KubeProxyIPVS", Stage::Ga, true),
    gate("KubeProxyNFTablesLocalhostNodePorts", Stage::Alpha, false),
    gate("KubeProxyNoMasqueradeCIDRs", Stage::Alpha, false),
    gate("LoadBalancerIPMode", Stage::Ga, true),
    gate("MinimizeIPTablesRestore", Stage::Ga, true),
    gate("MultiCIDRServiceAllocator", Stage::Ga, true),
    gate("NFTablesNetlink", Stage::Beta, true),
    gate("NFTablesProxyMode", Stage::Ga, true),
    gate("PreferSameTrafficDistribution", Stage::Ga, true),
    gate("PreserveUDPFlowsTerminatingEndpoints", Stage::Alpha, false),
    gate("ProxyTerminatingEndpoints", Stage::Ga, true),
    gate("ServiceInternalTrafficPolicy", Stage::Ga, true),
    gate("ServiceTrafficDistribution", Stage::Ga, true),
    gate("TopologyAwareHints", Stage::Ga, true),
];

/// Names accepted besides the gates: upstream's switches for every alpha / beta gate.
pub const GATE_SWITCHES: &[&str] = &["AllAlpha", "AllBeta"];

/// Whether `name` is a gate or switch kproxy knows. Others are accepted with a warning: upstream
/// shares one registry with every Kubernetes component, so a ConfigMap may name gates kproxy has
/// no use for, and refusing to start over them would break the drop-in promise.
pub fn is_known(name: &str) -> bool {
    GATE_SWITCHES.contains(&name) || FEATURE_GATES.iter().any(|gate| gate.name == name)
}

/// The effective value of every known gate given the explicitly set ones: an explicit value,
/// else `AllAlpha` / `AllBeta` for gates of that stage, else the default.
pub fn effective(set: &BTreeMap<String, bool>) -> Vec<(FeatureGate, bool)> {
    FEATURE_GATES
        .iter()
        .map(|gate| {
            let switch = match gate.stage {
                Stage::Alpha => set.get("AllAlpha"),
                Stage::Beta => set.get("AllBeta"),
                Stage::Ga | Stage::Deprecated => None,
            };
            let enabled = set.get(gate.name).or(switch).copied().unwrap_or(gate.default);
            (*gate, enabled)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_values_win_over_switches_and_defaults() {
        let set: BTreeMap<String, bool> =
            [("AllAlpha".to_owned(), true), ("KubeProxyAcceleration".to_owned(), false)].into();
        let value = |name: &str| effective(&set).into_iter().find(|(g, _)| g.name == name).map(|(_, on)| on);
        assert_eq!(value("KubeProxyAcceleration"), Some(false), "explicit");
        assert_eq!(value("KubeProxyNFTablesLocalhostNodePorts"), Some(true), "AllAlpha");
        assert_eq!(value("NFTablesNetlink"), Some(true), "default");
        assert_eq!(value("Unknown"), None);
        assert!(is_known("AllBeta") && is_known("KubeProxyIPVS") && !is_known("NoSuchGate"));
    }

    #[test]
    fn gates_are_listed_once_in_order() {
        let names: Vec<&str> = FEATURE_GATES.iter().map(|gate| gate.name).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
    }
}
