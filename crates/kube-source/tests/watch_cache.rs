//! Watch-cache lists (`ListMode::WatchCache`, and the fallback of a streaming list) against the
//! fake API server: objects handed over as the list's body arrives, a malformed one skipped by
//! name, `410 Gone` relisting, bookmarks, the label selector, the client rate limit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use kproxy_kube_source::fake::{FakeApiServer, StreamingLists};
use kproxy_kube_source::{ListMode, client_from_config};
use kproxy_state::{Change, Kind};
use serde_json::json;
use support::*;

fn client(server: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(server.kube_config().unwrap()).unwrap()
}

fn services(server: &FakeApiServer, n: usize) {
    for i in 0..n {
        let ip = format!("198.18.{}.{}", i / 250, i % 250 + 1);
        server.apply(Kind::Service, service("prod", &format!("s{i:05}"), &ip));
    }
}

/// A source in watch-cache mode on `h`'s server.
fn start(h: &mut Harness) {
    let client = client(&h.server);
    h.start_source_with(client, ListMode::WatchCache);
}

#[tokio::test]
async fn a_watch_cache_list_is_handed_over_object_by_object_while_its_body_is_still_arriving() {
    let mut h = Harness::new().await;
    services(&h.server, 20);
    let mut other = service("prod", "other-proxy", "198.18.9.1");
    other["metadata"]["labels"] = json!({"service.kubernetes.io/service-proxy-name": "someone-else"});
    h.server.apply(Kind::Service, other);
    h.server.set_list_item_delay(Duration::from_millis(50));
    start(&mut h);

    let first = loop {
        let change = h.next().await;
        if matches!(&change, Change::Applied(o) if o.kind() == Kind::Service) {
            break change;
        }
    };
    // The first Service reached the consumer before the server had written the rest of the list.
    assert_eq!(names(&first), ev(Kind::Service, "applied", &["prod/s00000"]));
    assert_eq!(h.server.list_count(Kind::Service), 1);
    assert_eq!(h.server.lists_sent(Kind::Service), 0, "the list body had not ended yet");

    h.until(|s| s.is_synced(Kind::Service)).await;
    assert_eq!(h.server.lists_sent(Kind::Service), 1);
    let listed = first_listing(&h.seen, Kind::Service);
    assert_eq!(listed.len(), 20, "the label selector left out the other proxy's Service: {listed:?}");
    assert!(!listed.contains(&"prod/other-proxy".to_owned()));
    assert_eq!(h.server.streamed_lists(Kind::Service), 0, "no streaming list in watch-cache mode");
    assert_eq!(h.stats.lists(Kind::Service), 1);

    // The watch from the list's resource version delivers what changes after it.
    h.server.set_list_item_delay(Duration::ZERO);
    h.synced().await;
    h.watches_open(4).await;
    h.server.delete(Kind::Service, "prod", "s00007");
    assert_eq!(names(&h.next().await), ev(Kind::Service, "deleted", &["prod/s00007"]));
    assert_eq!(h.server.list_count(Kind::Service), 1, "no relist");
}

/// How many times one plain list of the same objects (measured in the test, on this machine,
/// now) the source's start on a large list may take before the test calls it stuck: the start
/// is that list, decoded object by object into the state. (`PATIENCE` alone, 15 s, was too short
/// at a load of 48 on two cores.)
const LARGE_LIST_PACE: u32 = 10;

#[tokio::test]
async fn a_large_watch_cache_list_arrives_whole_in_one_request() {
    let mut h = Harness::new().await;
    services(&h.server, 10_000);
    let api: kube::Api<k8s_openapi::api::core::v1::Service> = kube::Api::all(client(&h.server));
    let listing = Instant::now();
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 10_000);
    let listed_in = listing.elapsed();
    let lists_before = h.server.list_count(Kind::Service);
    let started = Instant::now();
    start(&mut h);
    h.synced_within(PATIENCE.max(listed_in * LARGE_LIST_PACE)).await;
    eprintln!("10,000 Services: one list {listed_in:?}, the source's start {:?}", started.elapsed());
    let listed = first_listing(&h.seen, Kind::Service);
    assert_eq!(listed.len(), 10_000);
    assert_eq!(listed.first().map(String::as_str), Some("prod/s00000"));
    assert_eq!(listed.last().map(String::as_str), Some("prod/s09999"));
    assert_eq!(h.state.services().count(), 10_000);
    assert_eq!(h.server.list_count(Kind::Service), lists_before + 1, "one list request");
    assert_eq!(h.stats.malformed_objects(Kind::Service), 0);
}

#[tokio::test]
async fn a_malformed_object_in_a_watch_cache_list_is_skipped_by_name_and_the_list_goes_on() {
    let mut h = Harness::new().await;
    h.server.apply(Kind::Service, service("prod", "a", "198.18.0.1"));
    let mut bad = service("prod", "b", "198.18.0.2");
    bad["spec"]["ports"] = json!("eighty");
    h.server.apply(Kind::Service, bad);
    h.server.apply(Kind::Service, service("prod", "c", "198.18.0.3"));
    start(&mut h);
    h.synced().await;
    let services: Vec<_> = h.seen.iter().map(names).filter(|(kind, ..)| *kind == Kind::Service).collect();
    assert_eq!(
        services,
        [
            ev(Kind::Service, "list started", &[]),
            ev(Kind::Service, "applied", &["prod/a"]),
            ev(Kind::Service, "unreadable", &["prod/b"]),
            ev(Kind::Service, "applied", &["prod/c"]),
            ev(Kind::Service, "list ended", &[]),
        ]
    );
    assert_eq!(h.stats.malformed_objects(Kind::Service), 1);
    assert_eq!(h.stats.watch_errors(Kind::Service), 0, "the list did not fail");
    assert_eq!(h.server.list_count(Kind::Service), 1);
    assert_eq!(h.services(), ["prod/a", "prod/c"]);
}

#[tokio::test]
async fn gone_makes_a_watch_cache_relist_that_removes_what_went_meanwhile() {
    let mut h = Harness::new().await;
    services(&h.server, 3);
    start(&mut h);
    h.synced().await;
    h.watches_open(4).await;

    // While the server is down a Service goes and the history is compacted: the watch cannot
    // resume from its version.
    h.server.stop().await;
    h.server.delete(Kind::Service, "prod", "s00002");
    h.server.compact();
    h.server.restart().await.unwrap();
    h.until(|s| s.service(&key("prod", "s00002")).is_none()).await;
    h.until_quiet(Duration::from_millis(300)).await;
    assert_eq!(h.gone, [(Kind::Service, key("prod", "s00002"))], "found gone by the relist");
    assert!(!h.seen.iter().any(|c| matches!(c, Change::Deleted(..))), "no watch event deleted it");
    assert_eq!(h.server.list_count(Kind::Service), 2);
    assert_eq!(h.stats.lists(Kind::Service), 2);

    // An ERROR 410 event on an open watch relists too.
    h.watches_open(4).await;
    h.server.apply(Kind::Service, service("prod", "e", "198.18.0.6"));
    assert_eq!(names(&h.next().await), ev(Kind::Service, "applied", &["prod/e"]));
    h.server.compact();
    h.server.expire_watches();
    let mut relisted = h.until_change(|c| completes_listing(c, Kind::Service)).await;
    relisted.extend(h.until_quiet(Duration::from_millis(300)).await);
    let relisted: Vec<_> = relisted.iter().map(names).collect();
    assert!(relisted.contains(&ev(Kind::Service, "list started", &[])), "{relisted:?}");
    assert!(relisted.contains(&ev(Kind::Service, "applied", &["prod/e"])), "{relisted:?}");
    assert!(relisted.contains(&ev(Kind::Service, "list ended", &[])), "{relisted:?}");
    assert_eq!(h.server.list_count(Kind::Service), 3);
    assert_eq!(h.services(), ["prod/e", "prod/s00000", "prod/s00001"]);
    assert_eq!(h.server.streamed_lists(Kind::Service), 0);
}

#[tokio::test]
async fn bookmarks_let_a_watch_after_a_watch_cache_list_resume_without_a_relist() {
    let mut h = Harness::new().await;
    services(&h.server, 2);
    h.server.apply(Kind::Node, node(NODE, "198.19.0.0/24"));
    start(&mut h);
    h.synced().await;
    h.watches_open(4).await;

    bookmark_then_compact_and_drop(&h.server).await;

    h.server.apply(Kind::Service, service("prod", "f", "198.18.0.7"));
    assert_eq!(names(&h.next().await), ev(Kind::Service, "applied", &["prod/f"]));
    assert!(h.until_quiet(Duration::from_millis(300)).await.is_empty());
    for kind in Kind::ALL {
        assert_eq!(h.server.list_count(kind), 1, "{kind} resumed from its bookmark without a relist");
    }
    assert!(h.server.watch_count(Kind::Service) >= 2, "the service watch was reopened");
}

#[tokio::test]
async fn watch_cache_list_requests_wait_for_the_client_rate_limit() {
    let mut h = Harness::new().await;
    services(&h.server, 2);
    h.server.apply(Kind::Node, node(NODE, "198.19.0.0/24"));
    // One request at once, then 5 a second: 4 lists and 4 watches take 1.4 s at least; the
    // watches alone would take 0.6 s.
    let client = client_from_config(h.server.kube_config().unwrap(), 5.0, 1).unwrap();
    let started = Instant::now();
    h.start_source_with(client, ListMode::WatchCache);
    h.synced().await;
    h.watches_open(4).await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1200), "lists were not rate limited: {took:?}");
    for kind in Kind::ALL {
        assert_eq!(h.server.list_count(kind), 1, "{kind}");
    }
}

#[tokio::test]
async fn the_fallback_of_a_refused_streaming_list_hands_objects_over_as_the_body_arrives() {
    let mut h = Harness::new().await;
    services(&h.server, 10);
    h.server.set_streaming_lists(StreamingLists::WatchListOff);
    h.server.set_list_item_delay(Duration::from_millis(50));
    h.start_source();
    let first = loop {
        let change = h.next().await;
        if matches!(&change, Change::Applied(o) if o.kind() == Kind::Service) {
            break change;
        }
    };
    assert_eq!(names(&first), ev(Kind::Service, "applied", &["prod/s00000"]));
    assert_eq!(h.server.lists_sent(Kind::Service), 0, "the list body had not ended yet");
    assert_eq!(h.stats.streaming_fallbacks(Kind::Service), 1);
    h.until(|s| s.is_synced(Kind::Service)).await;
    assert_eq!(h.state.services().count(), 10);
}
