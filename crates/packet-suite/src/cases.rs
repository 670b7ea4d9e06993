//! The cases. Addresses: ClusterIPs in 198.18.128.0/20 and fd00:96::/112, LoadBalancer and
//! external IPs in 203.0.113.0/24 and fd00:203::/64, NodePorts on 198.18.0.2 / fd00:18::2.
//! Backends listen on 8080 (TCP, UDP) unless a case says otherwise.

use std::net::SocketAddr;
use std::time::Duration;

use kproxy_plan::{DetectLocal, NodePortAddress};
use kproxy_state::{Kind, Object};
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::{PodNetworking, Proto, Where};
use serde_json::{Value, json};

use crate::cluster::{Env, endpoint, service, slice};
use crate::runner::{Case, Check, Client, Dest, Expect, PodSpec, Source, Step};

fn sa(s: &str) -> SocketAddr {
    match s.parse() {
        Ok(a) => a,
        Err(e) => panic!("bad address {s}: {e}"),
    }
}

fn pod(name: &'static str, on: Where, serves: &[(Proto, u16)]) -> PodSpec {
    PodSpec { name, on, serves: serves.to_vec() }
}

const WEB: &[(Proto, u16)] = &[(Proto::Tcp, 8080), (Proto::Udp, 8080)];

/// Backend `a` on the node, `b` on node2, and a non-serving `client` pod on the node.
fn ab() -> Vec<PodSpec> {
    vec![pod("a", Where::Node, WEB), pod("b", Where::Node2, WEB), pod("client", Where::Node, &[])]
}

fn no_tweak(_: &mut kproxy_plan::ProxyPolicy) {}

fn case(name: &'static str, cluster: crate::runner::Build, steps: Vec<Step>) -> Case {
    Case {
        name,
        requires: Vec::new(),
        networking: PodNetworking::default(),
        pods: ab(),
        cluster,
        policy: no_tweak,
        steps,
    }
}

fn ports(p: &[(&str, &str, u16)]) -> Value {
    Value::Array(p.iter().map(|(n, proto, port)| json!({"name": n, "protocol": proto, "port": port})).collect())
}

/// `web`: a service at 198.18.128.10 with `spec` merged in, endpoints `eps` (IPv4).
fn web(env: &Env, spec: Value, status: Value, eps: &[&str]) -> Vec<Object> {
    let mut base = json!({"clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
    merge(&mut base, spec);
    let svc_ports: Vec<(String, String, u16)> = base["ports"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or("").to_owned(),
                        p["protocol"].as_str().unwrap_or("TCP").to_owned(),
                        p["targetPort"].as_u64().and_then(|t| u16::try_from(t).ok()).unwrap_or(8080),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let ps: Vec<(&str, &str, u16)> = svc_ports.iter().map(|(n, p, t)| (n.as_str(), p.as_str(), *t)).collect();
    let mut out = vec![service("default", "web", base, status)];
    if !eps.is_empty() {
        out.push(slice("default", "web", "v4", "IPv4", ports(&ps), eps.iter().map(|e| env.ep(e, false)).collect()));
    }
    out
}

fn merge(base: &mut Value, extra: Value) {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
}

const CIP: &str = "198.18.128.10:80";

fn tcp(client: Client, dest: Dest, expect: Expect, source: Source) -> Step {
    Step::Probe(Check::tcp(client, dest, expect, source))
}

fn backends(b: &[&'static str]) -> Expect {
    Expect::Backends(b.to_vec())
}

fn lb_status(ip: &str) -> Value {
    json!({"loadBalancer": {"ingress": [{"ip": ip}]}})
}

/// Every case, in a stable order.
pub fn all_cases() -> Vec<Case> {
    let cip = Dest::ClusterIp(sa(CIP));
    let pod_c = Client::Pod("client");
    let mut cases = vec![
        case(
            "clusterip_tcp",
            |env| web(env, json!({}), json!({}), &["a", "b"]),
            vec![
                tcp(pod_c.clone(), cip, backends(&["a", "b"]), Source::Client),
                tcp(Client::External, cip, backends(&["a", "b"]), Source::NodeIp),
                tcp(Client::Node, cip, backends(&["a", "b"]), Source::NodeIp),
            ],
        ),
        case(
            "clusterip_udp",
            |env| {
                web(
                    env,
                    json!({"ports": [{"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP"}]}),
                    json!({}),
                    &["a", "b"],
                )
            },
            vec![
                Step::Probe(
                    Check::tcp(
                        pod_c.clone(),
                        Dest::ClusterIp(sa("198.18.128.10:53")),
                        backends(&["a", "b"]),
                        Source::Client,
                    )
                    .proto(Proto::Udp),
                ),
                Step::Probe(
                    Check::tcp(
                        Client::External,
                        Dest::ClusterIp(sa("198.18.128.10:53")),
                        backends(&["a", "b"]),
                        Source::NodeIp,
                    )
                    .proto(Proto::Udp),
                ),
            ],
        ),
        Case {
            requires: vec![KernelFeature::Sctp],
            pods: vec![
                pod("a", Where::Node, &[(Proto::Sctp, 8080)]),
                pod("b", Where::Node2, &[(Proto::Sctp, 8080)]),
                pod("client", Where::Node, &[]),
            ],
            ..case(
                "clusterip_sctp",
                |env| {
                    web(
                        env,
                        json!({"ports": [{"name": "s", "port": 80, "targetPort": 8080, "protocol": "SCTP"}]}),
                        json!({}),
                        &["a", "b"],
                    )
                },
                vec![Step::Probe(
                    Check::tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a", "b"]), Source::Client)
                        .proto(Proto::Sctp),
                )],
            )
        },
        Case {
            pods: vec![
                pod("a", Where::Node, WEB),
                pod("b", Where::Node2, &[(Proto::Tcp, 8080), (Proto::Udp, 8080), (Proto::Tcp, 8081)]),
                pod("client", Where::Node, &[]),
            ],
            ..case(
                "multi_port",
                |env| {
                    let spec = json!({"ports": [
                        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                        {"name": "alt", "port": 81, "targetPort": 8081, "protocol": "TCP"},
                        {"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP"}]});
                    let mut objs = web(env, spec, json!({}), &[]);
                    objs.push(slice(
                        "default",
                        "web",
                        "main",
                        "IPv4",
                        ports(&[("http", "TCP", 8080), ("dns", "UDP", 8080)]),
                        vec![env.ep("a", false), env.ep("b", false)],
                    ));
                    objs.push(slice(
                        "default",
                        "web",
                        "alt",
                        "IPv4",
                        ports(&[("alt", "TCP", 8081)]),
                        vec![env.ep("b", false)],
                    ));
                    objs
                },
                vec![
                    tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a", "b"]), Source::Client),
                    tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa("198.18.128.10:81")),
                        backends(&["b"]),
                        Source::Client,
                    ),
                    Step::Probe(
                        Check::tcp(
                            Client::Pod("client"),
                            Dest::ClusterIp(sa("198.18.128.10:53")),
                            backends(&["a", "b"]),
                            Source::Client,
                        )
                        .proto(Proto::Udp),
                    ),
                ],
            )
        },
        Case {
            pods: vec![
                pod("a", Where::Node, WEB),
                pod("b", Where::Node2, WEB),
                pod("c", Where::Node2, WEB),
                pod("client", Where::Node, &[]),
            ],
            ..case(
                "endpoints_spread_evenly",
                |env| web(env, json!({}), json!({}), &["a", "b", "c"]),
                vec![Step::Probe(
                    Check::tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa(CIP)),
                        Expect::Even(vec!["a", "b", "c"]),
                        Source::Client,
                    )
                    .count(1200),
                )],
            )
        },
        case(
            "nodeport_primary_ip_only",
            |env| {
                web(
                    env,
                    json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
                    json!({}),
                    &["a", "b"],
                )
            },
            vec![
                Step::AddNodeAddress("198.18.3.1/24"),
                tcp(Client::External, Dest::NodePort(sa("198.18.0.2:30080")), backends(&["a", "b"]), Source::NodeIp),
                tcp(Client::Node, Dest::NodePort(sa("198.18.3.1:30080")), Expect::Reject, Source::Any),
            ],
        ),
        Case {
            policy: |p| p.nodeport_addresses = vec![NodePortAddress::All],
            ..case(
                "nodeport_all_addresses",
                |env| {
                    web(
                        env,
                        json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
                        json!({}),
                        &["a", "b"],
                    )
                },
                vec![
                    Step::AddNodeAddress("198.18.3.1/24"),
                    tcp(
                        Client::External,
                        Dest::NodePort(sa("198.18.0.2:30080")),
                        backends(&["a", "b"]),
                        Source::NodeIp,
                    ),
                    tcp(Client::Node, Dest::NodePort(sa("198.18.3.1:30080")), backends(&["a", "b"]), Source::Any),
                ],
            )
        },
        case(
            "loadbalancer_ip",
            |env| {
                web(
                    env,
                    json!({"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
                    lb_status("203.0.113.10"),
                    &["a", "b"],
                )
            },
            vec![tcp(
                Client::External,
                Dest::LoadBalancer(sa("203.0.113.10:80")),
                backends(&["a", "b"]),
                Source::NodeIp,
            )],
        ),
        case(
            "external_ip",
            |env| web(env, json!({"externalIPs": ["203.0.113.11"]}), json!({}), &["a", "b"]),
            vec![tcp(Client::External, Dest::ExternalIp(sa("203.0.113.11:80")), backends(&["a", "b"]), Source::NodeIp)],
        ),
        case(
            "etp_local_keeps_client_ip_and_local_endpoints",
            |env| {
                web(
                    env,
                    json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
                    lb_status("203.0.113.10"),
                    &["a", "b"],
                )
            },
            vec![
                tcp(Client::External, Dest::LoadBalancer(sa("203.0.113.10:80")), backends(&["a"]), Source::Client),
                tcp(Client::External, Dest::NodePort(sa("198.18.0.2:30080")), backends(&["a"]), Source::Client),
            ],
        ),
        case(
            "etp_local_short_circuits_pods_and_host",
            |env| {
                web(
                    env,
                    json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
                    lb_status("203.0.113.10"),
                    &["a", "b"],
                )
            },
            vec![
                tcp(
                    Client::Pod("client"),
                    Dest::LoadBalancer(sa("203.0.113.10:80")),
                    backends(&["a", "b"]),
                    Source::Client,
                ),
                tcp(Client::Node, Dest::NodePort(sa("198.18.0.2:30080")), backends(&["a", "b"]), Source::NodeIp),
            ],
        ),
        case(
            "itp_local",
            |env| web(env, json!({"internalTrafficPolicy": "Local"}), json!({}), &["a", "b"]),
            vec![tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a"]), Source::Client)],
        ),
        case(
            "client_ip_affinity_sticks_and_expires",
            |env| {
                web(
                    env,
                    json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 1}}}),
                    json!({}),
                    &["a", "b"],
                )
            },
            vec![
                Step::Probe(
                    Check::tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa(CIP)),
                        Expect::OneOf(vec!["a", "b"]),
                        Source::Client,
                    )
                    .count(20),
                ),
                Step::AffinityExpires {
                    check: Check::tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa(CIP)),
                        Expect::OneOf(vec!["a", "b"]),
                        Source::Client,
                    ),
                    timeout: Duration::from_secs(1),
                    rounds: 10,
                },
            ],
        ),
        case(
            "client_ip_affinity_on_a_nodeport",
            |env| {
                web(
                    env,
                    json!({"type": "NodePort", "sessionAffinity": "ClientIP",
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
                    json!({}),
                    &["a", "b"],
                )
            },
            vec![Step::Probe(
                Check::tcp(
                    Client::Pod("client"),
                    Dest::NodePort(sa("198.18.0.2:30080")),
                    Expect::OneOf(vec!["a", "b"]),
                    Source::NodeIp,
                )
                .count(5),
            )],
        ),
        case(
            "no_endpoints_rejects",
            |env| {
                web(
                    env,
                    json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}, {"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP"}]}),
                    json!({}),
                    &[],
                )
            },
            vec![
                tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), Expect::Reject, Source::Any),
                tcp(Client::Node, Dest::ClusterIp(sa(CIP)), Expect::Reject, Source::Any),
                Step::Probe(
                    Check::tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa("198.18.128.10:53")),
                        Expect::Reject,
                        Source::Any,
                    )
                    .proto(Proto::Udp),
                ),
            ],
        ),
        case(
            "local_policy_without_local_endpoints_drops",
            |env| {
                let mut o = web(env, json!({"internalTrafficPolicy": "Local"}), json!({}), &["b"]);
                o.push(service("default", "lb", json!({"type": "LoadBalancer", "clusterIP": "198.18.128.11", "externalTrafficPolicy": "Local",
                    "healthCheckNodePort": 31000, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30081}]}), lb_status("203.0.113.12")));
                o.push(slice("default", "lb", "v4", "IPv4", ports(&[("http", "TCP", 8080)]), vec![env.ep("b", false)]));
                o.push(service("default", "lb-local", json!({"type": "LoadBalancer", "clusterIP": "198.18.128.12", "externalTrafficPolicy": "Local",
                    "healthCheckNodePort": 31001, "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30082}]}), lb_status("203.0.113.13")));
                o.push(slice(
                    "default",
                    "lb-local",
                    "v4",
                    "IPv4",
                    ports(&[("http", "TCP", 8080)]),
                    vec![env.ep("a", false)],
                ));
                o
            },
            vec![
                // The paths work when the policy allows it: the same endpoint through the other
                // service's ClusterIP (Cluster policy), and the External client through the
                // LoadBalancer IP and NodePort of a Local service with a local endpoint, so the
                // drops below are the policy's.
                tcp(Client::Pod("client"), Dest::ClusterIp(sa("198.18.128.11:80")), backends(&["b"]), Source::Client),
                tcp(Client::External, Dest::LoadBalancer(sa("203.0.113.13:80")), backends(&["a"]), Source::Client),
                tcp(Client::External, Dest::NodePort(sa("198.18.0.2:30082")), backends(&["a"]), Source::Client),
                Step::Probe(
                    Check::tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), Expect::Drop, Source::Any).count(2),
                ),
                Step::Probe(
                    Check::tcp(Client::External, Dest::LoadBalancer(sa("203.0.113.12:80")), Expect::Drop, Source::Any)
                        .count(2),
                ),
                Step::Probe(
                    Check::tcp(Client::External, Dest::NodePort(sa("198.18.0.2:30081")), Expect::Drop, Source::Any)
                        .count(2),
                ),
            ],
        ),
        case(
            "load_balancer_source_ranges",
            |env| {
                let mut o = web(
                    env,
                    json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ["198.18.0.10/32"],
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}),
                    lb_status("203.0.113.10"),
                    &["a", "b"],
                );
                o.push(service("default", "denied", json!({"type": "LoadBalancer", "clusterIP": "198.18.128.11", "loadBalancerSourceRanges": ["192.0.2.0/24"],
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30081}]}), lb_status("203.0.113.12")));
                o.push(slice(
                    "default",
                    "denied",
                    "v4",
                    "IPv4",
                    ports(&[("http", "TCP", 8080)]),
                    vec![env.ep("a", false), env.ep("b", false)],
                ));
                o
            },
            vec![
                tcp(Client::External, Dest::LoadBalancer(sa("203.0.113.10:80")), backends(&["a", "b"]), Source::NodeIp),
                Step::Probe(
                    Check::tcp(Client::External, Dest::LoadBalancer(sa("203.0.113.12:80")), Expect::Drop, Source::Any)
                        .count(2),
                ),
            ],
        ),
        case(
            "hairpin_is_masqueraded",
            |env| web(env, json!({}), json!({}), &["a"]),
            vec![Step::Probe(
                Check::tcp(Client::Pod("a"), Dest::ClusterIp(sa(CIP)), backends(&["a"]), Source::NodeIp).count(4),
            )],
        ),
        Case {
            policy: |p| p.masquerade_all = true,
            ..case(
                "masquerade_all",
                |env| web(env, json!({}), json!({}), &["a", "b"]),
                vec![tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a", "b"]), Source::NodeIp)],
            )
        },
        Case {
            policy: |p| p.detect_local = DetectLocal::NodeCidr,
            ..case("detect_local_node_cidr", |env| web(env, json!({}), json!({}), &["a", "b"]), detect_local_steps())
        },
        Case {
            policy: |p| p.detect_local = DetectLocal::InterfaceNamePrefix("veth".into()),
            ..case(
                "detect_local_interface_name_prefix",
                |env| web(env, json!({}), json!({}), &["a", "b"]),
                detect_local_steps(),
            )
        },
        Case {
            networking: PodNetworking::Bridge { name: "cbr0".into() },
            policy: |p| p.detect_local = DetectLocal::BridgeInterface("cbr0".into()),
            ..case(
                "detect_local_bridge_interface",
                |env| web(env, json!({}), json!({}), &["a", "b"]),
                detect_local_steps(),
            )
        },
        Case {
            policy: |p| p.detect_local = DetectLocal::None,
            ..case(
                "detect_local_none_never_masquerades_cluster_ips",
                |env| web(env, json!({}), json!({}), &["a"]),
                vec![
                    tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a"]), Source::Client),
                    tcp(Client::External, Dest::ClusterIp(sa(CIP)), backends(&["a"]), Source::Client),
                ],
            )
        },
        case(
            "terminating_endpoints_are_a_fallback",
            |env| {
                let mut o = web(env, json!({}), json!({}), &[]);
                let cond = |serving: bool| json!({"ready": false, "serving": serving, "terminating": true});
                o.push(slice(
                    "default",
                    "web",
                    "v4",
                    "IPv4",
                    ports(&[("http", "TCP", 8080)]),
                    vec![endpoint(&env.v4("a"), "node-a", cond(true)), endpoint(&env.v4("b"), "node-b", cond(false))],
                ));
                o
            },
            vec![tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a"]), Source::Client)],
        ),
        case(
            "topology_hints_pick_same_zone",
            |env| {
                let mut o = web(env, json!({"trafficDistribution": "PreferSameZone"}), json!({}), &[]);
                let hinted = |name: &str, zone: &str| {
                    let mut e = env.ep(name, false);
                    e["hints"] = json!({"forZones": [{"name": zone}]});
                    e
                };
                o.push(slice(
                    "default",
                    "web",
                    "v4",
                    "IPv4",
                    ports(&[("http", "TCP", 8080)]),
                    vec![hinted("a", "zone-a"), hinted("b", "zone-b")],
                ));
                o
            },
            vec![tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a"]), Source::Client)],
        ),
        case(
            "ipv6_clusterip",
            dual_stack_web,
            vec![
                tcp(
                    Client::Pod("client"),
                    Dest::ClusterIp(sa("[fd00:96::10]:80")),
                    backends(&["a", "b"]),
                    Source::Client,
                ),
                tcp(Client::External, Dest::ClusterIp(sa("[fd00:96::10]:80")), backends(&["a", "b"]), Source::NodeIp),
            ],
        ),
        case(
            "ipv6_nodeport",
            dual_stack_web,
            vec![tcp(
                Client::External,
                Dest::NodePort(sa("[fd00:18::2]:30080")),
                backends(&["a", "b"]),
                Source::NodeIp,
            )],
        ),
        case(
            "ipv6_etp_local",
            |env| {
                let mut o = dual_stack_web(env);
                if let Some(Object::Service(s)) = o.first_mut()
                    && let Some(spec) = s.service.spec.as_mut()
                {
                    spec.external_traffic_policy = Some("Local".into());
                    spec.health_check_node_port = Some(31000);
                }
                o
            },
            vec![
                tcp(Client::External, Dest::LoadBalancer(sa("[fd00:203::10]:80")), backends(&["a"]), Source::Client),
                tcp(Client::External, Dest::NodePort(sa("[fd00:18::2]:30080")), backends(&["a"]), Source::Client),
            ],
        ),
        case(
            "service_updated_in_place",
            |env| web(env, json!({}), json!({}), &["a"]),
            vec![
                tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a"]), Source::Client),
                Step::Apply(|env| web(env, json!({}), json!({}), &["a", "b"])),
                tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a", "b"]), Source::Client),
                Step::Apply(|env| web(env, json!({}), json!({}), &["b"])),
                tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["b"]), Source::Client),
                Step::Apply(|env| {
                    web(
                        env,
                        json!({"ports": [{"name": "http", "port": 81, "targetPort": 8080, "protocol": "TCP"}]}),
                        json!({}),
                        &["b"],
                    )
                }),
                tcp(Client::Pod("client"), Dest::ClusterIp(sa("198.18.128.10:81")), backends(&["b"]), Source::Client),
                tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), Expect::Reject, Source::Any),
                Step::Delete(vec![(Kind::Service, "default", "web")]),
                tcp(Client::Pod("client"), Dest::ClusterIp(sa("198.18.128.10:81")), Expect::Drop, Source::Any),
            ],
        ),
        Case {
            pods: vec![
                pod("a", Where::Node, WEB),
                pod("b", Where::Node2, WEB),
                pod("c", Where::Node2, WEB),
                pod("d", Where::Node, WEB),
                pod("e", Where::Node2, WEB),
                pod("f", Where::Node2, WEB),
                pod("client", Where::Node, &[]),
            ],
            // A rolling update, one endpoint at a time: replaced, removed, added, across a
            // change of the pick's cap (4 → 8 → 4 slots). Every step reaches exactly its
            // endpoints, and the last evenly: however a dataplane keeps them (nftables keeps an
            // endpoint in its slot while it stays, so its slots end out of sorted order).
            ..case(
                "rolling_replacement_reaches_every_endpoint",
                |env| web(env, json!({}), json!({}), &["a", "b", "c", "d"]),
                vec![
                    tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa(CIP)),
                        backends(&["a", "b", "c", "d"]),
                        Source::Client,
                    ),
                    Step::Apply(|env| web(env, json!({}), json!({}), &["e", "b", "c", "d"])),
                    tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa(CIP)),
                        backends(&["b", "c", "d", "e"]),
                        Source::Client,
                    ),
                    Step::Apply(|env| web(env, json!({}), json!({}), &["e", "c", "d"])),
                    tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["c", "d", "e"]), Source::Client),
                    Step::Apply(|env| web(env, json!({}), json!({}), &["e", "c", "d", "f", "a"])),
                    tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa(CIP)),
                        backends(&["a", "c", "d", "e", "f"]),
                        Source::Client,
                    ),
                    Step::Apply(|env| web(env, json!({}), json!({}), &["c", "d", "f", "a"])),
                    tcp(
                        Client::Pod("client"),
                        Dest::ClusterIp(sa(CIP)),
                        backends(&["a", "c", "d", "f"]),
                        Source::Client,
                    ),
                    Step::Apply(|env| web(env, json!({}), json!({}), &["b", "d", "f", "a"])),
                    Step::Probe(
                        Check::tcp(
                            Client::Pod("client"),
                            Dest::ClusterIp(sa(CIP)),
                            Expect::Even(vec!["a", "b", "d", "f"]),
                            Source::Client,
                        )
                        .count(800),
                    ),
                ],
            )
        },
        case(
            "cleanup_leaves_the_kernel_as_found",
            dual_stack_web,
            vec![
                tcp(Client::Pod("client"), Dest::ClusterIp(sa(CIP)), backends(&["a", "b"]), Source::Client),
                Step::CleanupLeavesNothing,
            ],
        ),
    ];
    cases.extend(crate::kep6246::cases());
    cases
}

fn detect_local_steps() -> Vec<Step> {
    let cip = Dest::ClusterIp(sa(CIP));
    vec![
        tcp(Client::Pod("client"), cip, backends(&["a", "b"]), Source::Client),
        tcp(Client::External, cip, backends(&["a", "b"]), Source::Masqueraded),
    ]
}

/// A dual-stack LoadBalancer `web` with NodePort 30080 and LB IPs in both families.
fn dual_stack_web(env: &Env) -> Vec<Object> {
    let spec = json!({"type": "LoadBalancer", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10", "fd00:96::10"],
        "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]});
    let status = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}, {"ip": "fd00:203::10"}]}});
    vec![
        service("default", "web", spec, status),
        slice(
            "default",
            "web",
            "v4",
            "IPv4",
            ports(&[("http", "TCP", 8080)]),
            vec![env.ep("a", false), env.ep("b", false)],
        ),
        slice(
            "default",
            "web",
            "v6",
            "IPv6",
            ports(&[("http", "TCP", 8080)]),
            vec![env.ep("a", true), env.ep("b", true)],
        ),
    ]
}
