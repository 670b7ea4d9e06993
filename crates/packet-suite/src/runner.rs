//! Running one case against one dataplane.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use kproxy_plan::{Dataplane, DetectLocal, NodeContext, Plan, PlanDelta, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState, Object};
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::topology::{
    CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, NODE_IP_V4, NODE_IP_V6, NODE_POD_CIDR_V4, NODE_POD_CIDR_V6,
};
use kproxy_testbed::{PodNetworking, ProbeOptions, Proto, Testbed, Where, chi_square_uniform, probe_many};

use crate::cluster::{Env, NODE_A, node_objects};

/// The dataplane under test is created, synced (with `partial_sync`: the first call carries
/// everything) and cleaned up on threads that have entered the node's network namespace, so
/// commands it spawns (`nft`, `iptables-restore`) and netlink sockets it opens act on the node.
fn sync<D: Dataplane>(tb: &Testbed, dp: &mut D, plan: &Plan, delta: &PlanDelta) -> Result<(), String> {
    tb.node().run_in(|| dp.partial_sync(plan, delta).map_err(|e| e.to_string())).map_err(|e| e.to_string())?
}

fn cleanup<D: Dataplane>(tb: &Testbed, dp: &mut D) -> Result<(), String> {
    tb.node().run_in(|| dp.cleanup().map_err(|e| e.to_string())).map_err(|e| e.to_string())?
}

/// A pod the case needs, and what it serves.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// Name (backends answer with it).
    pub name: &'static str,
    /// Node.
    pub on: Where,
    /// Ports it serves.
    pub serves: Vec<(Proto, u16)>,
}

/// Where a probe comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Client {
    /// The external client.
    External,
    /// The proxy's node itself.
    Node,
    /// A pod.
    Pod(&'static str),
}

/// Where a probe goes (the label says what kind of address it is, for reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// A ClusterIP.
    ClusterIp(SocketAddr),
    /// A NodePort on some node address.
    NodePort(SocketAddr),
    /// A LoadBalancer ingress IP.
    LoadBalancer(SocketAddr),
    /// An external IP.
    ExternalIp(SocketAddr),
}

impl Dest {
    /// The address.
    pub fn addr(&self) -> SocketAddr {
        match *self {
            Dest::ClusterIp(a) | Dest::NodePort(a) | Dest::LoadBalancer(a) | Dest::ExternalIp(a) => a,
        }
    }
}

/// What should happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Every probe answered, by exactly this set of backends (each seen at least once).
    Backends(Vec<&'static str>),
    /// Every probe answered by one backend of this set, the same for all (affinity).
    OneOf(Vec<&'static str>),
    /// Answered by these backends, spread evenly (χ² at p = 0.001).
    Even(Vec<&'static str>),
    /// Refused (TCP RST / ICMP port unreachable).
    Reject,
    /// Dropped (timeout).
    Drop,
}

/// Which source address the backends must see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The client's own address (no masquerade).
    Client,
    /// The node's primary address of the family (masqueraded out of the uplink, or routed pods).
    NodeIp,
    /// Masqueraded to some address of the proxy's node: its primary IP, or the pod bridge's
    /// address when the endpoint sits behind the bridge (MASQUERADE picks the egress
    /// interface's address).
    Masqueraded,
    /// Exactly this address (what the kernel is known to pick in the case's topology).
    Is(IpAddr),
    /// Exactly what the same client's direct connection to `pod`'s address (of the probe's
    /// family) on `port` shows — measured with a real connection just before the probes.
    AsDirect {
        /// The pod to connect to directly.
        pod: &'static str,
        /// The port it serves.
        port: u16,
    },
    /// Not checked (no answer expected).
    Any,
}

/// One probe batch.
#[derive(Debug, Clone)]
pub struct Check {
    /// From.
    pub client: Client,
    /// To.
    pub dest: Dest,
    /// Protocol.
    pub proto: Proto,
    /// How many connections.
    pub count: usize,
    /// Expected outcome.
    pub expect: Expect,
    /// Expected source address at the backend.
    pub source: Source,
}

impl Check {
    /// A TCP check of 12 connections.
    pub fn tcp(client: Client, dest: Dest, expect: Expect, source: Source) -> Self {
        Check { client, dest, proto: Proto::Tcp, count: 12, expect, source }
    }

    /// The same with another protocol.
    pub fn proto(mut self, proto: Proto) -> Self {
        self.proto = proto;
        self
    }

    /// The same with another probe count.
    pub fn count(mut self, count: usize) -> Self {
        self.count = count;
        self
    }
}

/// Builds cluster changes from the testbed's addresses.
pub type Build = fn(&Env) -> Vec<Object>;

/// Changes the testbed for a case (e.g. a second NIC with routes through it).
pub type Setup = fn(&Env) -> Result<(), String>;

/// One step of a case.
#[derive(Debug, Clone)]
pub enum Step {
    /// Send probes and compare.
    Probe(Check),
    /// Apply objects (added or updated) and sync the delta.
    Apply(Build),
    /// Delete objects and sync the delta.
    Delete(Vec<(kproxy_state::Kind, &'static str, &'static str)>),
    /// Wait (affinity timeouts).
    Sleep(Duration),
    /// Stop a pod's backends.
    StopServing(&'static str),
    /// Add a secondary interface with this address to the proxy's node.
    AddNodeAddress(&'static str),
    /// Change the testbed (links, addresses, routes) beyond what the builder offers.
    Setup(Setup),
    /// ClientIP affinity expires: `rounds` times, wait past `timeout` and open 3 connections
    /// (which must stick together); over the rounds more than one backend must be chosen.
    AffinityExpires {
        /// The probes of one round (count is ignored, 3 are sent).
        check: Check,
        /// The affinity timeout.
        timeout: Duration,
        /// Rounds.
        rounds: usize,
    },
    /// Remove the dataplane and check the node's ruleset is as the testbed left it.
    CleanupLeavesNothing,
}

/// A packet case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Name; also the test's name.
    pub name: &'static str,
    /// Kernel features beyond the host's (SCTP runs in the guest kernel).
    pub requires: Vec<KernelFeature>,
    /// How pods attach to nodes.
    pub networking: PodNetworking,
    /// Pods.
    pub pods: Vec<PodSpec>,
    /// The cluster objects besides the two Nodes.
    pub cluster: Build,
    /// Proxy policy tweaks on top of [`default_policy`].
    pub policy: fn(&mut ProxyPolicy),
    /// What to do.
    pub steps: Vec<Step>,
}

/// The policy cases start from: both families, detect-local by the cluster CIDRs,
/// NodePorts on the primary IPs.
pub fn default_policy() -> ProxyPolicy {
    ProxyPolicy {
        detect_local: DetectLocal::ClusterCidr(vec![CLUSTER_CIDR_V4.into(), CLUSTER_CIDR_V6.into()]),
        ..ProxyPolicy::default()
    }
}

fn client_netns<'a>(
    tb: &'a Testbed,
    client: &Client,
) -> Result<std::sync::Arc<kproxy_testbed::Pod>, &'a kproxy_testbed::Netns> {
    match client {
        Client::External => Err(tb.external()),
        Client::Node => Err(tb.node()),
        Client::Pod(name) => tb.pod(name).ok_or(tb.node()),
    }
}

fn client_ip(tb: &Testbed, client: &Client, v6: bool) -> IpAddr {
    use kproxy_testbed::topology::{EXTERNAL_IP_V4, EXTERNAL_IP_V6};
    match (client, v6) {
        (Client::External, false) => EXTERNAL_IP_V4.into(),
        (Client::External, true) => EXTERNAL_IP_V6.into(),
        (Client::Node, false) => NODE_IP_V4.into(),
        (Client::Node, true) => NODE_IP_V6.into(),
        (Client::Pod(name), _) => match tb.pod(name) {
            Some(p) if v6 => p.ipv6().into(),
            Some(p) => p.ipv4().into(),
            None => IpAddr::from([0, 0, 0, 0]),
        },
    }
}

/// A probe expected to be dropped waits only the drop window; every other probe must be
/// answered (refused is an answer too), so its timeout is only a hang guard
/// (`kproxy_testbed::ANSWER_TIMEOUT`).
fn probe_options(expect: &Expect) -> ProbeOptions {
    match expect {
        Expect::Drop => ProbeOptions::must_drop(),
        _ => ProbeOptions::must_answer(),
    }
}

fn check(tb: &Testbed, plan: &Plan, state: &ClusterState, c: &Check, log: &mut String) -> Result<(), String> {
    let options = probe_options(&c.expect);
    let pod;
    let from = match client_netns(tb, &c.client) {
        Ok(p) => {
            pod = p;
            pod.netns()
        }
        Err(ns) => ns,
    };
    let v6 = c.dest.addr().is_ipv6();
    let node_ip: IpAddr = if v6 { NODE_IP_V6.into() } else { NODE_IP_V4.into() };
    let allowed: Vec<IpAddr> = match c.source {
        Source::Client => vec![client_ip(tb, &c.client, v6)],
        Source::NodeIp => vec![node_ip],
        Source::Masqueraded => vec![
            node_ip,
            if v6 { first_host_v6(NODE_POD_CIDR_V6).into() } else { first_host_v4(NODE_POD_CIDR_V4).into() },
        ],
        Source::Is(ip) => vec![ip],
        Source::AsDirect { pod, port } => {
            let target = tb.pod(pod).ok_or_else(|| format!("case uses undeclared pod {pod}"))?;
            let direct = SocketAddr::new(if v6 { target.ipv6().into() } else { target.ipv4().into() }, port);
            let t = probe_many(from, c.proto, direct, 1, &ProbeOptions::must_answer()).map_err(|e| e.to_string())?;
            let _ =
                writeln!(log, "  {:?} {} direct to {direct}: observed sources {:?}", c.client, c.proto, t.seen_sources);
            match t.seen_sources.keys().next() {
                Some(ip) if t.seen_sources.len() == 1 => vec![*ip],
                _ => return Err(format!("direct connection {:?} -> {direct} was not answered: {t:?}", c.client)),
            }
        }
        Source::Any => Vec::new(),
    };
    let mut tally = probe_many(from, c.proto, c.dest.addr(), c.count, &options).map_err(|e| e.to_string())?;
    let mut probes = c.count;
    // Random choice may miss a backend in `count` tries (e.g. 1 in 2,048 for two backends and 12
    // probes): while every answer so far is a wanted backend, keep probing, up to 4 more rounds,
    // until each wanted backend has answered. The check below is unchanged.
    if let Expect::Backends(want) = &c.expect {
        for _ in 0..4 {
            let seen_only_wanted = tally.backends.keys().all(|b| want.contains(&b.as_str()));
            let all_seen = want.iter().all(|w| tally.backends.contains_key(*w));
            if all_seen || !seen_only_wanted || tally.backends.values().sum::<usize>() != probes {
                break;
            }
            let more = probe_many(from, c.proto, c.dest.addr(), c.count, &options).map_err(|e| e.to_string())?;
            for (backend, n) in more.backends {
                *tally.backends.entry(backend).or_default() += n;
            }
            for (source, n) in more.seen_sources {
                *tally.seen_sources.entry(source).or_default() += n;
            }
            tally.refused += more.refused;
            tally.unreachable += more.unreachable;
            tally.timed_out += more.timed_out;
            probes += c.count;
        }
    }
    let _ = writeln!(
        log,
        "  {:?} {} {:?}: expected {:?}, source {:?} = {allowed:?}; observed backends {:?}, sources {:?} (refused {}, unreachable {}, timed out {})",
        c.client,
        c.proto,
        c.dest,
        c.expect,
        c.source,
        tally.backends,
        tally.seen_sources,
        tally.refused,
        tally.unreachable,
        tally.timed_out
    );
    let answered: usize = tally.backends.values().sum();
    let seen: BTreeSet<&str> = tally.backends.keys().map(String::as_str).collect();
    let fail = |why: &str| {
        Err(format!(
            "{why}: {:?} {} {:?}: expected {:?} / {:?}, observed {tally:?}",
            c.client, c.proto, c.dest, c.expect, c.source
        ))
    };
    match &c.expect {
        Expect::Backends(want) | Expect::Even(want) | Expect::OneOf(want) => {
            if answered != probes {
                return fail("not every probe was answered");
            }
            let want: BTreeSet<&str> = want.iter().copied().collect();
            match &c.expect {
                Expect::OneOf(_) if seen.len() != 1 || !seen.is_subset(&want) => {
                    return fail("not sticky to one backend");
                }
                Expect::OneOf(_) => {}
                _ if seen != want => return fail("wrong set of backends"),
                _ => {}
            }
            if let Expect::Even(_) = &c.expect {
                let counts: Vec<usize> = tally.backends.values().copied().collect();
                let x = chi_square_uniform(&counts);
                let critical = kproxy_testbed::chi_square_critical(counts.len().saturating_sub(1), EVEN_SPREAD_P);
                let _ = writeln!(log, "  chi-square {x:.2} (critical {critical:.2} at p = {EVEN_SPREAD_P:e})");
                if x > critical {
                    return fail("spread is not even");
                }
            }
            if !allowed.is_empty() && tally.seen_sources.keys().any(|s| !allowed.contains(s)) {
                return fail(&format!("backends saw a source outside {allowed:?}"));
            }
        }
        Expect::Reject if tally.refused != c.count => return fail("not rejected"),
        Expect::Drop if tally.timed_out != c.count => return fail("not dropped"),
        Expect::Reject | Expect::Drop => {}
    }
    let client = client_ip(tb, &c.client, v6);
    let host = crate::prediction::host(tb, state)?;
    let prediction = crate::prediction::predict(plan, &host, client, c);
    let _ = writeln!(
        log,
        "  explain: {} to {:?}, masquerade {}, source seen {:?}: {}",
        prediction.verdict,
        prediction.endpoints.iter().map(|e| e.address).collect::<Vec<_>>(),
        prediction.masquerade,
        prediction.source_seen,
        prediction.reason
    );
    crate::prediction::check(tb, c, client, &prediction, &tally, probes)
}

/// The false-alarm rate of an `Expect::Even` check. At p = 0.001 a correct dataplane failed CI
/// (χ² = 14.44 from 600 probes, 2026-12-02): with three dataplanes checked per run that is one
/// red CI in about 300. At 1e-6 with 1,200 probes (see the case) the check still catches a
/// cascade with wrong probabilities (1/3, 1/3, 1 instead of 1/3, 1/2, 1; χ² non-centrality 89):
/// simulated, it failed all of 4,000 runs, where 600 probes at 0.001 failed 99.9 %.
const EVEN_SPREAD_P: f64 = 1e-6;

fn first_host_v4(net: ipnet::Ipv4Net) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::from(u32::from(net.network()) + 1)
}

fn first_host_v6(net: ipnet::Ipv6Net) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::from(u128::from(net.network()) + 1)
}

fn ruleset(tb: &Testbed) -> Result<String, String> {
    tb.node().exec_ok("nft", &["list", "ruleset"]).map_err(|e| e.to_string())
}

/// Runs `case` against the dataplane `make` creates (called inside the node's namespace).
/// `Ok(None)` means the case was skipped (kernel feature missing on the host); `Ok(Some(log))`
/// passed with a log of expected vs observed; `Err` failed with the log.
/// `mode_policy` sets what the daemon sets for the dataplane's mode (`kproxy::policy`), before
/// the case's own policy.
pub fn run_case<D: Dataplane, F: FnOnce() -> D + Send>(
    case: &Case,
    mode_policy: fn(&mut ProxyPolicy),
    make: F,
) -> Result<Option<String>, String> {
    if !kproxy_testbed::kernel::require_root() || !kproxy_testbed::kernel::require(&case.requires) {
        return Ok(None);
    }
    let mut log = format!("case {}\n", case.name);
    let tb = Testbed::builder().pod_networking(case.networking.clone()).build().map_err(|e| e.to_string())?;
    for p in &case.pods {
        let pod = tb.add_pod(p.name, p.on).map_err(|e| e.to_string())?;
        pod.serve(&p.serves).map_err(|e| e.to_string())?;
    }
    let before = ruleset(&tb)?;
    let env = Env { testbed: &tb };
    let mut policy = default_policy();
    mode_policy(&mut policy);
    (case.policy)(&mut policy);
    let node = NodeContext {
        name: NODE_A.to_owned(),
        node_ip_override: Vec::new(),
        local_addresses: vec![NODE_IP_V4.into(), NODE_IP_V6.into()],
    };
    let mut planner = Planner::new(policy, node);
    let mut state = ClusterState::new();
    for o in node_objects().into_iter().chain((case.cluster)(&env)) {
        state.apply(Change::Applied(o));
    }
    let _ = state.take_dirty();
    let mut plan = planner.build(&state);
    let delta = PlanDelta::between(&Plan::default(), &plan);
    let mut dp = tb.node().run_in(make).map_err(|e| e.to_string())?;
    sync(&tb, &mut dp, &plan, &delta)?;

    let result = (|| -> Result<(), String> {
        for (i, step) in case.steps.iter().enumerate() {
            let _ = writeln!(log, "step {i}: {}", step_label(step));
            match step {
                Step::Probe(c) => check(&tb, &plan, &state, c, &mut log)?,
                Step::Apply(build) => {
                    for o in build(&env) {
                        state.apply(Change::Applied(o));
                    }
                    let dirty = state.take_dirty();
                    let delta = planner.update(&mut plan, &state, &dirty);
                    sync(&tb, &mut dp, &plan, &delta)?;
                }
                Step::Delete(objs) => {
                    for (kind, ns, name) in objs {
                        state.apply(Change::Deleted(*kind, kproxy_state::ObjectKey::new(*ns, *name)));
                    }
                    let dirty = state.take_dirty();
                    let delta = planner.update(&mut plan, &state, &dirty);
                    sync(&tb, &mut dp, &plan, &delta)?;
                }
                Step::Sleep(d) => std::thread::sleep(*d),
                Step::StopServing(name) => env.pod(name).stop_serving(),
                Step::Setup(setup) => setup(&env)?,
                Step::AddNodeAddress(cidr) => {
                    let net: ipnet::IpNet = cidr.parse().map_err(|e| format!("{cidr}: {e}"))?;
                    tb.add_node_interface("extra0", &[net]).map_err(|e| e.to_string())?;
                    // What the daemon's address watcher does with it.
                    let mut addresses = planner.node().local_addresses.clone();
                    addresses.push(net.addr());
                    if planner.set_local_addresses(addresses) {
                        let delta = planner.node_addresses_delta(&plan);
                        if !delta.is_empty() {
                            plan.apply(&delta);
                            sync(&tb, &mut dp, &plan, &delta)?;
                        }
                    }
                }
                Step::AffinityExpires { check: c, timeout, rounds } => {
                    let mut chosen = BTreeSet::new();
                    // Each expiry is a fresh random choice, so even a correct dataplane repeats
                    // its choice with some luck: after the `rounds` rounds, go on (up to 3 ×
                    // rounds) until another backend is chosen, instead of failing on an unlucky
                    // streak. Every round still checks that its connections stick together.
                    for round in 0..*rounds * 3 {
                        if round >= *rounds && chosen.len() >= 2 {
                            break;
                        }
                        std::thread::sleep(*timeout + Duration::from_millis(700));
                        let round = Check { count: 3, ..c.clone() };
                        check(&tb, &plan, &state, &round, &mut log)?;
                        let pod;
                        let from = match client_netns(&tb, &c.client) {
                            Ok(p) => {
                                pod = p;
                                pod.netns()
                            }
                            Err(ns) => ns,
                        };
                        let t = probe_many(from, c.proto, c.dest.addr(), 1, &probe_options(&c.expect))
                            .map_err(|e| e.to_string())?;
                        chosen.extend(t.backends.into_keys());
                    }
                    let _ = writeln!(log, "  backends chosen after expiries: {chosen:?}");
                    if chosen.len() < 2 {
                        return Err(format!("affinity never expired: always {chosen:?}"));
                    }
                }
                Step::CleanupLeavesNothing => {
                    cleanup(&tb, &mut dp)?;
                    let after = ruleset(&tb)?;
                    if after != before {
                        return Err(format!("ruleset after cleanup differs:\nbefore:\n{before}\nafter:\n{after}"));
                    }
                }
            }
        }
        Ok(())
    })();
    let _ = cleanup(&tb, &mut dp);
    match result {
        Ok(()) => Ok(Some(log)),
        Err(e) => Err(format!("{log}FAILED: {e}")),
    }
}

fn step_label(step: &Step) -> &'static str {
    match step {
        Step::Probe(_) => "probe",
        Step::Apply(_) => "apply objects and sync",
        Step::Delete(_) => "delete objects and sync",
        Step::Sleep(_) => "sleep",
        Step::StopServing(_) => "stop serving",
        Step::AddNodeAddress(_) => "add a node address",
        Step::Setup(_) => "change the testbed",
        Step::AffinityExpires { .. } => "affinity expires",
        Step::CleanupLeavesNothing => "cleanup",
    }
}
