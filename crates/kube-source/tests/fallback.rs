//! A streaming list that fails in any way before its `k8s.io/initial-events-end` bookmark makes
//! the kind list and watch instead, and the start goes on: each way a real server fails one,
//! played by the fake API server; and when streaming is tried again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use kproxy_kube_source::fake::{FakeApiServer, StreamingLists};
use kproxy_state::Kind;
use support::*;

/// Two Services with slices, the own node, one ServiceCIDR.
fn seed(server: &FakeApiServer) {
    server.apply(Kind::Service, service("prod", "a", "198.18.0.1"));
    server.apply(Kind::Service, service("prod", "b", "198.18.0.2"));
    server.apply(Kind::EndpointSlice, slice("prod", "a-1", "a", "198.19.0.1"));
    server.apply(Kind::EndpointSlice, slice("prod", "b-1", "b", "198.19.0.2"));
    server.apply(Kind::Node, node(NODE, "198.19.0.0/24"));
    server.apply(Kind::ServiceCidr, service_cidr("kubernetes", "198.18.0.0/16"));
}

fn client(server: &FakeApiServer) -> kube::Client {
    kube::Client::try_from(server.kube_config().unwrap()).unwrap()
}

/// Starts a source on a server whose streaming lists fail as `answer` says; waits for the
/// start and checks that every kind fell back once and listed from the watch cache.
///
/// One streaming list request per kind, except after a stream that ended early: kube-runtime's
/// watcher starts the next one without a word, and only its start shows the first one failed.
async fn start_failing(answer: StreamingLists, progress: Duration) -> Harness {
    let h = start_failing_after(answer, progress).await;
    let requests = if answer == StreamingLists::ClosedEarly { 2 } else { 1 };
    for kind in Kind::ALL {
        assert_eq!(h.server.streaming_list_requests(kind), requests, "{answer:?}: {kind}: not retried");
    }
    h
}

/// [`start_failing`], however many streaming lists were tried before the fallback.
async fn start_failing_after(answer: StreamingLists, progress: Duration) -> Harness {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.set_streaming_lists(answer);
    let client = client(&h.server);
    h.start_source_configured(client, |opts| opts.initial_events_timeout = progress);
    h.synced().await;
    assert_eq!(h.services(), ["prod/a", "prod/b"], "{answer:?}");
    assert_eq!(h.state.slices_of(&key("prod", "a")).count(), 1);
    for kind in Kind::ALL {
        assert_eq!(h.stats.streaming_fallbacks(kind), 1, "{answer:?}: {kind}: one fallback");
        assert_eq!(h.server.list_count(kind), 1, "{answer:?}: {kind}: then one watch-cache list");
        assert_eq!(h.stats.lists(kind), 1, "{answer:?}: {kind}");
    }
    h
}

/// The watches that follow the fallback's lists deliver changes; nothing retries streaming.
async fn changes_flow(h: &mut Harness) {
    let requests: Vec<usize> = Kind::ALL.iter().map(|kind| h.server.streaming_list_requests(*kind)).collect();
    h.watches_open(4).await;
    h.server.apply(Kind::Service, service("prod", "c", "198.18.0.3"));
    h.server.delete(Kind::EndpointSlice, "prod", "b-1");
    h.until(|s| s.service(&key("prod", "c")).is_some() && s.slices_of(&key("prod", "b")).count() == 0).await;
    h.until_quiet(Duration::from_millis(300)).await;
    for (kind, requests) in Kind::ALL.into_iter().zip(requests) {
        assert_eq!(h.server.streaming_list_requests(kind), requests, "{kind}: streaming not retried");
        assert_eq!(h.stats.streaming_fallbacks(kind), 1, "{kind}");
    }
}

#[tokio::test]
async fn an_error_event_inside_an_accepted_streaming_list_falls_back_to_list_and_watch() {
    // kube-apiserver 1.36 on etcd 3.5.1: 200, then ERROR 500 "... RequestWatchProgress is disabled".
    let mut h = start_failing(StreamingLists::ErrorEvent(500), Duration::from_secs(60)).await;
    for kind in Kind::ALL {
        assert_eq!(h.server.streamed_lists(kind), 1, "{kind}: the streaming list was accepted");
        assert_eq!(h.server.streamed_lists_completed(kind), 0, "{kind}: and never completed");
    }
    changes_flow(&mut h).await;
}

#[tokio::test]
async fn an_error_event_of_another_code_falls_back_too() {
    let mut h = start_failing(StreamingLists::ErrorEvent(503), Duration::from_secs(60)).await;
    changes_flow(&mut h).await;
}

#[tokio::test]
async fn a_streaming_list_refused_at_the_start_falls_back_at_once() {
    // (503, 504 and 429 are retried by kube-rs's client itself, with its own backoff.)
    for code in [500, 400, 404, 502] {
        let mut h = start_failing(StreamingLists::Refused(code), Duration::from_secs(60)).await;
        for kind in Kind::ALL {
            assert_eq!(h.server.streamed_lists(kind), 0, "{code}: {kind}: refused, never opened");
        }
        changes_flow(&mut h).await;
    }
}

#[tokio::test]
async fn a_streaming_list_refused_403_is_retried_within_the_progress_bound_then_falls_back() {
    // A restarted kube-apiserver denies for a moment while its RBAC caches fill: retried.
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.set_streaming_lists(StreamingLists::Refused(403));
    let client = client(&h.server);
    h.start_source_configured(client, |opts| opts.initial_events_timeout = Duration::from_secs(60));
    h.eventually("a few refused streaming lists", |s| s.streaming_list_requests(Kind::Service) >= 3).await;
    h.server.set_streaming_lists(StreamingLists::Served);
    h.synced().await;
    for kind in Kind::ALL {
        assert_eq!(h.stats.streaming_fallbacks(kind), 0, "{kind}: denied for a moment is no verdict on streaming");
        assert_eq!(h.server.streamed_lists_completed(kind), 1, "{kind}");
        assert_eq!(h.server.list_count(kind), 0, "{kind}");
    }
    // Denied for longer than the bound: falls back (and the list, allowed here, starts it).
    let start = Instant::now();
    let progress = Duration::from_millis(1500);
    let mut h = start_failing_after(StreamingLists::Refused(403), progress).await;
    assert!(start.elapsed() >= progress, "fell back after {:?}", start.elapsed());
    for kind in Kind::ALL {
        assert!(h.server.streaming_list_requests(kind) >= 3, "{kind}: retried meanwhile");
    }
    changes_flow(&mut h).await;
}

#[tokio::test]
async fn a_streaming_list_that_ends_before_its_bookmark_falls_back() {
    let mut h = start_failing(StreamingLists::ClosedEarly, Duration::from_secs(60)).await;
    // The objects it had sent were handed over, then the listing started over as a list.
    assert!(h.stats.watch_errors(Kind::Service) <= 1, "no retry loop: {}", h.stats.watch_errors(Kind::Service));
    changes_flow(&mut h).await;
}

#[tokio::test]
async fn a_server_that_ignores_send_initial_events_falls_back_once_the_progress_bound_passes() {
    let progress = Duration::from_millis(1500);
    let start = Instant::now();
    let mut h = start_failing(StreamingLists::Ignored, progress).await;
    let took = start.elapsed();
    assert!(took >= progress, "fell back after {took:?}, before the bound");
    // Soon after the bound: within the start's PATIENCE (15 s), while nothing else would have
    // ended the streaming list before its watch timeout (kube-runtime asks for 290 s).
    eprintln!("fell back and started {took:?} after the start (progress bound {progress:?})");
    changes_flow(&mut h).await;
}

#[tokio::test]
async fn a_server_that_does_not_answer_at_the_start_is_retried_as_a_streaming_list() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.stop().await;
    h.start_source();
    tokio::time::sleep(Duration::from_millis(700)).await;
    h.server.restart().await.unwrap();
    h.synced().await;
    for kind in Kind::ALL {
        assert_eq!(h.stats.streaming_fallbacks(kind), 0, "{kind}: no answer says nothing about streaming");
        assert_eq!(h.server.streamed_lists_completed(kind), 1, "{kind}");
        assert_eq!(h.server.list_count(kind), 0, "{kind}");
    }
    assert!(h.stats.watch_errors(Kind::Service) >= 1, "the outage was seen");
}

/// Starts on a server whose streaming lists fail with an ERROR 500, then serves them again,
/// and forces a relist of every kind (`410 Gone` after a restart).
async fn relist_after_a_fallback(retry_after: Duration) -> Harness {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.set_streaming_lists(StreamingLists::ErrorEvent(500));
    let client = client(&h.server);
    h.start_source_configured(client, |opts| opts.streaming_retry_after = retry_after);
    h.synced().await;
    h.watches_open(4).await;
    // The server goes down; meanwhile a Service goes and the history is compacted, so every
    // kind relists once it is back, now serving streaming lists.
    h.server.stop().await;
    h.server.set_streaming_lists(StreamingLists::Served);
    h.server.delete(Kind::Service, "prod", "b");
    h.server.compact();
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.server.restart().await.unwrap();
    h.until(|s| s.service(&key("prod", "b")).is_none()).await;
    h.until_quiet(Duration::from_millis(500)).await;
    assert_eq!(h.gone, [(Kind::Service, key("prod", "b"))], "found by the relist");
    assert_eq!(h.stats.lists(Kind::Service), 2);
    h
}

#[tokio::test]
async fn a_relist_soon_after_a_fallback_lists_and_watches() {
    let h = relist_after_a_fallback(kproxy_kube_source::STREAMING_RETRY_AFTER).await;
    for kind in Kind::ALL {
        assert_eq!(h.server.streaming_list_requests(kind), 1, "{kind}: no streaming list within the retry delay");
        assert_eq!(h.server.list_count(kind), 2, "{kind}: the relist was a watch-cache list");
        assert_eq!(h.stats.streaming_fallbacks(kind), 1);
    }
}

#[tokio::test]
async fn a_relist_long_enough_after_a_fallback_streams_again() {
    let h = relist_after_a_fallback(Duration::from_millis(100)).await;
    for kind in Kind::ALL {
        assert_eq!(h.server.streaming_list_requests(kind), 2, "{kind}: the relist was a streaming list");
        assert_eq!(h.server.streamed_lists_completed(kind), 1, "{kind}: and completed");
        assert_eq!(h.server.list_count(kind), 1, "{kind}: only the fallback's list");
        assert_eq!(h.stats.streaming_fallbacks(kind), 1, "{kind}");
    }
}
