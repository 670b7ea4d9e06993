//! What one service port puts in the kernel: virtual services with their real servers, VIPs on
//! the dummy interface, and elements of the auxiliary table's shared sets and maps.
//!
//! One IPVS virtual service has one real-server set, while a Kubernetes service port has up to
//! two (cluster and local endpoints) chosen by traffic class. The classes map to services so:
//!
//! - `ClusterIP:port` — an address service with the internal endpoints (`internalTrafficPolicy`).
//! - `ExternalIP:port`, `LoadBalancerIP:port` — address services with the external endpoints
//!   (cluster ones under `externalTrafficPolicy: Cluster`, local ones under `Local`).
//! - NodePorts — an address service on each NodePort address (the node's addresses, followed,
//!   under `nodePortAddresses` unset) with the external endpoints, as upstream's. These are the
//!   very services kube-proxy's IPVS mode makes, so a node moving between the two proxies keeps
//!   its NodePort connections: IPVS drops the packets of a connection whose service is deleted,
//!   and each proxy adopts the other's services instead. (A firewall-mark service per port,
//!   matched on any local address, was one service instead of one per address, but kube-proxy
//!   never deletes it nor serves through it, so handing a node back broke its connections; and
//!   under ClientIP affinity it kept the client's destination port for its real server: the
//!   kernel's `ip_vs_sched_persist` maps only a destination port equal to the service's, and a
//!   firewall-mark service has port 0.)
//! - `externalTrafficPolicy: Local` short-circuit — traffic from local pods and from the node to
//!   the external addresses or the NodePort goes to the cluster endpoints: the auxiliary table
//!   marks it with the port's firewall mark, and IPVS looks firewall-mark services up before
//!   address services. Under ClientIP affinity this firewall-mark service is not persistent
//!   (the port reason above): short-circuited connections are balanced without stickiness.
//!
//! Accelerated service ports (KEP-4963 opt-in, acceleration on, no session affinity: see
//! [`dnat_in_nftables`]) keep all their virtual services, but their connections are DNATed in
//! the auxiliary table before IPVS sees them: their destinations go in the `accel-*` sets and
//! their endpoints in the nftables dataplane's pick maps, and they get no firewall marks.
//!
//! No service is created for traffic the plan rejects (no endpoints at all): the auxiliary table
//! rejects it before IPVS sees it. An external address's service whose local set is empty (the
//! plan's `Drop`) exists with no real servers, and the auxiliary table drops its traffic first;
//! such a NodePort has no service on the node's addresses (its short-circuit is served).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use kproxy_nft_model::{Element, Key, MapData, Value, Verdict};
use kproxy_nftables::ruleset::Ctx;
use kproxy_nftables::ruleset::pick::{HeldSlots, Slots};
use kproxy_plan::{Endpoint, ExternalPolicy, MasqueradeWhen, NoEndpointsVerdict, NodePlan, ServicePortPlan};
use kproxy_state::Protocol;

use crate::aux_table as t;
use crate::config::Config;
use crate::genl::{DestKey, F_PERSISTENT, ServiceKey, ServiceSpec};

/// A virtual service kproxy wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredVs {
    /// The service.
    pub spec: ServiceSpec,
    /// Its protocol (firewall-mark services have none in the kernel; UDP skips graceful termination).
    pub protocol: Protocol,
    /// Its real servers (weight 1 each).
    pub dests: BTreeSet<DestKey>,
}

/// Everything one service port puts in the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PortObjects {
    /// Virtual services.
    pub services: Vec<DesiredVs>,
    /// Addresses for the dummy interface.
    pub vips: Vec<IpAddr>,
    /// Elements of the auxiliary table's sets and maps.
    pub elements: Vec<Element>,
    /// Its NodePort is address services on the node's addresses: they change with the node's
    /// addresses.
    pub on_node_addresses: bool,
}

fn verdict(v: NoEndpointsVerdict) -> Option<MapData> {
    Some(MapData::Verdict(match v {
        NoEndpointsVerdict::Reject => Verdict::goto(t::REJECT_CHAIN),
        NoEndpointsVerdict::Drop => Verdict::Drop,
    }))
}

/// A firewall mark as map data.
fn mark_data(mark: u32) -> Option<MapData> {
    Some(MapData::Value(Key(vec![Value::Int(mark)])))
}

fn dests(eps: &[Endpoint]) -> BTreeSet<DestKey> {
    eps.iter().map(|e| DestKey { addr: e.ip, port: e.port }).collect()
}

/// Whether the connections of `p` are DNATed in the auxiliary table (conntrack's NAT, which
/// the acceleration flowtable can offload) rather than by IPVS: opted in to acceleration (which
/// is on) and without ClientIP affinity, which the nftables pick can not keep in shared maps.
pub fn dnat_in_nftables(p: &ServicePortPlan) -> bool {
    p.accelerate && p.affinity_timeout.is_none()
}

/// The pick slots of `p`'s endpoints when it follows `old` (its last rendering, if any): every
/// endpoint still there keeps the slot `old` gave it, as in the nftables dataplane, so one
/// endpoint change of an accelerated port is a few elements, not a renumbering.
pub fn slots_following(p: &ServicePortPlan, old: Option<&PortObjects>) -> Slots {
    match old {
        Some(old) if dnat_in_nftables(p) => Slots::adopt(p, &HeldSlots::of_elements(&old.elements)),
        _ => Slots::sorted(),
    }
}

/// Renders one service port; `mark` hands out the port's firewall mark (its short-circuit to
/// the cluster endpoints); `slots` says which slot of the pick each endpoint of an accelerated
/// port takes (see [`slots_following`]).
pub fn render_port(
    cfg: &Config,
    ctx: &Ctx,
    node: &NodePlan,
    p: &ServicePortPlan,
    slots: &Slots,
    mark: &mut dyn FnMut() -> u32,
) -> PortObjects {
    let mut out = PortObjects::default();
    let proto = p.protocol;
    let elem = |set: &str, key: Key, value: Option<MapData>| Element { set: set.to_owned(), key, value };
    let dest = |addr: &IpAddr, port: u16| Key(vec![Value::Addr(*addr), Value::Proto(proto), Value::Port(port)]);
    let addr = |a: &IpAddr| Key(vec![Value::Addr(*a)]);
    let nodeport = |np: u16| Key(vec![Value::Proto(proto), Value::Port(np)]);
    let allow = |lb: &IpAddr, range: IpNet| {
        let mut k = dest(lb, p.port);
        k.0.push(Value::Prefix(range));
        k
    };
    // Only address services can be persistent: see the module's doc.
    let vs = |key: ServiceKey, eps: &[Endpoint]| {
        let (flags, timeout) = match (p.affinity_timeout, key) {
            (Some(t), ServiceKey::Addr { .. }) => (cfg.scheduler.flags() | F_PERSISTENT, t),
            _ => (cfg.scheduler.flags(), 0),
        };
        DesiredVs {
            spec: ServiceSpec { key, scheduler: cfg.scheduler.name().to_owned(), flags, timeout },
            protocol: p.protocol,
            dests: dests(eps),
        }
    };
    let family = ctx.family;
    let dnat = dnat_in_nftables(p);

    // ClusterIP.
    out.vips.push(p.cluster_ip);
    out.elements.push(elem(t::VIPS, addr(&p.cluster_ip), None));
    out.elements.push(elem(t::VIP_PORTS, dest(&p.cluster_ip, p.port), None));
    out.services
        .push(vs(ServiceKey::Addr { addr: p.cluster_ip, protocol: p.protocol, port: p.port }, p.internal_endpoints()));
    if let Some(v) = p.internal.no_endpoints {
        out.elements.push(elem(t::NO_ENDPOINT_SERVICES, dest(&p.cluster_ip, p.port), verdict(v)));
    }
    if dnat && p.internal.no_endpoints.is_none() {
        let set = if p.internal.local { t::ACCEL_LOCAL } else { t::ACCEL_CLUSTER };
        out.elements.push(elem(set, dest(&p.cluster_ip, p.port), None));
    }
    match p.internal.masquerade {
        MasqueradeWhen::Always => out.elements.push(elem(t::MASQ_ALWAYS, dest(&p.cluster_ip, p.port), None)),
        MasqueradeWhen::SourceNotLocal => out.elements.push(elem(t::MASQ_NOT_LOCAL, dest(&p.cluster_ip, p.port), None)),
        MasqueradeWhen::Never => {}
    }

    // ExternalIPs, LoadBalancer IPs, NodePort.
    if let Some(ext) = &p.external {
        for vip in p.external_vips() {
            out.vips.push(*vip);
            out.elements.push(elem(t::VIPS, addr(vip), None));
            out.elements.push(elem(t::VIP_PORTS, dest(vip, p.port), None));
        }
        if let Some(v) = ext.no_endpoints {
            for vip in p.external_vips() {
                out.elements.push(elem(t::NO_ENDPOINT_SERVICES, dest(vip, p.port), verdict(v)));
            }
            if let Some(np) = p.node_port {
                out.elements.push(elem(t::NO_ENDPOINT_NODEPORTS, nodeport(np), verdict(v)));
            }
        }
        if ext.no_endpoints != Some(NoEndpointsVerdict::Reject) {
            let (external_eps, local) = match ext.policy {
                ExternalPolicy::Cluster => (&p.cluster_endpoints, false),
                ExternalPolicy::Local { .. } => (&p.local_endpoints, true),
            };
            for vip in p.external_vips() {
                out.services
                    .push(vs(ServiceKey::Addr { addr: *vip, protocol: p.protocol, port: p.port }, external_eps));
                out.elements.push(elem(t::EXTERNAL_DESTS, dest(vip, p.port), None));
                if dnat {
                    let set = if local { t::ACCEL_EXTERNAL_LOCAL } else { t::ACCEL_CLUSTER };
                    out.elements.push(elem(set, dest(vip, p.port), None));
                }
                if !local {
                    out.elements.push(elem(t::MASQ_EXTERNAL, dest(vip, p.port), None));
                }
            }
            if let Some(np) = p.node_port {
                let np_key = nodeport(np);
                // Without local endpoints (the plan's Drop) there is no service for external
                // NodePort traffic: the auxiliary table drops it; only the short-circuit is served.
                if ext.no_endpoints.is_none() {
                    out.on_node_addresses = true;
                    for &addr in node.nodeport_addresses.addresses() {
                        out.services.push(vs(ServiceKey::Addr { addr, protocol: p.protocol, port: np }, external_eps));
                    }
                }
                out.elements.push(elem(t::NODEPORTS, np_key.clone(), None));
                if dnat {
                    let set = if local { t::ACCEL_NODEPORTS_LOCAL } else { t::ACCEL_NODEPORTS };
                    out.elements.push(elem(set, np_key.clone(), None));
                }
                if local {
                    if !dnat {
                        out.elements.push(elem(t::SHORTCIRCUIT_NODEPORTS, np_key, mark_data(mark())));
                    }
                } else {
                    out.elements.push(elem(t::MASQ_NODEPORTS, np_key, None));
                }
            }
            if local {
                out.services.push(vs(ServiceKey::Fwmark { family, mark: mark() }, &p.cluster_endpoints));
                for vip in p.external_vips().filter(|_| !dnat) {
                    out.elements.push(elem(t::SHORTCIRCUIT_DESTS, dest(vip, p.port), mark_data(mark())));
                }
            }
        }
        let allowed = p.firewall_allowed_sources(node.node_ip);
        if !allowed.is_empty() {
            for lb in &p.load_balancer_ips {
                out.elements.push(elem(t::FIREWALL_DESTS, dest(lb, p.port), None));
                for range in &allowed {
                    out.elements.push(elem(t::FIREWALL_ALLOW, allow(lb, *range), None));
                }
            }
        }
    }

    if dnat {
        out.elements.extend(kproxy_nftables::ruleset::pick::elements(p, slots).into_iter().map(|(_, e)| e));
    }
    for ep in p.hairpin_endpoints() {
        out.elements.push(elem(t::HAIRPIN, Key(vec![Value::Addr(ep.ip), Value::Addr(ep.ip)]), None));
    }
    out.vips.sort();
    out.vips.dedup();
    out.elements.sort();
    out.elements.dedup();
    out
}
