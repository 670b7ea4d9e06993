//! `--write-config-to`: the written document reads back to the same configuration.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common;

use common::{resolve_ok, with_config};
use kproxy_config::ProxyConfig;

fn round_trip(original: &ProxyConfig) -> ProxyConfig {
    let yaml = original.to_kube_proxy_configuration_yaml().unwrap();
    let dir = std::env::temp_dir().join(format!("kproxy-config-write-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("written.yaml");
    original.write_config_file(&path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), yaml);
    let back = kproxy_config::resolve(&common::flags(&["--config", path.to_str().unwrap()]));
    std::fs::remove_dir_all(&dir).unwrap();
    match back {
        Ok(c) => c,
        Err(e) => panic!("written config does not read back: {e}\n{yaml}"),
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

fn comparable(mut c: ProxyConfig) -> ProxyConfig {
    c.config_file = None;
    c.warnings.clear();
    c.client_connection.master = None;
    c
}

#[test]
fn default_config_round_trips() {
    let original = resolve_ok(&[]);
    assert_eq!(comparable(round_trip(&original)), comparable(original));
}

#[test]
fn tuned_configs_round_trip() {
    for name in ["tuned.json", "ipvs.yaml", "kubeadm.yaml"] {
        let original = with_config(name, &[]).unwrap();
        assert_eq!(comparable(round_trip(&original)), comparable(original), "{name}");
    }
    let flags = resolve_ok(&[
        "--proxy-mode=iptables",
        "--detect-local-mode=BridgeInterface",
        "--pod-bridge-interface=cbr0",
        "--iptables-sync-period=1m30s",
        "--masquerade-all",
        "--no-masquerade-cidrs=198.18.0.0/15",
        "--vmodule=proxier=4",
    ]);
    assert_eq!(comparable(round_trip(&flags)), comparable(flags));
}

#[test]
fn written_yaml_looks_like_upstream() {
    let yaml = resolve_ok(&["--iptables-sync-period=90s"]).to_kube_proxy_configuration_yaml().unwrap();
    for line in [
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1",
        "kind: KubeProxyConfiguration",
        "mode: nftables",
        "syncPeriod: 1m30s",
        "tcpEstablishedTimeout: 24h0m0s",
        "configSyncPeriod: 15m0s",
        "healthzBindAddress: 0.0.0.0:10256",
        "detectLocalMode: ClusterCIDR",
    ] {
        assert!(yaml.lines().any(|l| l.trim() == line), "missing {line:?} in\n{yaml}");
    }
    let top_keys: Vec<&str> =
        yaml.lines().filter(|l| !l.starts_with(' ') && l.contains(':')).map(|l| l.split(':').next().unwrap()).collect();
    let mut sorted = top_keys.clone();
    sorted.sort();
    assert_eq!(top_keys, sorted, "keys are sorted like Go's encoder writes them");
}
