//! Both encodings, every way of listing, against the fake API server: what
//! `clientConnection.contentType` / `acceptContentTypes` ask for is what the server is asked for
//! and what is read, and the state is the same whichever it is.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use kproxy_kube_source::{ContentTypes, ListMode};
use kproxy_state::Kind;
use serde_json::json;
use support::{Harness, bookmark_then_compact_and_drop, key, node, service, service_cidr, slice};

const MODES: [ListMode; 3] = [ListMode::Streaming, ListMode::WatchCache, ListMode::Paginated(2)];

fn seed(h: &Harness) {
    h.server.apply(Kind::Service, service("prod", "a", "198.18.0.1"));
    h.server.apply(Kind::Service, service("prod", "b", "198.18.0.2"));
    h.server.apply(Kind::Service, service("prod", "c", "198.18.0.3"));
    h.server.apply(Kind::EndpointSlice, slice("prod", "a-1", "a", "198.18.1.1"));
    h.server.apply(Kind::Node, node(support::NODE, "198.19.0.0/24"));
    h.server.apply(Kind::ServiceCidr, service_cidr("kubernetes", "198.18.0.0/15"));
}

/// Starts the source asking for `content_types` in `mode`, lists, follows a change and a delete,
/// a malformed object, a bookmark, and a `410 Gone` relist; the services it ends with.
async fn run(content_types: ContentTypes, mode: ListMode) -> (Harness, Vec<String>) {
    let mut h = Harness::new().await;
    seed(&h);
    let mut bad = service("prod", "bad", "198.18.0.9");
    bad["spec"]["ports"] = json!("eighty");
    h.server.apply(Kind::Service, bad);
    let client = kube::Client::try_from(h.server.kube_config().unwrap()).unwrap();
    h.start_source_configured(client, |opts| {
        opts.list_mode = mode;
        opts.content_types = content_types;
    });
    h.synced().await;
    assert_eq!(h.services(), ["prod/a", "prod/b", "prod/c"], "{mode:?}");
    assert_eq!(h.stats.malformed_objects(Kind::Service), 1, "{mode:?}: the bad one is counted");
    h.watches_open(4).await;

    h.server.apply(Kind::Service, service("prod", "d", "198.18.0.4"));
    h.until(|s| s.service(&key("prod", "d")).is_some()).await;
    h.server.delete(Kind::Service, "prod", "a");
    h.until(|s| s.service(&key("prod", "a")).is_none()).await;

    // The watch resumes from the bookmark's version: no relist.
    let lists = h.stats.lists(Kind::Service);
    bookmark_then_compact_and_drop(&h.server).await;
    h.server.apply(Kind::Service, service("prod", "e", "198.18.0.5"));
    h.until(|s| s.service(&key("prod", "e")).is_some()).await;
    assert_eq!(h.stats.lists(Kind::Service), lists, "{mode:?}: resumed from the bookmark");

    // 410 Gone: a relist, which finds what was deleted meanwhile.
    h.server.expire_watches();
    h.server.compact();
    h.server.delete(Kind::Service, "prod", "b");
    h.until(|s| s.service(&key("prod", "b")).is_none()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(h.stats.lists(Kind::Service) > lists, "{mode:?}: relisted after 410");
    let services = h.services();
    (h, services)
}

#[tokio::test]
async fn protobuf_is_asked_for_and_read_in_every_list_mode() {
    for mode in MODES {
        let (h, services) = run(ContentTypes::protobuf(), mode).await;
        assert_eq!(services, ["prod/c", "prod/d", "prod/e"], "{mode:?}");
        let (protobuf, json) = h.server.answers_by_encoding();
        assert!(protobuf >= 8, "{mode:?}: every list and watch in protobuf ({protobuf})");
        assert_eq!(json, 0, "{mode:?}: none in JSON");
        assert_eq!(h.stats.streaming_fallbacks(Kind::Service), 0, "{mode:?}");
    }
}

#[tokio::test]
async fn json_asked_for_is_json_and_reads_the_same() {
    for mode in MODES {
        let (h, services) = run(ContentTypes::json(), mode).await;
        assert_eq!(services, ["prod/c", "prod/d", "prod/e"], "{mode:?}");
        let (protobuf, json) = h.server.answers_by_encoding();
        assert_eq!(protobuf, 0, "{mode:?}");
        assert!(json >= 8, "{mode:?}: {json}");
    }
}

#[tokio::test]
async fn accept_content_types_wins_over_content_type_as_in_client_go() {
    let accept =
        ContentTypes::from_client_connection("application/vnd.kubernetes.protobuf", "application/json").unwrap();
    let mut h = Harness::new().await;
    seed(&h);
    let client = kube::Client::try_from(h.server.kube_config().unwrap()).unwrap();
    h.start_source_configured(client, |opts| opts.content_types = accept);
    h.synced().await;
    assert_eq!(h.services(), ["prod/a", "prod/b", "prod/c"]);
    assert_eq!(h.server.answers_by_encoding().0, 0, "acceptContentTypes said JSON");
}

#[tokio::test]
async fn errors_come_back_as_statuses_in_protobuf_too() {
    // A streaming list refused `422 Invalid` with a protobuf Status: the source reads the code and
    // falls back to list + watch, as it does in JSON.
    let mut h = Harness::new().await;
    seed(&h);
    h.server.set_streaming_lists(kproxy_kube_source::fake::StreamingLists::WatchListOff);
    h.start_source();
    h.synced().await;
    assert_eq!(h.services(), ["prod/a", "prod/b", "prod/c"]);
    assert!(h.stats.streaming_fallbacks(Kind::Service) >= 1, "the 422 was read as a refusal");
    assert_eq!(h.server.answers_by_encoding().1, 0, "all in protobuf");
}
