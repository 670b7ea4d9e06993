//! KEP-6246 cases: `noMasqueradeCIDRs` and SNAT to the node's InternalIP, on a node with two NICs.
//!
//! The situation of kubernetes#133024: the node's InternalIP is on `eth0`, but the remote node's
//! pods are reached through a second interface, `ovl0` (an overlay- or BGP-peering-like
//! point-to-point link to `node2` holding [`NODE_SECOND_NIC_V4`] / [`NODE_SECOND_NIC_V6`]). The
//! route to the pod CIDR carries `src <InternalIP>`, as CNIs that route node traffic natively set
//! it, so a direct node → pod connection shows the InternalIP:
//!
//! ```text
//! node:  eth0 198.18.0.2 / fd00:18::2 (InternalIP) ── LAN ── node2 eth0
//!        ovl0 192.0.2.1  / fd00:192:2::1 ─────────────────── node2 ovl0 192.0.2.2 / fd00:192:2::2
//!        198.18.17.0/24  via 192.0.2.2     dev ovl0 src 198.18.0.2
//!        fd00:10:17::/64 via fd00:192:2::2 dev ovl0 src fd00:18::2
//! ```
//!
//! Expected source addresses are what the kernel does, checked on the real kernel:
//! - MASQUERADE ignores the route's `src` hint. IPv4 takes the address of the output interface
//!   (`inet_select_addr(out, next hop)`), IPv6 runs source address selection preferring the output
//!   interface (`ipv6_dev_get_saddr`, rule 5). Both give the second NIC's address.
//! - A connection from the node to a ClusterIP gets its source when it is opened, from the route
//!   to the ClusterIP (the default route on `eth0`: the InternalIP). DNAT re-routes the packet but
//!   keeps that source, so unmasqueraded node → Service → pod traffic shows what direct node →
//!   pod traffic shows ([`Source::AsDirect`] measures the latter with a real connection).
//! - Hairpin from a routed pod leaves through the pod's veth, which has no IPv4 address and only a
//!   link-local IPv6 one: MASQUERADE falls back to the first interface with a global address
//!   (`eth0`, the InternalIP) and IPv6 selection to the longest matching prefix (`fd00:18::2`).
//!
//! Services: `web` (dual-stack NodePort 30080, eTP Cluster, endpoint `b` on node2 behind `ovl0`)
//! and `self` (dual-stack ClusterIP, endpoint `a` on the node, for hairpin).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use kproxy_plan::{DetectLocal, ProxyPolicy};
use kproxy_state::Object;
use kproxy_testbed::topology::{
    CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, NODE_IP_V4, NODE_IP_V6, NODE2_POD_CIDR_V4, NODE2_POD_CIDR_V6,
};
use kproxy_testbed::{PodNetworking, Proto, Where};
use serde_json::json;

use crate::cluster::{Env, node_a_with_ips, service, slice};
use crate::runner::{Case, Check, Client, Dest, Expect, PodSpec, Source, Step};

/// The second NIC of both nodes.
pub const SECOND_NIC: &str = "ovl0";
/// The node's address on the second NIC: what MASQUERADE picks towards node2's pods.
pub const NODE_SECOND_NIC_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
pub const NODE_SECOND_NIC_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x2, 0, 0, 0, 0, 1);
/// node2's end of the second link (the next hop to its pods).
pub const NODE2_SECOND_NIC_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
pub const NODE2_SECOND_NIC_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x192, 0x2, 0, 0, 0, 0, 2);
/// The InternalIPs the node-IP-change case moves the Node to (added to `eth0` first).
pub const NEW_NODE_IP_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 4);
pub const NEW_NODE_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 4);

const WEB: &[(Proto, u16)] = &[(Proto::Tcp, 8080)];
const PROBES: usize = 6;

/// Links `node` and `node2` through [`SECOND_NIC`] and routes node2's pod CIDRs over it with
/// `src <InternalIP>`.
pub fn second_nic(env: &Env) -> Result<(), String> {
    let tb = env.testbed;
    let (node, node2) = (tb.node(), tb.node2());
    let err = |e: kproxy_testbed::TestbedError| e.to_string();
    node.ip(["link", "add", SECOND_NIC, "type", "veth", "peer", "name", SECOND_NIC, "netns", node2.name()])
        .map_err(err)?;
    for (ns, v4, v6) in
        [(node, NODE_SECOND_NIC_V4, NODE_SECOND_NIC_V6), (node2, NODE2_SECOND_NIC_V4, NODE2_SECOND_NIC_V6)]
    {
        ns.ip_batch(&[
            format!("addr add {v4}/24 dev {SECOND_NIC}"),
            format!("addr add {v6}/64 dev {SECOND_NIC} nodad"),
            format!("link set {SECOND_NIC} up"),
        ])
        .map_err(err)?;
        ns.sysctl(&format!("net/ipv4/conf/{SECOND_NIC}/rp_filter"), "0").map_err(err)?;
    }
    // A veth has carrier only once both ends are up.
    for ns in [node, node2] {
        ns.wait_links_up(&[SECOND_NIC], Duration::from_secs(10)).map_err(err)?;
    }
    node.ip_batch(&[
        format!("route replace {NODE2_POD_CIDR_V4} via {NODE2_SECOND_NIC_V4} dev {SECOND_NIC} src {NODE_IP_V4}"),
        format!("route replace {NODE2_POD_CIDR_V6} via {NODE2_SECOND_NIC_V6} dev {SECOND_NIC} src {NODE_IP_V6}"),
    ])
    .map_err(err)
}

/// Adds [`NEW_NODE_IP_V4`] / [`NEW_NODE_IP_V6`] to the node's `eth0`.
fn add_new_node_ips(env: &Env) -> Result<(), String> {
    env.testbed
        .node()
        .ip_batch(&[
            format!("addr add {NEW_NODE_IP_V4}/32 dev eth0"),
            format!("addr add {NEW_NODE_IP_V6}/128 dev eth0 nodad"),
        ])
        .map_err(|e| e.to_string())
}

/// `web` (endpoint `b`, NodePort 30080) and `self` (endpoint `a`), both dual-stack.
fn services(env: &Env) -> Vec<Object> {
    let ports = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
    let dual = |ip4: &str, ip6: &str, extra: serde_json::Value| {
        let mut spec = json!({"clusterIP": ip4, "clusterIPs": [ip4, ip6], "ipFamilies": ["IPv4", "IPv6"],
            "ipFamilyPolicy": "RequireDualStack",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
        if let (Some(s), serde_json::Value::Object(e)) = (spec.as_object_mut(), extra) {
            s.extend(e);
        }
        spec
    };
    let web = dual(
        "198.18.128.10",
        "fd00:96::10",
        json!({"type": "NodePort", "externalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}),
    );
    vec![
        service("default", "web", web, json!({})),
        slice("default", "web", "v4", "IPv4", ports.clone(), vec![env.ep("b", false)]),
        slice("default", "web", "v6", "IPv6", ports.clone(), vec![env.ep("b", true)]),
        service("default", "self", dual("198.18.128.11", "fd00:96::11", json!({})), json!({})),
        slice("default", "self", "v4", "IPv4", ports.clone(), vec![env.ep("a", false)]),
        slice("default", "self", "v6", "IPv6", ports, vec![env.ep("a", true)]),
    ]
}

/// Where a probe goes.
#[derive(Clone, Copy)]
enum To {
    /// `web`'s ClusterIP (endpoint `b`).
    WebClusterIp,
    /// `web`'s NodePort on the node's InternalIP (endpoint `b`).
    WebNodePort,
    /// `self`'s ClusterIP (endpoint `a`: hairpin when `a` is the client).
    SelfClusterIp,
}

/// The source the endpoint must see.
#[derive(Clone, Copy)]
enum Seen {
    /// The second NIC's address (MASQUERADE).
    SecondNic,
    /// The node's InternalIP.
    NodeIp,
    /// What a direct connection from the same client to `b` shows.
    Direct,
    /// The client's own address.
    Client,
    /// These addresses.
    Addr(Ipv4Addr, Ipv6Addr),
}

/// One probe batch per family.
fn both(client: Client, to: To, seen: Seen) -> Vec<Step> {
    [false, true].into_iter().map(|v6| Step::Probe(one(client.clone(), to, seen, v6))).collect()
}

fn one(client: Client, to: To, seen: Seen, v6: bool) -> Check {
    let addr = |v4: &str, v6a: &str| -> SocketAddr {
        let text = if v6 { v6a } else { v4 };
        match text.parse() {
            Ok(a) => a,
            Err(e) => panic!("bad address {text}: {e}"),
        }
    };
    let (dest, backend) = match to {
        To::WebClusterIp => (Dest::ClusterIp(addr("198.18.128.10:80", "[fd00:96::10]:80")), "b"),
        To::WebNodePort => (Dest::NodePort(addr("198.18.0.2:30080", "[fd00:18::2]:30080")), "b"),
        To::SelfClusterIp => (Dest::ClusterIp(addr("198.18.128.11:80", "[fd00:96::11]:80")), "a"),
    };
    let pick = |v4: Ipv4Addr, v6a: Ipv6Addr| Source::Is(if v6 { IpAddr::V6(v6a) } else { IpAddr::V4(v4) });
    let source = match seen {
        Seen::SecondNic => pick(NODE_SECOND_NIC_V4, NODE_SECOND_NIC_V6),
        Seen::NodeIp => pick(NODE_IP_V4, NODE_IP_V6),
        Seen::Direct => Source::AsDirect { pod: "b", port: 8080 },
        Seen::Client => Source::Client,
        Seen::Addr(a, b) => pick(a, b),
    };
    Check::tcp(client, dest, Expect::Backends(vec![backend]), source).count(PROBES)
}

fn pods() -> Vec<PodSpec> {
    vec![
        PodSpec { name: "a", on: Where::Node, serves: WEB.to_vec() },
        PodSpec { name: "b", on: Where::Node2, serves: WEB.to_vec() },
        PodSpec { name: "client", on: Where::Node, serves: Vec::new() },
    ]
}

fn pod_cidrs() -> Vec<IpNet> {
    vec![CLUSTER_CIDR_V4.into(), CLUSTER_CIDR_V6.into()]
}

fn kep_case(
    name: &'static str,
    policy: fn(&mut ProxyPolicy),
    cluster: crate::runner::Build,
    probes: Vec<Vec<Step>>,
) -> Case {
    let mut steps = vec![Step::Setup(second_nic)];
    steps.extend(probes.into_iter().flatten());
    Case { name, requires: Vec::new(), networking: PodNetworking::default(), pods: pods(), cluster, policy, steps }
}

/// The KEP-6246 cases, each for IPv4 and IPv6.
pub fn cases() -> Vec<Case> {
    let node = || Client::Node;
    let ext = || Client::External;
    let pod = || Client::Pod("client");
    let hairpin = || Client::Pod("a");
    vec![
        // Today's behaviour: detect-local (ClusterCIDR) says the node is not a pod, so its
        // ClusterIP traffic is masqueraded — to the second NIC's address, although both the
        // route's src hint and a direct connection say InternalIP.
        kep_case(
            "kep6246_without_options_node_traffic_is_masqueraded_to_the_egress_interface",
            |_| {},
            services,
            vec![
                both(node(), To::WebClusterIp, Seen::SecondNic),
                both(ext(), To::WebNodePort, Seen::SecondNic),
                both(pod(), To::WebClusterIp, Seen::Client),
                both(hairpin(), To::SelfClusterIp, Seen::NodeIp),
            ],
        ),
        // noMasqueradeCIDRs = the cluster's pod CIDRs: node → Service → pod is routed natively
        // and shows exactly what direct node → pod shows; external eTP Cluster traffic and
        // external ClusterIP traffic are still masqueraded (their replies must come back here).
        kep_case(
            "kep6246_no_masquerade_cidrs_route_node_traffic_like_direct_traffic",
            |p| p.no_masquerade_cidrs = pod_cidrs(),
            services,
            vec![
                both(node(), To::WebClusterIp, Seen::Direct),
                both(node(), To::WebClusterIp, Seen::NodeIp),
                both(ext(), To::WebNodePort, Seen::SecondNic),
                both(ext(), To::WebClusterIp, Seen::SecondNic),
                both(pod(), To::WebClusterIp, Seen::Client),
            ],
        ),
        // Hairpin would break unmasqueraded; it wins over the option.
        kep_case(
            "kep6246_no_masquerade_cidrs_still_masquerade_hairpin",
            |p| p.no_masquerade_cidrs = pod_cidrs(),
            services,
            vec![both(hairpin(), To::SelfClusterIp, Seen::NodeIp)],
        ),
        // SNAT to the node IP: the InternalIP, never the second NIC's address, for every
        // masqueraded class (node, external NodePort, hairpin).
        kep_case(
            "kep6246_snat_to_node_ip",
            |p| p.snat_to_node_ip = true,
            services,
            vec![
                both(node(), To::WebClusterIp, Seen::NodeIp),
                both(ext(), To::WebNodePort, Seen::NodeIp),
                both(ext(), To::WebClusterIp, Seen::NodeIp),
                both(hairpin(), To::SelfClusterIp, Seen::NodeIp),
            ],
        ),
        // Both options: exempt traffic is untouched, the rest goes to the InternalIP.
        kep_case(
            "kep6246_snat_to_node_ip_with_no_masquerade_cidrs",
            |p| {
                p.snat_to_node_ip = true;
                p.no_masquerade_cidrs = pod_cidrs();
            },
            services,
            vec![
                both(node(), To::WebClusterIp, Seen::Direct),
                both(ext(), To::WebNodePort, Seen::NodeIp),
                both(hairpin(), To::SelfClusterIp, Seen::NodeIp),
            ],
        ),
        // The Node has no IPv6 InternalIP: IPv6 falls back to MASQUERADE, IPv4 SNATs. Then the
        // Node's InternalIPs change and the SNAT target follows.
        kep_case(
            "kep6246_snat_to_node_ip_falls_back_per_family_and_follows_the_node",
            |p| p.snat_to_node_ip = true,
            |env| {
                let mut objs = vec![node_a_with_ips(&[NODE_IP_V4.into()])];
                objs.extend(services(env));
                objs
            },
            vec![
                vec![Step::Probe(one(Client::Node, To::WebClusterIp, Seen::NodeIp, false))],
                vec![Step::Probe(one(Client::Node, To::WebClusterIp, Seen::SecondNic, true))],
                vec![
                    Step::Setup(add_new_node_ips),
                    Step::Apply(|_| vec![node_a_with_ips(&[NEW_NODE_IP_V4.into(), NEW_NODE_IP_V6.into()])]),
                ],
                both(Client::Node, To::WebClusterIp, Seen::Addr(NEW_NODE_IP_V4, NEW_NODE_IP_V6)),
            ],
        ),
        // masqueradeAll marks everything, but the explicit list wins for the node and for local
        // pods (detected here by interface name, matched in postrouting by iifname); external
        // ClusterIP traffic stays masqueraded.
        kep_case(
            "kep6246_no_masquerade_cidrs_override_masquerade_all_for_node_and_local_pods",
            |p| {
                p.masquerade_all = true;
                p.detect_local = DetectLocal::InterfaceNamePrefix("veth".into());
                p.no_masquerade_cidrs = pod_cidrs();
            },
            services,
            vec![
                both(pod(), To::WebClusterIp, Seen::Client),
                both(node(), To::WebClusterIp, Seen::Direct),
                both(ext(), To::WebClusterIp, Seen::SecondNic),
                both(ext(), To::WebNodePort, Seen::SecondNic),
                both(hairpin(), To::SelfClusterIp, Seen::NodeIp),
            ],
        ),
        // Without a way to detect pod traffic, only the node itself is exempt: masqueradeAll
        // still masquerades pod traffic. (And without masqueradeAll, ClusterIP traffic would not
        // be masqueraded at all.)
        kep_case(
            "kep6246_no_masquerade_cidrs_exempt_only_the_node_when_pods_are_undetectable",
            |p| {
                p.masquerade_all = true;
                p.detect_local = DetectLocal::None;
                p.no_masquerade_cidrs = pod_cidrs();
            },
            services,
            vec![
                both(pod(), To::WebClusterIp, Seen::SecondNic),
                both(node(), To::WebClusterIp, Seen::Direct),
                both(ext(), To::WebNodePort, Seen::SecondNic),
            ],
        ),
    ]
}
