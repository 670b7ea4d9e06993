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

/// What kproxy does with a gate, read where upstream reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// GA and locked to true upstream ("cannot set feature gate … to false"): always on.
    LockedOn,
    /// Decides a setting (documented at [`check`]).
    Acts,
    /// kproxy always behaves as if the gate were on; turning it off is refused.
    AlwaysOn,
    /// kproxy does not implement the gated feature; turning it on is refused.
    NotImplemented,
}

fn effect(name: &str) -> Effect {
    match name {
        "KubeProxyIPVS" | "KubeProxyAcceleration" | "KubeProxyNoMasqueradeCIDRs" => Effect::Acts,
        // kproxy talks nf_tables netlink only; external IPs are always proxied.
        "NFTablesNetlink" | "AllowServiceExternalIPs" => Effect::AlwaysOn,
        // Localhost NodePorts in nftables mode (KEP-6032) and the per-port UDP flow preservation
        // of KEP-5989: not implemented (kproxy keeps flows to serving endpoints, upstream's default).
        "KubeProxyNFTablesLocalhostNodePorts" | "PreserveUDPFlowsTerminatingEndpoints" => Effect::NotImplemented,
        _ => Effect::LockedOn,
    }
}

/// What the gates decide for the rest of the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateDecisions {
    /// `KubeProxyAcceleration` when set (else the `acceleration.enabled` field decides).
    pub acceleration: Option<bool>,
    /// `KubeProxyIPVS`: IPVS mode allowed.
    pub ipvs: bool,
    /// `KubeProxyNoMasqueradeCIDRs` explicitly off.
    pub no_masquerade_cidrs_off: bool,
}

/// Checks the gates as given: a locked or always-on gate turned off, or an unimplemented one
/// turned on, is an error (`(gate, reason)`), never silently ignored. The gates that act:
/// `KubeProxyIPVS=false` forbids IPVS mode (upstream's plan for 1.40); `KubeProxyAcceleration`
/// (explicit, or on through `AllAlpha=true`) switches Services acceleration over `acceleration.enabled`;
/// `KubeProxyNoMasqueradeCIDRs=false` forbids `noMasqueradeCIDRs`.
pub fn check(set: &BTreeMap<String, bool>) -> (GateDecisions, Vec<(String, String)>) {
    let mut errors = Vec::new();
    let effective = effective(set);
    let value = |name: &str| effective.iter().find(|(gate, _)| gate.name == name).map(|(_, on)| *on);
    for (gate, enabled) in &effective {
        match (effect(gate.name), enabled) {
            (Effect::LockedOn, false) => errors.push((
                gate.name.to_owned(),
                format!("cannot set feature gate {} to false: it is GA and locked to true (as upstream)", gate.name),
            )),
            (Effect::AlwaysOn, false) => {
                let by = match switch(set, gate) {
                    Some((name, false)) if !set.contains_key(gate.name) => format!(" (set by {name}=false)"),
                    _ => String::new(),
                };
                errors.push((
                    gate.name.to_owned(),
                    format!("kproxy cannot run with {}=false{by}: it always behaves as if it were on", gate.name),
                ))
            }
            // Only an explicit value turns these on (see `effective`).
            (Effect::NotImplemented, true) => errors
                .push((gate.name.to_owned(), format!("kproxy does not implement the feature gated by {}", gate.name))),
            _ => {}
        }
    }
    let decisions = GateDecisions {
        // A switch turning the gate on counts as setting it; at its default the field decides.
        acceleration: set.get("KubeProxyAcceleration").copied().or(value("KubeProxyAcceleration").filter(|on| *on)),
        ipvs: value("KubeProxyIPVS").unwrap_or(true),
        no_masquerade_cidrs_off: set.get("KubeProxyNoMasqueradeCIDRs") == Some(&false),
    };
    (decisions, errors)
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

/// The switch (`AllAlpha` / `AllBeta`) and its value that covers `gate`, if one is set.
fn switch(set: &BTreeMap<String, bool>, gate: &FeatureGate) -> Option<(&'static str, bool)> {
    let name = match gate.stage {
        Stage::Alpha => "AllAlpha",
        Stage::Beta => "AllBeta",
        Stage::Ga | Stage::Deprecated => return None,
    };
    set.get(name).map(|on| (name, *on))
}

/// The effective value of every known gate given the explicitly set ones: an explicit value,
/// else `AllAlpha` / `AllBeta` for gates of that stage (as upstream's component-base), else the
/// default. A switch does not turn on a gate whose feature kproxy lacks ([`left_off_by_switches`]).
pub fn effective(set: &BTreeMap<String, bool>) -> Vec<(FeatureGate, bool)> {
    FEATURE_GATES
        .iter()
        .map(|gate| {
            let switched =
                switch(set, gate).map(|(_, on)| on).filter(|on| !on || effect(gate.name) != Effect::NotImplemented);
            let enabled = set.get(gate.name).copied().or(switched).unwrap_or(gate.default);
            (*gate, enabled)
        })
        .collect()
}

/// The gates a switch set to true would turn on upstream but kproxy leaves off, because it does
/// not implement their feature, as `(switch, gate)`. The caller warns about them.
pub fn left_off_by_switches(set: &BTreeMap<String, bool>) -> Vec<(&'static str, &'static str)> {
    FEATURE_GATES
        .iter()
        .filter(|gate| effect(gate.name) == Effect::NotImplemented && !set.contains_key(gate.name))
        .filter_map(|gate| match switch(set, gate) {
            Some((name, true)) if !gate.default => Some((name, gate.name)),
            _ => None,
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
        assert_eq!(value("KubeProxyNoMasqueradeCIDRs"), Some(true), "AllAlpha");
        assert_eq!(value("NFTablesNetlink"), Some(true), "default");
        assert_eq!(value("Unknown"), None);
        assert!(is_known("AllBeta") && is_known("KubeProxyIPVS") && !is_known("NoSuchGate"));
    }

    #[test]
    fn gates_that_cannot_take_a_value_are_refused_and_the_others_decide() {
        let set = |pairs: &[(&str, bool)]| -> BTreeMap<String, bool> {
            pairs.iter().map(|(name, on)| ((*name).to_owned(), *on)).collect()
        };
        let refused =
            |pairs: &[(&str, bool)]| -> Vec<String> { check(&set(pairs)).1.into_iter().map(|(g, _)| g).collect() };
        assert_eq!(refused(&[("ServiceTrafficDistribution", false)]), ["ServiceTrafficDistribution"]);
        assert_eq!(refused(&[("NFTablesNetlink", false)]), ["NFTablesNetlink"]);
        assert_eq!(refused(&[("KubeProxyNFTablesLocalhostNodePorts", true)]), ["KubeProxyNFTablesLocalhostNodePorts"]);
        assert!(
            refused(&[("AllAlpha", true), ("ServiceTrafficDistribution", true), ("NFTablesNetlink", true)]).is_empty()
        );
        let (decided, errors) = check(&set(&[("KubeProxyIPVS", false), ("KubeProxyAcceleration", false)]));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(decided, GateDecisions { acceleration: Some(false), ipvs: false, no_masquerade_cidrs_off: false });
        assert_eq!(
            check(&set(&[])).0,
            GateDecisions { acceleration: None, ipvs: true, no_masquerade_cidrs_off: false }
        );
    }

    fn gates(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(name, on)| ((*name).to_owned(), *on)).collect()
    }

    #[test]
    fn switches_turn_on_implemented_gates_only_and_name_the_others() {
        let value = |set: &BTreeMap<String, bool>, name: &str| {
            effective(set).into_iter().find(|(g, _)| g.name == name).map(|(_, on)| on)
        };
        let all_alpha = gates(&[("AllAlpha", true)]);
        // What kubernetes_feature_enabled reports: on for what kproxy does, off for what it lacks.
        assert_eq!(value(&all_alpha, "KubeProxyAcceleration"), Some(true));
        assert_eq!(value(&all_alpha, "KubeProxyNFTablesLocalhostNodePorts"), Some(false));
        assert_eq!(value(&all_alpha, "PreserveUDPFlowsTerminatingEndpoints"), Some(false));
        assert_eq!(
            left_off_by_switches(&all_alpha),
            [("AllAlpha", "KubeProxyNFTablesLocalhostNodePorts"), ("AllAlpha", "PreserveUDPFlowsTerminatingEndpoints")]
        );
        let (decided, errors) = check(&all_alpha);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(decided.acceleration, Some(true), "AllAlpha=true turns KubeProxyAcceleration on");
        // An explicit value wins over the switch; at its default the field decides.
        assert_eq!(check(&gates(&[("AllAlpha", true), ("KubeProxyAcceleration", false)])).0.acceleration, Some(false));
        assert_eq!(check(&gates(&[("AllAlpha", false)])).0.acceleration, None);
        assert!(
            left_off_by_switches(&gates(&[("AllAlpha", true), ("PreserveUDPFlowsTerminatingEndpoints", false)]))
                .iter()
                .all(|(_, gate)| *gate != "PreserveUDPFlowsTerminatingEndpoints")
        );
        for off in [gates(&[]), gates(&[("AllAlpha", false)]), gates(&[("AllBeta", true)])] {
            assert!(left_off_by_switches(&off).is_empty(), "{off:?}");
        }
        // AllBeta=false turns beta gates off, as upstream: kproxy cannot run without these, and says why.
        let (_, errors) = check(&gates(&[("AllBeta", false)]));
        let refused: Vec<&str> = errors.iter().map(|(gate, _)| gate.as_str()).collect();
        assert_eq!(refused, ["AllowServiceExternalIPs", "NFTablesNetlink"]);
        assert!(errors.iter().all(|(_, reason)| reason.contains("set by AllBeta=false")), "{errors:?}");
        assert!(
            check(&gates(&[("AllBeta", false), ("NFTablesNetlink", true), ("AllowServiceExternalIPs", true)]))
                .1
                .is_empty()
        );
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
