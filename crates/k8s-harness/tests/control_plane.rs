//! The harness against the real kube-apiserver v1.36.2: each etcd starts, the API server
//! authenticates and authorizes as configured, restarts keep state, a streaming list on etcd
//! 3.5.1 fails the way kproxy must survive (and WatchList off refuses it), the controller-manager
//! and scheduler start, a plane runs inside a network namespace, and nothing outlives a test.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

use std::time::{Duration, Instant};

use kproxy_k8s_harness::{ControlPlane, ControlPlaneOptions, Etcd, Identity, require_k8s};

fn start(options: ControlPlaneOptions) -> Option<ControlPlane> {
    let binaries = require_k8s()?;
    let began = Instant::now();
    let plane = ControlPlane::start(&binaries, options).expect("control plane starts");
    eprintln!("control plane ({:?}) ready in {:?}", plane.options().etcd, began.elapsed());
    Some(plane)
}

#[test]
fn etcd_3_6_control_plane_serves_the_admin_and_denies_an_unprivileged_user() {
    let Some(plane) = start(ControlPlaneOptions::default()) else { return };
    // The API server's bootstrap controller creates the `kubernetes` Service shortly after /readyz.
    let deadline = Instant::now() + Duration::from_secs(20);
    let admin = loop {
        let admin = plane.get(Some(&Identity::admin()), "/api/v1/namespaces/default/services").expect("GET as admin");
        assert_eq!(admin.status, 200, "{}", admin.body);
        if admin.body.contains("\"kubernetes\"") || Instant::now() > deadline {
            break admin;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        admin.body.contains("\"kubernetes\""),
        "the default namespace lists the kubernetes Service: {}",
        admin.body
    );
    let created = plane.kubectl(&["create", "namespace", "harness-check"]).expect("kubectl as admin");
    assert!(created.contains("namespace/harness-check created"), "{created}");
    let denied = plane.get(Some(&Identity::unprivileged("mallory")), "/api/v1/services").expect("GET as mallory");
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert!(denied.body.contains("User \\\"mallory\\\" cannot list resource \\\"services\\\""), "{}", denied.body);
}

/// A streaming list (KEP-3157) of Services, bounded so that a stream the server keeps open ends.
const STREAMING_LIST: &str = "/api/v1/services?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=2";

fn events(body: &str) -> Vec<serde_json::Value> {
    body.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).expect("a watch event")).collect()
}

#[test]
fn etcd_3_6_api_server_serves_a_streaming_list_ending_in_the_initial_events_end_bookmark() {
    let Some(plane) = start(ControlPlaneOptions::default()) else { return };
    let response = plane.get(Some(&Identity::admin()), STREAMING_LIST).expect("streaming list");
    assert_eq!(response.status, 200, "{}", response.body);
    let events = events(&response.body);
    assert!(events.iter().all(|e| e["type"] != "ERROR"), "{events:?}");
    let end = events.iter().position(|e| {
        e["type"] == "BOOKMARK" && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
    });
    assert!(end.is_some(), "no initial-events-end bookmark: {events:?}");
}

#[test]
fn etcd_3_5_1_api_server_answers_a_streaming_list_with_an_error_event_inside_the_watch() {
    let Some(plane) = start(ControlPlaneOptions { etcd: Etcd::V3_5_1, ..Default::default() }) else { return };
    let response = plane.get(Some(&Identity::admin()), STREAMING_LIST).expect("streaming list");
    // The watch itself is accepted; the failure comes as an event inside it.
    assert_eq!(response.status, 200, "{}", response.body);
    let events = events(&response.body);
    let error = events.iter().find(|e| e["type"] == "ERROR").unwrap_or_else(|| panic!("no ERROR event: {events:?}"));
    assert_eq!(error["object"]["code"], 500, "{error}");
    assert!(error["object"]["message"].as_str().is_some_and(|m| m.contains("RequestWatchProgress")), "{error}");
    // An ordinary list works on the same server: the fallback kproxy must take.
    let list = plane.get(Some(&Identity::admin()), "/api/v1/services").expect("list");
    assert_eq!(list.status, 200, "{}", list.body);
    assert!(list.body.contains("\"kind\":\"ServiceList\""), "{}", list.body);
}

#[test]
fn watch_list_gate_off_refuses_a_streaming_list_at_the_start() {
    let Some(plane) = start(ControlPlaneOptions { watch_list: false, ..Default::default() }) else { return };
    let response = plane.get(Some(&Identity::admin()), STREAMING_LIST).expect("streaming list");
    assert_eq!(response.status, 422, "{}", response.body);
    assert!(
        response.body.contains("sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"),
        "{}",
        response.body
    );
    // An ordinary watch still works.
    let watch = plane.get(Some(&Identity::admin()), "/api/v1/services?watch=1&timeoutSeconds=1").expect("watch");
    assert_eq!(watch.status, 200, "{}", watch.body);
}

#[test]
fn api_server_restart_keeps_its_port_and_etcd_state() {
    let Some(mut plane) = start(ControlPlaneOptions::default()) else { return };
    let url = plane.url();
    plane.kubectl(&["create", "namespace", "before-restart"]).expect("create");
    plane.stop_apiserver();
    assert!(!plane.apiserver_running());
    assert!(plane.get(None, "/readyz").is_err(), "a stopped API server still answers");
    let began = Instant::now();
    plane.start_apiserver().expect("start again");
    eprintln!("API server restarted in {:?}", began.elapsed());
    assert_eq!(plane.url(), url);
    let got = plane.kubectl(&["get", "namespace", "before-restart", "-o", "name"]).expect("get");
    assert_eq!(got.trim(), "namespace/before-restart");
}

#[test]
fn saved_etcd_seeds_a_new_control_plane_with_the_objects_written_before() {
    let Some(mut plane) = start(ControlPlaneOptions::default()) else { return };
    plane.kubectl(&["create", "namespace", "seeded"]).expect("create namespace");
    plane.kubectl(&["-n", "seeded", "create", "service", "clusterip", "web", "--tcp=80:8080"]).expect("create service");
    let saved = tempfile::tempdir().expect("tempdir");
    let seed = saved.path().join("etcd");
    plane.save_etcd(&seed).expect("save etcd");
    // The plane that saved runs on: the API server came back on the same etcd.
    plane.kubectl(&["create", "namespace", "after-save"]).expect("create after saving");
    drop(plane);

    let seeded = start(ControlPlaneOptions { etcd_seed: Some(seed), ..Default::default() }).expect("binaries");
    let got = seeded.kubectl(&["-n", "seeded", "get", "service", "web", "-o", "jsonpath={.spec.ports[0].targetPort}"]);
    assert_eq!(got.expect("the saved Service").trim(), "8080");
    // Written after the save: not in the seed.
    let after = seeded.kubectl(&["get", "namespace", "after-save"]);
    assert!(after.is_err(), "a namespace created after the save is in the seed: {after:?}");
}

#[test]
fn controller_manager_and_scheduler_start_and_service_account_tokens_authenticate() {
    let Some(mut plane) = start(ControlPlaneOptions::default()) else { return };
    let began = Instant::now();
    plane.start_controller_manager(Default::default()).expect("kube-controller-manager");
    plane.start_scheduler(&[]).expect("kube-scheduler");
    eprintln!("controller-manager and scheduler ready in {:?}", began.elapsed());
    plane.kubectl(&["create", "namespace", "sa-check"]).expect("namespace");
    // The service-account controller (controller-manager) creates `default` in a new namespace.
    let deadline = Instant::now() + Duration::from_secs(30);
    while plane.kubectl(&["-n", "sa-check", "get", "serviceaccount", "default"]).is_err() {
        assert!(Instant::now() < deadline, "no default ServiceAccount in sa-check");
        std::thread::sleep(Duration::from_millis(250));
    }
    // A token the API server signs with the harness's key authenticates as that account.
    let token = plane.kubectl(&["-n", "sa-check", "create", "token", "default"]).expect("token");
    let whoami = plane
        .kubectl(&[
            "--token",
            token.trim(),
            "--kubeconfig=/dev/null",
            "--server",
            &plane.url(),
            "--certificate-authority",
            &plane.pki().ca_cert_file().display().to_string(),
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .expect("whoami");
    assert_eq!(whoami.trim(), "system:serviceaccount:sa-check:default");
}

fn running(pid: u32) -> bool {
    // Children are reaped by the harness, so a stopped one has no /proc entry left.
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_control_plane_dropped_during_a_panic_leaves_no_process_and_no_work_dir() {
    let Some(binaries) = require_k8s() else { return };
    let (tx, rx) = std::sync::mpsc::channel();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let plane = ControlPlane::start(&binaries, ControlPlaneOptions::default()).unwrap();
        tx.send((plane.pids(), plane.work_dir().to_path_buf())).unwrap();
        panic!("a test failing while its control plane runs");
    }));
    assert!(unwound.is_err());
    let (pids, work) = rx.recv().unwrap();
    assert_eq!(pids.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), ["etcd", "kube-apiserver"]);
    for (name, pid) in pids {
        assert!(!running(pid), "{name} (pid {pid}) survived the panic");
    }
    let kept = std::env::var(kproxy_k8s_harness::KEEP_ENV).is_ok_and(|v| v == "1");
    assert_eq!(work.exists(), kept, "{} kept: {kept}", work.display());
}

#[test]
fn control_plane_processes_die_with_the_thread_that_started_them() {
    let Some(binaries) = require_k8s() else { return };
    // A plane never dropped (as if its test process were killed): the kernel's parent-death
    // signal still ends its processes once the starting thread is gone.
    let (pids, work) = std::thread::spawn(move || {
        let plane = ControlPlane::start(&binaries, ControlPlaneOptions::default()).unwrap();
        let leaked = (plane.pids(), plane.work_dir().to_path_buf());
        std::mem::forget(plane);
        leaked
    })
    .join()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").split_whitespace().next().unwrap_or("").to_owned();
        !state.is_empty() && state != "Z"
    };
    while pids.iter().any(|(_, pid)| alive(*pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&work);
    // Unreaped children (the plane was forgotten) linger as zombies: `alive` reads the state.
    for (name, pid) in pids {
        assert!(!alive(pid), "{name} (pid {pid}) outlived the thread that started it");
    }
}

#[test]
fn control_plane_in_a_network_namespace_serves_there_and_advertises_its_bind_address() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let Some(binaries) = require_k8s() else { return };
    let ns = kproxy_testbed::Netns::new("k8s-cp").unwrap();
    ns.ip(["addr", "add", "198.18.250.1/32", "dev", "lo"]).unwrap();
    let bind: std::net::IpAddr = "198.18.250.1".parse().unwrap();
    let plane =
        ControlPlane::start(&binaries, ControlPlaneOptions { netns: Some(ns.path()), bind, ..Default::default() })
            .unwrap();
    assert_eq!(plane.url(), format!("https://198.18.250.1:{}", plane.port()));
    // Not a loopback address: the `kubernetes` Service gets the API server as its endpoint.
    let deadline = Instant::now() + Duration::from_secs(20);
    let endpoint = loop {
        let got = plane.kubectl(&[
            "-n",
            "default",
            "get",
            "endpointslice",
            "kubernetes",
            "-o",
            "jsonpath={.endpoints[0].addresses[0]}:{.ports[0].port}",
        ]);
        match got {
            Ok(text) if !text.trim().is_empty() => break text,
            _ if Instant::now() > deadline => panic!("no kubernetes EndpointSlice: {got:?}"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert_eq!(endpoint.trim(), format!("198.18.250.1:{}", plane.port()));
    // It listens inside the namespace, not in the root one (checked by listing listeners: no
    // packet is sent to the address from outside).
    let filter = format!("sport = :{}", plane.port());
    let inside = ns.exec_ok("ss", &["-ltnH", &filter]).unwrap();
    assert!(inside.contains(&format!("198.18.250.1:{}", plane.port())), "{inside}");
    let root = std::process::Command::new("ss").args(["-ltnH", &filter]).output().unwrap();
    assert!(!String::from_utf8_lossy(&root.stdout).contains("198.18.250.1"), "listening in the root namespace");
}

#[test]
fn start_refuses_a_bad_service_cidr_or_node_port_range_before_starting_anything() {
    let Some(binaries) = require_k8s() else { return };
    let bad_cidr = ControlPlane::start(
        &binaries,
        ControlPlaneOptions { service_cidr: "10.0.0.0/33".into(), ..Default::default() },
    );
    assert!(matches!(bad_cidr, Err(kproxy_k8s_harness::Error::Refused(_))), "{bad_cidr:?}");
    let bad_range =
        ControlPlane::start(&binaries, ControlPlaneOptions { node_port_range: (32000, 31000), ..Default::default() });
    assert!(matches!(bad_range, Err(kproxy_k8s_harness::Error::Refused(_))), "{bad_range:?}");
}
