//! The watch path against the fake API server, driven by the unmodified kube-rs client:
//! first sync, live events, API server restarts, 410 Gone, bookmarks, malformed objects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use kproxy_state::{Change, ClusterState, Kind};
use serde_json::json;
use support::*;

/// A small cluster: two proxied services with slices, one that belongs to another proxy, a
/// headless slice, the own node and another node, one ServiceCIDR.
fn seed(server: &kproxy_kube_source::fake::FakeApiServer) {
    server.apply(Kind::Service, service("prod", "a", "198.18.0.1"));
    server.apply(Kind::Service, service("prod", "b", "198.18.0.2"));
    let mut other = service("prod", "other-proxy", "198.18.0.3");
    other["metadata"]["labels"] = json!({"service.kubernetes.io/service-proxy-name": "someone-else"});
    server.apply(Kind::Service, other);
    server.apply(Kind::EndpointSlice, slice("prod", "a-1", "a", "198.19.0.1"));
    server.apply(Kind::EndpointSlice, slice("prod", "b-1", "b", "198.19.0.2"));
    let mut headless = slice("prod", "h-1", "h", "198.19.0.3");
    headless["metadata"]["labels"]["service.kubernetes.io/headless"] = json!("");
    server.apply(Kind::EndpointSlice, headless);
    server.apply(Kind::Node, node(NODE, "198.19.0.0/24"));
    server.apply(Kind::Node, node("node-b", "198.19.1.0/24"));
    server.apply(Kind::ServiceCidr, service_cidr("kubernetes", "198.18.0.0/16"));
}

#[tokio::test]
async fn services_and_endpointslices_are_synced_only_once_both_listings_are_complete() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.hold_lists(Kind::EndpointSlice);
    h.start_source();

    // While the EndpointSlice listing is held, the Services arrive as they are listed, but the
    // consumer's view is not complete: EndpointSlices are not synced.
    h.until(|s| s.is_synced(Kind::Service)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.drain_now();
    assert_eq!(h.server.streamed_lists_completed(Kind::EndpointSlice), 0, "slice listing still pending");
    assert!(!h.state.is_synced(Kind::EndpointSlice));
    assert_eq!(first_listing(&h.seen, Kind::Service), ["prod/a", "prod/b"], "filtered by upstream's selectors");

    // Then the slices, filtered by upstream's label selectors.
    h.server.release_lists(Kind::EndpointSlice);
    h.synced().await;
    assert_eq!(first_listing(&h.seen, Kind::EndpointSlice), ["prod/a-1", "prod/b-1"]);
    assert_eq!(h.services(), ["prod/a", "prod/b"]);
    assert_eq!(h.state.slices_of(&key("prod", "a")).count(), 1);
    assert_eq!(first_listing(&h.seen, Kind::Node), [NODE], "only the own node is watched");
    assert_eq!(first_listing(&h.seen, Kind::ServiceCidr), ["kubernetes"]);
    assert_eq!(h.state.service_cidrs().map(ToString::to_string).collect::<Vec<_>>(), ["198.18.0.0/16"]);
    for kind in Kind::ALL {
        assert_eq!(h.server.streamed_lists(kind), 1, "{kind}: one streaming list");
        assert_eq!(h.server.list_count(kind), 0, "{kind}: no list request");
        let listings = h.seen.iter().filter(|c| completes_listing(c, kind)).count();
        assert_eq!(listings, 1, "{kind} listed once");
    }
}

#[tokio::test]
async fn events_flow_through() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;

    h.server.apply(Kind::Service, service("prod", "c", "198.18.0.4"));
    assert_eq!(names(&h.next().await), ev(Kind::Service, "applied", &["prod/c"]));

    h.server.apply(Kind::Service, service("prod", "a", "198.18.0.11"));
    let Change::Applied(kproxy_state::Object::Service(a)) = h.next().await else { panic!("want the updated service") };
    assert_eq!(a.service.spec.unwrap().cluster_ip.as_deref(), Some("198.18.0.11"));

    h.server.delete(Kind::EndpointSlice, "prod", "b-1");
    assert_eq!(names(&h.next().await), ev(Kind::EndpointSlice, "deleted", &["prod/b-1"]));

    // A Service that moves to another proxy leaves the selector: the server reports it deleted.
    let mut moved = service("prod", "b", "198.18.0.2");
    moved["metadata"]["labels"] = json!({"service.kubernetes.io/service-proxy-name": "someone-else"});
    h.server.apply(Kind::Service, moved);
    assert_eq!(names(&h.next().await), ev(Kind::Service, "deleted", &["prod/b"]));

    // Another node's changes are not ours; the own node's are (draining shows as unschedulable).
    h.server.apply(Kind::Node, node("node-b", "198.19.9.0/24"));
    let mut draining = node(NODE, "198.19.0.0/24");
    draining["spec"]["unschedulable"] = json!(true);
    h.server.apply(Kind::Node, draining);
    let Change::Applied(kproxy_state::Object::Node(n)) = h.next().await else { panic!("want the own node") };
    assert_eq!(n.metadata.name.as_deref(), Some(NODE));
    assert_eq!(n.spec.unwrap().unschedulable, Some(true));

    h.server.delete(Kind::ServiceCidr, "", "kubernetes");
    assert_eq!(names(&h.next().await), ev(Kind::ServiceCidr, "deleted", &["kubernetes"]));

    assert!(h.until_quiet(Duration::from_millis(300)).await.is_empty());
    assert_eq!(h.services(), ["prod/a", "prod/c"]);
    for kind in Kind::ALL {
        assert_eq!(h.server.streamed_lists(kind), 1, "{kind} listed once");
        assert_eq!(h.stats.lists(kind), 1);
    }
    assert_eq!(h.stats.events(Kind::Service), 3);
}

#[tokio::test]
async fn api_server_restart_reconverges_without_spurious_deletes() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.apply(Kind::Service, service("prod", "c", "198.18.0.4"));
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;

    // A restart with nothing changed meanwhile: the watches resume, nothing is sent.
    h.server.stop().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.server.restart().await.unwrap();
    h.watches_open(4).await;
    assert!(h.until_quiet(Duration::from_millis(500)).await.is_empty(), "no change after a clean restart");

    // Killed again; the cluster changes while the server is down.
    h.server.stop().await;
    h.server.delete(Kind::Service, "prod", "b");
    h.server.delete(Kind::EndpointSlice, "prod", "b-1");
    h.server.apply(Kind::Service, service("prod", "c", "198.18.0.44"));
    h.server.apply(Kind::Service, service("prod", "d", "198.18.0.5"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    h.server.restart().await.unwrap();

    // Every change made while it was down has arrived (the Service and EndpointSlice watches
    // resume on their own); then nothing more comes.
    let c_moved = |s: &ClusterState| {
        s.service(&key("prod", "c"))
            .is_some_and(|c| c.cluster_ips == ["198.18.0.44".parse::<std::net::IpAddr>().unwrap()])
    };
    let changes = h
        .until(|s| {
            s.service(&key("prod", "d")).is_some()
                && s.service(&key("prod", "b")).is_none()
                && s.slices_of(&key("prod", "b")).count() == 0
                && c_moved(s)
        })
        .await;
    let mut changes: Vec<_> = changes.iter().map(names).collect();
    changes.extend(h.until_quiet(Duration::from_millis(500)).await.iter().map(names));
    let services: Vec<_> = changes.iter().filter(|(k, _, _)| *k == Kind::Service).cloned().collect();
    assert_eq!(
        services,
        [
            ev(Kind::Service, "deleted", &["prod/b"]),
            ev(Kind::Service, "applied", &["prod/c"]),
            ev(Kind::Service, "applied", &["prod/d"])
        ]
    );
    assert!(changes.contains(&ev(Kind::EndpointSlice, "deleted", &["prod/b-1"])), "{changes:?}");
    assert_eq!(changes.len(), 4, "nothing else, in particular no relist: {changes:?}");
    assert_eq!(h.services(), ["prod/a", "prod/c", "prod/d"]);
    assert_eq!(h.server.streamed_lists(Kind::Service), 1, "resumed from the resource version, not relisted");
    assert!(h.stats.watch_errors(Kind::Service) > 0, "the outage was noticed");
}

#[tokio::test]
async fn gone_forces_a_relist_that_removes_objects_deleted_meanwhile() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;

    // While the server is down objects go, and the history is compacted past the watch's version.
    h.server.stop().await;
    h.server.delete(Kind::Service, "prod", "b");
    h.server.delete(Kind::EndpointSlice, "prod", "b-1");
    h.server.compact();
    h.server.restart().await.unwrap();

    let changes =
        h.until(|s| s.service(&key("prod", "b")).is_none() && s.slices_of(&key("prod", "b")).count() == 0).await;
    let mut changes: Vec<_> = changes.iter().map(names).collect();
    changes.extend(h.until_quiet(Duration::from_millis(500)).await.iter().map(names));
    // A relist reaches the consumer object by object; at its end, the state finds what is gone.
    let mut gone = h.gone.clone();
    gone.sort();
    assert_eq!(gone, [(Kind::Service, key("prod", "b")), (Kind::EndpointSlice, key("prod", "b-1"))]);
    assert!(changes.contains(&ev(Kind::Service, "applied", &["prod/a"])), "{changes:?}");
    assert!(changes.contains(&ev(Kind::Service, "list ended", &[])), "{changes:?}");
    assert!(
        changes.iter().all(|(_, what, _)| *what != "replaced" && *what != "synced"),
        "no full replacement after the first list: {changes:?}"
    );
    assert_eq!(h.services(), ["prod/a"]);
    assert_eq!(h.server.streamed_lists(Kind::Service), 2);
    assert_eq!(h.stats.lists(Kind::Service), 2);

    // An ERROR 410 event on an open watch forces a relist too.
    h.watches_open(4).await;
    h.server.apply(Kind::Service, service("prod", "e", "198.18.0.6"));
    assert_eq!(names(&h.next().await), ev(Kind::Service, "applied", &["prod/e"]));
    h.server.compact();
    h.server.expire_watches();
    let mut relisted = h.until_change(|c| completes_listing(c, Kind::Service)).await;
    relisted.extend(h.until_quiet(Duration::from_millis(300)).await);
    let relisted: Vec<_> = relisted.iter().map(names).collect();
    assert!(relisted.contains(&ev(Kind::Service, "applied", &["prod/a"])), "{relisted:?}");
    assert!(relisted.contains(&ev(Kind::Service, "applied", &["prod/e"])), "{relisted:?}");
    assert_eq!(h.server.streamed_lists(Kind::Service), 3);
    assert_eq!(h.services(), ["prod/a", "prod/e"]);
}

#[tokio::test]
async fn bookmarks_let_a_resumed_watch_skip_the_relist() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;

    bookmark_then_compact_and_drop(&h.server).await;

    h.server.apply(Kind::Service, service("prod", "f", "198.18.0.7"));
    assert_eq!(names(&h.next().await), ev(Kind::Service, "applied", &["prod/f"]));
    assert!(h.until_quiet(Duration::from_millis(300)).await.is_empty());
    for kind in Kind::ALL {
        assert_eq!(h.server.streamed_lists(kind), 1, "{kind} resumed from its bookmark without a relist");
    }
    assert!(h.server.watch_count(Kind::Service) >= 2, "the service watch was reopened");
}

#[tokio::test]
async fn malformed_objects_are_skipped_and_counted() {
    let mut h = Harness::new().await;
    seed(&h.server);
    let mut bad = service("prod", "bad", "198.18.0.8");
    bad["spec"]["ports"] = json!("eighty");
    h.server.apply(Kind::Service, bad);
    let mut bad_meta = slice("prod", "bad-meta", "a", "198.19.0.9");
    bad_meta["metadata"]["labels"]["broken"] = json!(42);
    h.server.apply(Kind::EndpointSlice, bad_meta);
    h.start_source();

    // Streamed initial lists: the bad objects are skipped, the rest is served.
    let changes = h.synced().await;
    assert_eq!(first_listing(&changes, Kind::Service), ["prod/a", "prod/b"]);
    assert_eq!(first_listing(&changes, Kind::EndpointSlice), ["prod/a-1", "prod/b-1"]);
    assert_eq!(h.server.streamed_lists(Kind::Service), 1);
    assert_eq!(h.stats.malformed_objects(Kind::Service), 1);
    assert_eq!(h.stats.malformed_objects(Kind::EndpointSlice), 1);

    // A malformed update is skipped (the last good version stays); the watch goes on.
    h.watches_open(4).await;
    let mut bad_update = service("prod", "a", "198.18.0.1");
    bad_update["spec"]["clusterIPs"] = json!({"not": "a list"});
    h.server.apply(Kind::Service, bad_update);
    h.server.apply(Kind::Service, service("prod", "g", "198.18.0.9"));
    assert_eq!(names(&h.next().await), ev(Kind::Service, "applied", &["prod/g"]));
    assert_eq!(h.stats.malformed_objects(Kind::Service), 2);
    assert_eq!(h.services(), ["prod/a", "prod/b", "prod/g"]);
    assert_eq!(h.server.streamed_lists(Kind::Service), 1, "no relist");
    assert_eq!(h.server.watch_count(Kind::Service), 1, "the watch was not broken");
}

#[tokio::test]
async fn missing_service_cidr_api_counts_as_synced_and_empty() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.set_served(Kind::ServiceCidr, false);
    h.start_source();
    let changes: Vec<_> = h.synced().await.iter().map(names).collect();
    assert!(changes.contains(&ev(Kind::ServiceCidr, "synced", &[])), "{changes:?}");
    assert_eq!(h.state.service_cidrs().count(), 0);
    assert_eq!(h.services(), ["prod/a", "prod/b"]);
    // The API appears later: the watcher, still retrying, picks it up.
    h.server.set_served(Kind::ServiceCidr, true);
    let changes = h.until(|s| s.service_cidrs().count() == 1).await;
    assert_eq!(names(changes.last().unwrap()), ev(Kind::ServiceCidr, "applied", &["kubernetes"]));
}

#[tokio::test]
async fn a_malformed_object_in_a_relist_keeps_its_last_good_version() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;

    // While the server is down prod/a turns unreadable and prod/b goes; the history is compacted,
    // so the source must relist.
    h.server.stop().await;
    let mut bad = service("prod", "a", "198.18.0.99");
    bad["spec"]["ports"] = json!("eighty");
    h.server.apply(Kind::Service, bad);
    h.server.delete(Kind::Service, "prod", "b");
    h.server.compact();
    h.server.restart().await.unwrap();

    h.until(|s| s.service(&key("prod", "b")).is_none()).await;
    h.until_quiet(Duration::from_millis(500)).await;
    assert_eq!(h.services(), ["prod/a"], "prod/a stays, prod/b is gone");
    let a = h.state.service(&key("prod", "a")).unwrap();
    assert_eq!(a.cluster_ips, ["198.18.0.1".parse::<std::net::IpAddr>().unwrap()], "the last good version");
    assert!(h.stats.malformed_objects(Kind::Service) >= 1);
    assert_eq!(h.server.streamed_lists(Kind::Service), 2, "it was a relist");
}

#[tokio::test]
async fn slow_watch_events_still_arrive_in_order() {
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.set_event_delay(Duration::from_millis(100));
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;
    for i in 0..5 {
        h.server.apply(Kind::Service, service("prod", &format!("s{i}"), &format!("198.18.1.{i}")));
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(names(&h.next().await));
    }
    let want: Vec<_> = (0..5).map(|i| ev(Kind::Service, "applied", &[&format!("prod/s{i}")])).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn a_service_with_a_null_condition_time_is_served_listed_or_watched() {
    // e2e's "service status lifecycle" writes a status condition whose lastTransitionTime is
    // null: a field kproxy does not read, which must not cost the Service.
    let with_condition = |name: &str, ip: &str| {
        let mut svc = service("prod", name, ip);
        svc["status"] = json!({"loadBalancer": {},
                               "conditions": [{"type": "StatusUpdate", "status": "True", "lastTransitionTime": null,
                                               "reason": "E2E", "message": "Set from e2e test"}]});
        svc
    };
    let mut h = Harness::new().await;
    seed(&h.server);
    h.server.apply(Kind::Service, with_condition("listed", "198.18.0.20"));
    h.start_source();
    h.synced().await;
    h.watches_open(4).await;
    h.server.apply(Kind::Service, with_condition("watched", "198.18.0.21"));
    h.until(|s| s.service(&key("prod", "watched")).is_some()).await;
    assert_eq!(h.services(), ["prod/a", "prod/b", "prod/listed", "prod/watched"]);
    assert_eq!(h.stats.malformed_objects(Kind::Service), 0);
}
