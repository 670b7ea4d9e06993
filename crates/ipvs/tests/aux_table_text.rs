//! The auxiliary table's transactions mean the same over netlink (how [`kproxy_ipvs::KernelHost`]
//! applies them) and as `nft -f` text (their rendering, for people and `--dry-run`): a cold
//! start and a partial sync are applied both ways, each in its own network namespace, and the
//! two `nft -j list ruleset` listings must be identical. Needs no IPVS (the transactions come
//! from the in-memory host), so it runs on the development kernel.

#![allow(clippy::unwrap_used)]

use kproxy_ipvs::{Config, FakeHost, IpvsDataplane};
use kproxy_nft_model::{Executor, NftCommand, Transaction};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_packet_suite::{NODE_A, NODE_B, node_objects, service, slice};
use kproxy_plan::{DetectLocal, NodeContext, Plan, PlanDelta, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState, IpFamily, Object};
use kproxy_testbed::Netns;
use kproxy_testbed::kernel::require_root;
use serde_json::{Value, json};

/// A dual-stack service `name` with one TCP and one UDP port and endpoints on both nodes;
/// `extra` is merged into its spec.
fn svc(name: &str, ips: [&str; 2], endpoints: [[&str; 2]; 2], extra: Value) -> Vec<Object> {
    let mut spec = json!({"clusterIP": ips[0], "clusterIPs": ips, "ipFamilies": ["IPv4", "IPv6"],
        "ipFamilyPolicy": "RequireDualStack",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                  {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]});
    if let (Some(s), Value::Object(e)) = (spec.as_object_mut(), extra) {
        s.extend(e);
    }
    let ports =
        json!([{"name": "http", "protocol": "TCP", "port": 8080}, {"name": "dns", "protocol": "UDP", "port": 5353}]);
    let eps = |family: usize| {
        [NODE_A, NODE_B]
            .iter()
            .zip(endpoints[family])
            .map(|(node, ip)| json!({"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}))
            .collect()
    };
    vec![
        service("default", name, spec, json!({})),
        slice("default", name, "v4", "IPv4", ports.clone(), eps(0)),
        slice("default", name, "v6", "IPv6", ports, eps(1)),
    ]
}

/// Every shape of service the auxiliary table has elements for: ClusterIP only, NodePort
/// (marks), a LoadBalancer with `externalTrafficPolicy: Local` (short-circuit marks) and
/// source ranges (the firewall's interval set), and no endpoints (the reject verdicts).
fn cluster() -> Vec<Object> {
    let mut o = svc(
        "web",
        ["198.18.128.10", "fd00:96::10"],
        [["198.18.16.10", "198.18.17.10"], ["fd00:16::a", "fd00:17::a"]],
        json!({}),
    );
    o.extend(svc(
        "np",
        ["198.18.128.11", "fd00:96::11"],
        [["198.18.16.11", "198.18.17.11"], ["fd00:16::b", "fd00:17::b"]],
        json!({"type": "NodePort", "sessionAffinity": "ClientIP"}),
    ));
    o.extend(svc(
        "lb",
        ["198.18.128.12", "fd00:96::12"],
        [["198.18.16.12", "198.18.17.12"], ["fd00:16::c", "fd00:17::c"]],
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
               "externalIPs": ["203.0.113.12"],
               "loadBalancerSourceRanges": ["192.0.2.0/24", "198.51.100.0/25", "fd00:99::/64"]}),
    ));
    o
}

struct World {
    planner: Planner,
    state: ClusterState,
    plan: Plan,
}

impl World {
    fn new(objects: Vec<Object>) -> Self {
        let policy = ProxyPolicy {
            families: vec![IpFamily::V4, IpFamily::V6],
            detect_local: DetectLocal::ClusterCidr(vec![
                "198.18.16.0/20".parse().unwrap(),
                "fd00:16::/48".parse().unwrap(),
            ]),
            no_masquerade_cidrs: vec!["198.19.0.0/16".parse().unwrap()],
            ..ProxyPolicy::default()
        };
        let node = NodeContext {
            name: NODE_A.into(),
            node_ip_override: Vec::new(),
            local_addresses: vec!["198.18.0.2".parse().unwrap()],
        };
        let planner = Planner::new(policy, node);
        let mut state = ClusterState::new();
        for o in node_objects().into_iter().chain(objects) {
            state.apply(Change::Applied(o));
        }
        let _ = state.take_dirty();
        let plan = planner.build(&state);
        Self { planner, state, plan }
    }

    fn apply(&mut self, objects: Vec<Object>) -> PlanDelta {
        for o in objects {
            self.state.apply(Change::Applied(o));
        }
        let dirty = self.state.take_dirty();
        self.planner.update(&mut self.plan, &self.state, &dirty)
    }
}

/// The auxiliary table's transactions of a cold start, then of a partial sync after which the
/// NodePort service lost its endpoints and the LoadBalancer moved its endpoints.
fn transactions() -> Vec<Transaction> {
    let mut world = World::new(cluster());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &PlanDelta::between(&Plan::default(), &world.plan)).unwrap();
    let mut changed = svc(
        "np",
        ["198.18.128.11", "fd00:96::11"],
        [["198.18.16.11", "198.18.17.11"], ["fd00:16::b", "fd00:17::b"]],
        json!({"type": "NodePort"}),
    );
    changed.truncate(1);
    changed.push(slice("default", "np", "v4", "IPv4", json!([]), vec![]));
    changed.push(slice("default", "np", "v6", "IPv6", json!([]), vec![]));
    changed.extend(svc(
        "lb",
        ["198.18.128.12", "fd00:96::12"],
        [["198.18.17.12", "198.18.16.13"], ["fd00:17::c", "fd00:16::d"]],
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Cluster", "externalIPs": ["203.0.113.12"]}),
    ));
    let delta = world.apply(changed);
    dp.sync(&world.plan, &delta).unwrap();
    dp.host().nft.clone()
}

/// The namespace's ruleset, comparable (see [`kproxy_testbed::nft_listing`]).
fn listing(ns: &Netns) -> Value {
    kproxy_testbed::nft_listing(ns).unwrap()
}

fn apply_all<E: Executor>(exec: &mut E, txs: &[Transaction]) {
    for tx in txs {
        exec.apply(tx).unwrap_or_else(|e| panic!("{e}\n{tx}"));
    }
}

#[test]
fn the_auxiliary_table_lists_the_same_over_netlink_and_as_nft_text() {
    if !require_root() {
        return;
    }
    let txs = transactions();
    assert_eq!(txs.len(), 2, "a cold start and a partial sync");
    let text = txs[0].render();
    // The statements only this table uses are all in the cold start.
    for needle in
        ["meta mark set", "ct mark set ct mark or", "ct mark and", "meta l4proto { tcp, udp, sctp }", ": mark;"]
    {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    assert!(!txs[1].is_empty() && txs[1].render().contains("delete element"), "{}", txs[1]);

    let over_netlink = Netns::new("auxnl").unwrap();
    let as_text = Netns::new("auxtext").unwrap();
    over_netlink.run_in(|| apply_all(&mut NetlinkExecutor::new(), &txs)).unwrap();
    as_text.run_in(|| apply_all(&mut NftCommand::new(), &txs)).unwrap();
    let (a, b) = (listing(&over_netlink), listing(&as_text));
    let listed = a.to_string();
    assert!(listed.contains("kproxy-ipvs") && listed.contains("fd00:96::12"), "{listed}");
    assert!(listed.contains("\"mark\""), "the mark maps are listed: {listed}");
    assert_eq!(serde_json::to_string_pretty(&a).unwrap(), serde_json::to_string_pretty(&b).unwrap());
}
