//! How lists are fetched and handed over: the fake API server's streaming lists, watch-cache
//! lists and pagination as kube-rs sees them; the source's fallback when streaming is refused
//! (the other ways a streaming list fails: tests/fallback.rs);
//! relists handed over object by object; the client rate limit per request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kproxy_kube_source::ListMode;
use kproxy_kube_source::client_from_config;
use kproxy_kube_source::fake::{FakeApiServer, StreamingLists};
use kproxy_state::{Change, Kind};
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use support::*;

fn services(server: &FakeApiServer, n: usize) {
    for i in 0..n {
        server
            .apply(Kind::Service, service("prod", &format!("s{i:04}"), &format!("198.18.{}.{}", i / 250, i % 250 + 1)));
    }
}

fn slices(server: &FakeApiServer, n: usize) {
    for i in 0..n {
        let ip = format!("198.19.{}.{}", i / 250, i % 250 + 1);
        server.apply(Kind::EndpointSlice, slice("prod", &format!("s{i:04}-1"), &format!("s{i:04}"), &ip));
    }
}

fn unlimited(server: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(server.kube_config().unwrap()).unwrap()
}

#[tokio::test]
async fn fake_streaming_list_sends_every_object_then_the_initial_events_end_bookmark() {
    let server = FakeApiServer::start().await.unwrap();
    services(&server, 3);
    let api: Api<Service> = Api::all(unlimited(&server));
    let mut events = api.watch(&WatchParams::default().initial_events().timeout(5), "0").await.unwrap().boxed();
    let mut added = Vec::new();
    let bookmark = loop {
        match events.next().await.expect("stream ended before the bookmark").unwrap() {
            WatchEvent::Added(svc) => added.push(svc.metadata.name.unwrap()),
            WatchEvent::Bookmark(bookmark) => break bookmark,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(added, ["s0000", "s0001", "s0002"]);
    assert_eq!(bookmark.metadata.annotations.get("k8s.io/initial-events-end").map(String::as_str), Some("true"));
    assert_eq!(bookmark.metadata.resource_version, server.resource_version().to_string());
    assert_eq!((server.streamed_lists(Kind::Service), server.streamed_lists_completed(Kind::Service)), (1, 1));

    // Later changes follow on the same stream.
    server.apply(Kind::Service, service("prod", "late", "198.18.9.9"));
    match events.next().await.unwrap().unwrap() {
        WatchEvent::Added(svc) => assert_eq!(svc.metadata.name.as_deref(), Some("late")),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn fake_watches_end_at_their_timeout_like_kube_apiserver() {
    let server = FakeApiServer::start().await.unwrap();
    services(&server, 2);
    let api: Api<Service> = Api::all(unlimited(&server));
    // The same watch with a timeout of a minute, opened first: still open when the 1 s one ends,
    // so it ended at its own timeout and not for any other reason (load cannot reverse the order).
    let mut longer = api.watch(&WatchParams::default().initial_events().timeout(60), "0").await.unwrap().boxed();
    let start = Instant::now();
    let mut events = api.watch(&WatchParams::default().initial_events().timeout(1), "0").await.unwrap().boxed();
    let mut seen = 0;
    while let Some(event) = tokio::time::timeout(PATIENCE, events.next()).await.expect("open past its timeout") {
        event.unwrap();
        seen += 1;
    }
    let took = start.elapsed();
    assert_eq!(seen, 3, "two objects and the end bookmark, then the end of the stream");
    assert!(took >= Duration::from_millis(900), "closed after {took:?}, before its timeout");
    for _ in 0..3 {
        longer.next().await.expect("the longer watch sends the objects and the bookmark").unwrap();
    }
    assert!(
        futures::FutureExt::now_or_never(longer.next()).is_none(),
        "the watch with a 60 s timeout is still open when the 1 s one ended"
    );
}

#[tokio::test]
async fn fake_without_watchlist_refuses_streaming_lists_with_422() {
    let server = FakeApiServer::start().await.unwrap();
    server.set_streaming_lists(StreamingLists::WatchListOff);
    let api: Api<Service> = Api::all(unlimited(&server));
    let Err(kube::Error::Api(status)) = api.watch(&WatchParams::default().initial_events(), "0").await else {
        panic!("a streaming list must be refused");
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(status.message.contains("WatchList"), "{}", status.message);
    // A plain watch still works on that server.
    assert!(api.watch(&WatchParams::default().timeout(1), "0").await.is_ok());
}

#[tokio::test]
async fn fake_pages_consistent_lists_and_serves_resource_version_0_whole() {
    let server = FakeApiServer::start().await.unwrap();
    services(&server, 5);
    let api: Api<Service> = Api::all(unlimited(&server));

    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    let mut names: Vec<String> = first.items.iter().map(|s| s.metadata.name.clone().unwrap()).collect();
    let mut token = first.metadata.continue_.clone();
    let mut pages = 1;
    while let Some(next) = token.filter(|t| !t.is_empty()) {
        let page = api.list(&ListParams::default().limit(2).continue_token(&next)).await.unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()), "every page at the first's version");
        names.extend(page.items.iter().map(|s| s.metadata.name.clone().unwrap()));
        token = page.metadata.continue_.clone();
        pages += 1;
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["s0000", "s0001", "s0002", "s0003", "s0004"]);

    // The watch cache ignores the limit (kube-rs never sends both, so the request is made by hand).
    let request = http::Request::get("/api/v1/services?resourceVersion=0&limit=2").body(Vec::new()).unwrap();
    let cached: serde_json::Value =
        serde_json::from_str(&unlimited(&server).request_text(request).await.unwrap()).unwrap();
    assert_eq!(cached["items"].as_array().map(Vec::len), Some(5));
    assert_eq!(cached["metadata"].get("continue"), None);

    // A continue token older than the compacted history is gone.
    let stale = first.metadata.continue_.unwrap();
    server.apply(Kind::Service, service("prod", "newer", "198.18.9.9"));
    server.compact();
    let Err(kube::Error::Api(status)) = api.list(&ListParams::default().limit(2).continue_token(&stale)).await else {
        panic!("an expired continue token must fail");
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn without_streaming_lists_the_source_lists_from_the_watch_cache() {
    let mut h = Harness::new().await;
    h.server.set_streaming_lists(StreamingLists::WatchListOff);
    services(&h.server, 1200);
    slices(&h.server, 1200);
    h.server.apply(Kind::Node, node(NODE, "198.19.0.0/24"));
    h.start_source();
    let changes = h.synced().await;
    assert_eq!(first_listing(&changes, Kind::Service).len(), 1200);
    assert_eq!(h.state.services().count(), 1200);
    for kind in Kind::ALL {
        assert_eq!(h.server.list_count(kind), 1, "{kind}: one watch-cache list, although more than 500 objects");
        assert_eq!(h.server.streamed_lists(kind), 0);
    }
    // The watches that follow the lists deliver changes.
    h.watches_open(4).await;
    h.server.delete(Kind::Service, "prod", "s0007");
    assert_eq!(names(&h.next().await), ev(Kind::Service, "deleted", &["prod/s0007"]));
}

#[tokio::test]
async fn paginated_lists_are_handed_over_page_by_page() {
    let mut h = Harness::new().await;
    services(&h.server, 5);
    slices(&h.server, 5);
    let client = unlimited(&h.server);
    h.start_source_with(client, ListMode::Paginated(2));
    let changes = h.synced().await;
    assert_eq!(
        first_listing(&changes, Kind::Service),
        ["prod/s0000", "prod/s0001", "prod/s0002", "prod/s0003", "prod/s0004"]
    );
    assert_eq!(h.server.list_count(Kind::Service), 3, "pages of 2");
    assert_eq!(h.server.streamed_lists(Kind::Service), 0);
}

#[tokio::test]
async fn a_relist_is_handed_over_object_by_object_while_it_is_still_arriving() {
    let mut h = Harness::new().await;
    services(&h.server, 20);
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;
    assert_eq!(h.server.streamed_lists_completed(Kind::Service), 1);

    // While the server is down a Service goes and the history is compacted: a relist, whose
    // events come slowly.
    h.server.stop().await;
    h.server.delete(Kind::Service, "prod", "s0019");
    h.server.compact();
    h.server.set_event_delay(Duration::from_millis(50));
    h.server.restart().await.unwrap();
    let first = loop {
        let change = h.next().await;
        if matches!(&change, Change::Applied(o) if o.kind() == Kind::Service) {
            break change;
        }
    };
    // The first relisted Service reached the consumer before the server had sent the end of the
    // relist: nothing waited for the whole list.
    assert_eq!(names(&first), ev(Kind::Service, "applied", &["prod/s0000"]));
    assert_eq!(h.server.streamed_lists(Kind::Service), 2, "relisting");
    assert_eq!(h.server.streamed_lists_completed(Kind::Service), 1, "the relist had not ended yet");

    // Then the rest; once the relist ended, the state found the Service that is gone.
    let rest = h.until(|s| s.service(&key("prod", "s0019")).is_none()).await;
    let rest: Vec<_> = rest.iter().map(names).filter(|(kind, ..)| *kind == Kind::Service).collect();
    assert_eq!(rest.len(), 19, "18 more services and the end of the relist: {rest:?}");
    assert_eq!(rest.last(), Some(&ev(Kind::Service, "list ended", &[])));
    assert_eq!(h.gone, [(Kind::Service, key("prod", "s0019"))]);
    assert_eq!(h.server.streamed_lists_completed(Kind::Service), 2);
    assert_eq!(h.state.services().count(), 19);
}

#[tokio::test]
async fn a_relist_broken_off_midway_starts_over_and_still_finds_what_is_gone() {
    let mut h = Harness::new().await;
    services(&h.server, 10);
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;

    // A relist that breaks off after a few objects (the connection drops) ...
    h.server.set_event_delay(Duration::from_millis(40));
    h.server.compact();
    h.server.expire_watches();
    loop {
        if let Change::Applied(o) = h.next().await
            && o.key() == key("prod", "s0002")
        {
            break;
        }
    }
    h.server.drop_connections().await;
    // ... meanwhile a Service it had not reached goes; the relist starts over (as a watch-cache
    // list: a streaming list that ended before its bookmark makes the kind fall back) and
    // completes.
    h.server.set_event_delay(Duration::ZERO);
    h.server.delete(Kind::Service, "prod", "s0008");
    h.until(|s| s.service(&key("prod", "s0008")).is_none()).await;
    h.until_quiet(Duration::from_millis(500)).await;
    assert_eq!(h.gone, [(Kind::Service, key("prod", "s0008"))], "exactly what is gone");
    assert!(!h.seen.iter().any(|c| matches!(c, Change::Deleted(..))), "no watch event deleted anything");
    assert_eq!(h.state.services().count(), 9);
    assert_eq!(h.stats.streaming_fallbacks(Kind::Service), 1);
    assert_eq!(h.server.list_count(Kind::Service), 1, "the relist was started again, as a list");
    assert_eq!(h.stats.lists(Kind::Service), 2);
}

/// A server with 1000 Services, 1000 slices and the own node.
async fn thousand_services() -> Harness {
    let h = Harness::new().await;
    services(&h.server, 1000);
    slices(&h.server, 1000);
    h.server.apply(Kind::Node, node(NODE, "198.19.0.0/24"));
    h
}

/// Starts a source on `h` limited to 10 requests per second with a burst of 4 (the four kinds'
/// first requests); returns how long it took to sync.
async fn rate_limited_start(mut h: Harness, list_mode: ListMode) -> (Harness, Duration) {
    let client = client_from_config(h.server.kube_config().unwrap(), 10.0, 4).unwrap();
    let start = Instant::now();
    h.start_source_with(client, list_mode);
    h.synced().await;
    let took = start.elapsed();
    assert_eq!(h.state.services().count(), 1000);
    (h, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_rate_limit_counts_requests_so_a_streaming_start_is_not_throttled() {
    // Both starts side by side, so that they meet the same load: a streaming start is one request
    // per kind, within the burst, and nothing waits for a token; the paginated one waits.
    let (paged, streaming) = (thousand_services().await, thousand_services().await);
    let ((paged, paginated), (streaming, streamed)) = tokio::join!(
        rate_limited_start(paged, ListMode::Paginated(100)),
        rate_limited_start(streaming, ListMode::Streaming)
    );
    // Pages of 100: 10 requests per kind, each waiting for its token as in client-go.
    assert_eq!(paged.server.list_count(Kind::Service), 10);
    assert_eq!(paged.server.list_count(Kind::EndpointSlice), 10);
    // 22 requests: 4 from the burst, 18 at 10 per second.
    assert!(paginated >= Duration::from_millis(1700), "pages were not rate limited: {paginated:?}");
    for kind in Kind::ALL {
        assert_eq!(streaming.server.list_count(kind), 0, "{kind}");
        assert_eq!(streaming.server.watch_count(kind), 1, "{kind}");
    }
    assert!(streamed < paginated, "a streaming start was throttled: {streamed:?} (paginated: {paginated:?})");
}
