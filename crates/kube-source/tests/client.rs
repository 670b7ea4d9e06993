//! Client construction: `--kubeconfig` and `clientConnection` qps/burst, against the fake API
//! server (content types: `tests/encodings.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kproxy_kube_source::fake::FakeApiServer;
use kproxy_kube_source::{client, client_from_config};
use kproxy_state::Kind;
use kube::Api;
use kube::api::ListParams;

async fn list_services(client: kube::Client, times: usize) -> Duration {
    let api: Api<Service> = Api::all(client);
    let start = Instant::now();
    for _ in 0..times {
        let list = api.list(&ListParams::default()).await.unwrap();
        assert_eq!(list.items.len(), 1);
    }
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qps_and_burst_space_requests() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(Kind::Service, support::service("prod", "a", "198.18.0.1"));

    // Burst 1 at 4 qps: 6 requests need 5 refills of 250 ms each. A negative qps turns the limiter
    // off, as in client-go: side by side (same server, same load), the same 6 requests of an
    // unlimited client are done before the limited client's. (How long each token takes is the
    // token bucket's own unit test, on a clock of its own: src/rate_limit.rs.)
    let limited = client_from_config(server.kube_config().unwrap(), 4.0, 1).unwrap();
    let unlimited = client_from_config(server.kube_config().unwrap(), -1.0, 0).unwrap();
    let (limited, unlimited) = tokio::join!(list_services(limited, 6), list_services(unlimited, 6));
    assert!(limited >= Duration::from_millis(1240), "rate limit not applied: {limited:?}");
    assert!(unlimited < limited, "unexpectedly limited: {unlimited:?}, the limited client {limited:?}");
    assert_eq!(server.list_count(Kind::Service), 12);
}

#[tokio::test]
async fn kubeconfig_file_names_the_server() {
    let server = FakeApiServer::start().await.unwrap();
    server.apply(Kind::Service, support::service("prod", "a", "198.18.0.1"));
    let dir = std::env::temp_dir().join(format!("kproxy-kube-source-{}-{}", std::process::id(), server.addr().port()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kubeconfig");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
         clusters:\n- name: fake\n  cluster:\n    server: {}\n\
         users:\n- name: proxy\n  user:\n    token: not-checked\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: proxy\n",
        server.url()
    );
    std::fs::write(&path, kubeconfig).unwrap();

    let result = client(Some(&path), 5.0, 10).await;
    std::fs::remove_dir_all(&dir).unwrap();
    // One list through the kubeconfig's server, answered.
    list_services(result.unwrap(), 1).await;
    assert_eq!(server.list_count(Kind::Service), 1);
}
