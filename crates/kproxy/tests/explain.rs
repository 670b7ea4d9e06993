//! `kproxy explain` from manifests and from the API server, and `/debug/explain` of a running
//! (`--dry-run`) daemon with its `--server` client: the real binary, no root needed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Api, DryRun, apply_node_a, apply_one_endpoint_slice, apply_web_service, http_get, write_kubeconfig};

fn examples() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Runs `kproxy <args>`; returns stdout, panicking with stderr on failure.
fn kproxy(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kproxy")).args(args).output().unwrap();
    assert!(out.status.success(), "kproxy {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn explain_json(source: &[&str], from: &str, to: &str, protocol: &str) -> Value {
    let mut args = vec!["explain"];
    args.extend(source);
    args.extend(["--from", from, "--to", to, "--protocol", protocol, "-o", "json"]);
    serde_json::from_str(&kproxy(&args)).unwrap()
}

fn addresses(v: &Value) -> Vec<&str> {
    v["endpoints"].as_array().unwrap().iter().map(|e| e["address"].as_str().unwrap()).collect()
}

#[test]
fn explain_from_manifests_answers_each_destination_kind_and_verdict() {
    let dir = examples();
    let src = ["--manifests", dir.to_str().unwrap(), "--node", "node-a"];

    // NodePort on the node IP, eTP Cluster: any endpoint, masqueraded.
    let v = explain_json(&src, "198.51.100.7", "198.18.0.2:30080", "tcp");
    assert_eq!(v["service"], "demo/frontend:http");
    assert_eq!(v["verdict"], "dnat");
    assert_eq!(v["destination"], "nodePort");
    assert_eq!(addresses(&v), ["198.18.16.13:8080", "198.18.18.13:8080"]);
    assert_eq!(v["endpoints"][0]["probability"], 0.5);
    assert_eq!((&v["masquerade"], &v["source_seen"]), (&json!(true), &json!("198.18.0.2")));

    // LoadBalancer IP, eTP Local: the local endpoint only, the client's source kept.
    let v = explain_json(&src, "203.0.113.77", "203.0.113.12:80", "tcp");
    assert_eq!(v["service"], "demo/lb-local:http");
    assert_eq!(addresses(&v), ["198.18.16.17:8080"]);
    assert_eq!((&v["masquerade"], &v["source_seen"]), (&json!(false), &json!("203.0.113.77")));

    // eTP Local without a local endpoint: dropped; source ranges: dropped; no endpoints: rejected.
    assert_eq!(explain_json(&src, "203.0.113.77", "203.0.113.13:80", "tcp")["verdict"], "drop");
    let v = explain_json(&src, "203.0.113.7", "203.0.113.10:80", "tcp");
    assert_eq!((&v["verdict"], &v["source_ranges"]["source_allowed"]), (&json!("drop"), &json!(false)));
    assert_eq!(explain_json(&src, "198.51.100.7", "203.0.113.10:80", "tcp")["verdict"], "dnat");
    let v = explain_json(&src, "198.18.16.9", "198.18.128.25:80", "tcp");
    assert_eq!((&v["verdict"], &v["endpoints"], &v["source_seen"]), (&json!("reject"), &json!([]), &Value::Null));

    // UDP and SCTP ports; nothing at an address no service has.
    let v = explain_json(&src, "198.18.16.9", "198.18.128.11:53", "udp");
    assert_eq!((&v["service"], &v["verdict"]), (&json!("demo/dns:dns"), &json!("dnat")));
    assert_eq!(explain_json(&src, "198.18.16.9", "198.18.128.12:9999", "sctp")["service"], "demo/sctp-echo:echo");
    let v = explain_json(&src, "198.18.16.9", "192.0.2.200:80", "tcp");
    assert_eq!((&v["service"], &v["verdict"]), (&Value::Null, &json!("none")));

    // Affinity and acceleration are reported; the plain output is a paragraph and a table.
    assert_eq!(explain_json(&src, "198.18.16.9", "198.18.128.20:80", "tcp")["affinity_timeout_seconds"], 600);
    assert_eq!(explain_json(&src, "198.18.16.9", "198.18.128.29:5432", "tcp")["acceleration_eligible"], true);
    let plain = kproxy(&[
        "explain",
        "--manifests",
        dir.to_str().unwrap(),
        "--node",
        "node-a",
        "--from",
        "198.51.100.7",
        "--to",
        "198.18.0.2:30080",
    ]);
    assert!(plain.contains("NodePort of demo/frontend:http: DNAT"), "{plain}");
    assert!(plain.lines().any(|l| l.starts_with("ENDPOINT") && l.contains("PROBABILITY")), "{plain}");
    assert!(plain.contains("198.18.18.13:8080  0.500"), "{plain}");
}

/// The daemon's flags and `--config` act after `explain` as before it: `--cluster-cidr` makes
/// traffic from outside the cluster CIDR to a ClusterIP masqueraded (with no way to tell pods,
/// kube-proxy masquerades none).
#[test]
fn explain_takes_the_daemons_flags_and_config_after_the_subcommand() {
    let dir = examples();
    let dir = dir.to_str().unwrap();
    let query = ["--from", "203.0.113.7", "--to", "198.18.128.11:53", "--protocol", "udp", "-o", "json"];
    let run = |args: &[&str]| -> Value { serde_json::from_str(&kproxy(args)).unwrap() };
    let source = ["--manifests", dir, "--node", "node-a"];

    let plain = run(&[&["explain"][..], &source, &query].concat());
    assert_eq!((&plain["service"], &plain["masquerade"]), (&json!("demo/dns:dns"), &json!(false)), "{plain}");

    let cidr = ["--cluster-cidr", "198.18.16.0/20"];
    let after = run(&[&["explain"][..], &cidr, &source, &query].concat());
    assert_eq!(after["masquerade"], true, "--cluster-cidr after explain acts: {after}");
    let before = run(&[&cidr[..], &["explain"], &source, &query].concat());
    assert_eq!(after, before, "the same before the subcommand");

    // `--config` after the subcommand: the file's clusterCIDR acts the same.
    let scratch = std::env::temp_dir().join(format!("kproxy-explain-config-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let config = scratch.join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 198.18.16.0/20\n",
    )
    .unwrap();
    let config_arg = format!("--config={}", config.display());
    let from_file = run(&[&["explain", config_arg.as_str()][..], &source, &query].concat());
    let _ = std::fs::remove_dir_all(&scratch);
    assert_eq!(from_file["masquerade"], true, "--config after explain acts: {from_file}");

    // `plan` too.
    let plan: Value = serde_json::from_str(&kproxy(&[
        "plan",
        "--manifests",
        dir,
        "--node",
        "node-a",
        "-o",
        "json",
        "--cluster-cidr=198.18.16.0/20",
    ]))
    .unwrap();
    let text = plan.to_string();
    assert!(text.contains("198.18.16.0/20"), "plan --cluster-cidr after the subcommand acts: {text}");
}

#[test]
fn explain_reads_the_cluster_from_a_kubeconfig() {
    let api = Api::start();
    apply_node_a(&api.server);
    apply_web_service(&api.server, "p");
    apply_one_endpoint_slice(&api.server, "web", "p", "198.18.17.5", "node-b");
    let dir = std::env::temp_dir().join(format!("kproxy-explain-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = write_kubeconfig(&dir, &api.server.url());
    let v = explain_json(
        &["--kubeconfig", kubeconfig.to_str().unwrap(), "--node", "node-a"],
        "203.0.113.7",
        "198.18.128.10:80",
        "tcp",
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((&v["service"], &v["verdict"]), (&json!("demo/web:p"), &json!("dnat")));
    assert_eq!(addresses(&v), ["198.18.17.5:8080"]);
}

/// `GET /debug/explain` until it answers 200 with `done` true, or `within` passed.
fn explain_until(kproxy: &DryRun, query: &str, within: Duration, done: impl Fn(&Value) -> bool) -> (u16, Value) {
    let start = Instant::now();
    loop {
        let (status, body) = http_get(kproxy.metrics, &format!("/debug/explain?{query}")).unwrap_or((0, String::new()));
        let value: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if (status == 200 && done(&value)) || start.elapsed() > within {
            return (status, value);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn daemon_explains_from_the_plan_it_programmed_and_the_server_client_prints_the_same() {
    let api = Api::start();
    apply_node_a(&api.server);
    apply_web_service(&api.server, "p");
    let kproxy = DryRun::start(&api, "explain", &[]);
    kproxy.wait_synced();
    let query = "from=203.0.113.7&to=198.18.128.10:80&protocol=tcp";
    let (status, v) = explain_until(&kproxy, query, support::START, |v| v["verdict"] == "reject");
    assert_eq!((status, &v["verdict"]), (200, &json!("reject")), "no endpoints yet: {v}");

    // An endpoint arrives: the next answer comes from the plan synced with it.
    apply_one_endpoint_slice(&api.server, "web", "p", "198.18.17.5", "node-b");
    let (status, v) = explain_until(&kproxy, query, support::CHANGE, |v| v["verdict"] == "dnat");
    assert_eq!((status, &v["service"], &v["verdict"]), (200, &json!("demo/web:p"), &json!("dnat")), "{v}");
    assert_eq!(addresses(&v), ["198.18.17.5:8080"]);

    let server = kproxy.metrics.to_string();
    let client = explain_json(&["--server", &server], "203.0.113.7", "198.18.128.10:80", "tcp");
    assert_eq!(client, v, "the --server client prints what the daemon answered");
    let (status, _) = http_get(kproxy.metrics, "/debug/explain?from=203.0.113.7").unwrap();
    assert_eq!(status, 400);
}

/// The daemon's metrics listener on every address of a sandbox's node, as operators bind it for
/// Prometheus: `/debug/explain` answers the node itself and refuses another host (403) unless
/// `--explain-access=any`; `off` answers nobody (404). Root: network namespaces.
#[test]
fn daemon_explains_to_the_node_itself_and_to_others_only_when_asked() {
    use kproxy_testbed::{Testbed, topology::NODE_IP_V4};
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let api = support::api_in(tb.node());
    apply_node_a(&api.server);
    apply_web_service(&api.server, "p");
    let query = "/debug/explain?from=203.0.113.7&to=198.18.128.10:80";
    for (access, from_node, from_outside) in [("local", 200, 403), ("any", 200, 200), ("off", 404, 404)] {
        let port = 10249 + u16::from(access == "any") + 2 * u16::from(access == "off");
        let args = vec![
            "--dry-run".to_owned(),
            "--hostname-override=node-a".into(),
            format!("--metrics-bind-address=0.0.0.0:{port}"),
            format!("--healthz-bind-address=127.0.0.1:{}", port + 100),
            format!("--explain-access={access}"),
        ];
        let (_kproxy, dir) =
            support::kproxy_in(tb.node().name(), &api.server.url(), &format!("explain-{access}"), &args);
        let on_node = std::net::SocketAddr::new(NODE_IP_V4.into(), port);
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        // Until the first sync, explain answers 503: wait for the node's own answer to settle.
        let start = Instant::now();
        let node_status = loop {
            let status = tb.node().run_in(|| http_get(local, query)).unwrap().map_or(0, |(s, _)| s);
            if status == from_node || start.elapsed() > support::START {
                break status;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(node_status, from_node, "--explain-access={access}, from the node over loopback");
        let via_address = tb.node().run_in(|| http_get(on_node, query)).unwrap().map_or(0, |(s, _)| s);
        assert_eq!(via_address, from_node, "--explain-access={access}, from the node to its own address");
        let outside = tb.external().run_in(|| http_get(on_node, query)).unwrap().map_or(0, |(s, _)| s);
        assert_eq!(outside, from_outside, "--explain-access={access}, from another host");
        // The metrics themselves answer everyone who reaches them, as kube-proxy's do.
        let metrics = tb.external().run_in(|| http_get(on_node, "/metrics")).unwrap().map_or(0, |(s, _)| s);
        assert_eq!(metrics, 200);
        let _ = std::fs::remove_dir_all(dir);
    }
}
