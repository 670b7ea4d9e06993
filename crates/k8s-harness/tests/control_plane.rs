//! The harness against the real kube-apiserver v1.36.2: each etcd starts, the API server
//! authenticates and authorizes as configured, restarts keep state, and a streaming list on
//! etcd 3.5.1 fails the way kproxy must survive.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

use std::time::{Duration, Instant};

use kproxy_k8s_harness::{ControlPlane, ControlPlaneOptions, Identity, require_k8s};

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
