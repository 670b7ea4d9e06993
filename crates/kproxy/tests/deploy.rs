//! `kubectl`-style validation of `deploy/`: every document parses as its kind with k8s-openapi,
//! the ClusterRole covers every resource the Kubernetes source watches, and the ConfigMap holds a
//! KubeProxyConfiguration kproxy accepts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kproxy_state::Kind;
use serde_json::Value;

fn documents() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kproxy.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---")
        .filter(|d| d.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .map(|d| serde_saphyr::from_str::<Value>(d).unwrap())
        .collect()
}

fn one<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let mut found = docs.iter().filter(|d| d["kind"] == kind);
    let doc = found.next().unwrap_or_else(|| panic!("no {kind} in deploy/kproxy.yaml"));
    assert!(found.next().is_none(), "more than one {kind}");
    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{kind} does not parse: {e}"))
}

/// The API group and resource the Kubernetes source lists and watches for each kind.
fn watched(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::Service => ("", "services"),
        Kind::EndpointSlice => ("discovery.k8s.io", "endpointslices"),
        Kind::Node => ("", "nodes"),
        Kind::ServiceCidr => ("networking.k8s.io", "servicecidrs"),
    }
}

#[test]
fn every_document_parses_as_its_kind() {
    let docs = documents();
    assert_eq!(docs.len(), 5);
    let _: ServiceAccount = one(&docs, "ServiceAccount");
    let _: ClusterRoleBinding = one(&docs, "ClusterRoleBinding");
    let _: ClusterRole = one(&docs, "ClusterRole");
    let _: ConfigMap = one(&docs, "ConfigMap");
    let ds: DaemonSet = one(&docs, "DaemonSet");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true), "kproxy programs the node's own network namespace");
    assert_eq!(pod.service_account_name.as_deref(), Some("kproxy"));
}

#[test]
fn cluster_role_covers_every_watched_resource() {
    let role: ClusterRole = one(&documents(), "ClusterRole");
    let rules = role.rules.unwrap_or_default();
    for kind in Kind::ALL {
        let (group, resource) = watched(kind);
        for verb in ["list", "watch"] {
            let allowed = rules.iter().any(|r| {
                r.api_groups.iter().flatten().any(|g| g == group)
                    && r.resources.iter().flatten().any(|res| res == resource)
                    && r.verbs.iter().any(|v| v == verb)
            });
            assert!(allowed, "the ClusterRole does not allow {verb} on {group}/{resource} ({kind})");
        }
    }
}

#[test]
fn config_map_holds_a_configuration_kproxy_accepts() {
    let cm: ConfigMap = one(&documents(), "ConfigMap");
    let conf = cm.data.unwrap()["config.conf"].clone();
    let path = std::env::temp_dir().join(format!("kproxy-deploy-config-{}.yaml", std::process::id()));
    std::fs::write(&path, conf).unwrap();
    let flags = kproxy_config::Flags { config: Some(path.clone()), ..Default::default() };
    let config = kproxy_config::resolve(&flags);
    let _ = std::fs::remove_file(&path);
    let config = config.unwrap_or_else(|e| panic!("deploy ConfigMap rejected: {e}"));
    assert_eq!(config.mode, kproxy_config::ProxyMode::Nftables);
    assert!(matches!(config.detect_local, kproxy_config::DetectLocal::NodeCidr));
    assert!(config.take_over_kube_proxy, "the DaemonSet takes nodes over from kube-proxy");
}

#[test]
fn cluster_role_grants_only_reading_what_the_source_watches() {
    let role: ClusterRole = one(&documents(), "ClusterRole");
    let watched: Vec<_> = Kind::ALL.iter().map(|k| watched(*k)).collect();
    for rule in role.rules.unwrap_or_default() {
        for verb in &rule.verbs {
            assert!(verb == "list" || verb == "watch", "kproxy writes nothing and gets nothing: {verb}");
        }
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                assert!(
                    watched.contains(&(group.as_str(), resource.as_str())),
                    "{group}/{resource} is not something kproxy watches"
                );
            }
        }
    }
}

#[test]
fn the_proxy_runs_unprivileged_with_net_admin_and_net_raw_only_and_a_privileged_init_sets_the_host_up() {
    let ds: DaemonSet = one(&documents(), "DaemonSet");
    let pod = ds.spec.unwrap().template.spec.unwrap();
    let [proxy] = &pod.containers[..] else { panic!("one container: {:?}", pod.containers) };
    let sc = proxy.security_context.clone().unwrap();
    assert_ne!(sc.privileged, Some(true), "the proxy itself is not privileged");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.seccomp_profile.map(|p| p.type_), Some("RuntimeDefault".to_owned()));
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
    assert_eq!(caps.add, Some(vec!["NET_ADMIN".to_owned(), "NET_RAW".to_owned()]));
    let mounts: Vec<_> = proxy.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
    assert!(!mounts.contains(&"/lib/modules"), "no mode needs the host's modules: the kernel loads them itself");
    let [init] = &pod.init_containers.clone().unwrap()[..] else { panic!("one init container") };
    assert!(init.command.iter().flatten().any(|a| a == "--init-only"), "{:?}", init.command);
    assert_eq!(init.security_context.clone().unwrap().privileged, Some(true), "only it writes global sysctls");
    for image in [&proxy.image, &init.image] {
        let image = image.clone().unwrap();
        assert!(!image.ends_with(":latest") && image.contains(':'), "a pinned tag: {image}");
        assert_eq!(image, proxy.image.clone().unwrap(), "both run the same image");
    }
}
