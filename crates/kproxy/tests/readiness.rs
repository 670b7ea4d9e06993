//! `/readyz` means "this node is programmed": the real daemon (`--dry-run`, no root) answers 503
//! while it has not synced (here: its API server never answers) although `/healthz` and `/livez`
//! are 200 from the start, as upstream's are; 200 once the first sync is done.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::time::{Duration, Instant};

use support::{Api, DryRun, http_get};

/// Polls `path` until it answers `status` or `within` passed; returns the last status.
fn status_within(addr: std::net::SocketAddr, path: &str, status: u16, within: Duration) -> Option<u16> {
    let start = Instant::now();
    loop {
        let got = http_get(addr, path).map(|(s, _)| s);
        if got == Some(status) || start.elapsed() > within {
            return got;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn readyz_is_503_until_the_first_sync_while_healthz_and_livez_are_200() {
    // Nothing listens there: the initial lists never come, nothing is programmed.
    let silent = support::free_port();
    let kproxy = DryRun::start_with_server(&format!("http://{silent}"), "readyz-unsynced", &[]);
    assert_eq!(status_within(kproxy.healthz, "/healthz", 200, support::START), Some(200), "/healthz, as upstream");
    assert_eq!(http_get(kproxy.healthz, "/livez").map(|(s, _)| s), Some(200));
    for _ in 0..10 {
        assert_eq!(http_get(kproxy.healthz, "/readyz").map(|(s, _)| s), Some(503), "nothing is programmed");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(kproxy);

    let api = Api::start();
    support::apply_node_a(&api.server);
    support::apply_web_service(&api.server, "p");
    support::apply_one_endpoint_slice(&api.server, "web", "p", "198.18.16.5", "node-a");
    let kproxy = DryRun::start(&api, "readyz-synced", &[]);
    kproxy.wait_synced();
    let (status, body) = http_get(kproxy.healthz, "/readyz").unwrap();
    assert_eq!(status, 200, "programmed: {body}");
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap()["status"]["IPv4"]["healthy"], true, "{body}");
}
