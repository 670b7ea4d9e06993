//! The endpoint-heavy shape's own figures (`--big-service M`): one endpoint of the big Service
//! replaced at a time (`--big-changes`), then a rolling replacement of all its endpoints,
//! `--rollout-step` at a time, each step written once the last one is in the kernel and no
//! sooner than `--rollout-interval-ms` after the last write (a Deployment whose new pods take
//! that long to be ready; 0: as fast as the proxy follows).
//!
//! Every change is timed from its write (the fake server's store, or the PATCH leaving for the
//! real API server) to the commit notice after which the kernel holds it, and costed by the
//! notices of the commits in between: the elements and other objects (rules, chains, sets) they
//! added or deleted in the proxy's tables, as the kernel reported them. How the kernel is seen
//! to hold a change: kproxy's nftables mode, the new endpoints among the elements the commits
//! added to the big Service's ClusterIP in its endpoints map (the notices carry them: looking
//! them up would mean reading thousands of slots); its iptables mode, the new addresses in the
//! Service's `KUBE-SVC` chain; upstream's nftables mode, in the anonymous map its Service chain
//! picks from; its iptables mode, their `KUBE-SEP` chains.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kproxy_kube_source::fake::FakeApiServer;
use kproxy_nft_netlink::monitor::Monitor;
use kproxy_state::Kind;
use kproxy_testbed::Netns;
use serde::{Deserialize, Serialize};

use super::commit::{self, Cost};
use super::kernel::{self, KernelProbe};
use super::kproxy::Kproxy;
use super::objects::{self, BIG, BIG_SLICE, Endpoints, TARGET_PORT};
use super::real::upstream;
use super::report::{ms, pct};
use super::{DaemonArgs, Mode, Proxy};

/// A change not in the kernel after this long counts as not seen.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// One change of the big Service: when the kernel held it (ms after its write; `None`: not
/// within the give-up time) and what the commits meanwhile cost.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Change {
    pub ms: Option<f64>,
    pub cost: Cost,
    /// When the API server had answered every write of the change, ms after the first left (a
    /// real API server only): its own share of the change.
    #[serde(default)]
    pub answered_ms: Option<f64>,
}

/// The rolling replacement of every endpoint of the big Service.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rollout {
    /// Endpoints replaced per step.
    pub step: usize,
    /// The least time between the writes of two steps, ms (0: each written once the last was
    /// in the kernel).
    #[serde(default)]
    pub interval_ms: u64,
    /// Steps to replace them all.
    pub steps: usize,
    /// The steps made, in order (the last may not have been seen).
    pub done: Vec<Change>,
    /// Every step seen.
    pub finished: bool,
    /// The first write → the kernel holding the last step seen, s.
    pub total_s: f64,
    /// What the rollout was given before it was called off, s.
    pub timeout_s: u64,
    /// The proxy's CPU over the rollout (user + system, children included), s.
    pub cpu_s: f64,
    /// The proxy's RSS right after the rollout, MiB.
    pub rss_mib: f64,
}

impl Rollout {
    /// Latencies of the steps seen, ms, sorted.
    pub fn step_ms(&self) -> Vec<f64> {
        sorted(self.done.iter().filter_map(|c| c.ms))
    }

    /// Element operations per step seen, sorted.
    pub fn step_elements(&self) -> Vec<f64> {
        sorted(self.done.iter().filter(|c| c.ms.is_some()).map(|c| c.cost.elements as f64))
    }
}

/// What the big Service's changes measured for one proxy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BigResult {
    /// Endpoints of the big Service.
    pub endpoints: usize,
    /// One endpoint replaced, one change at a time.
    pub changes: Vec<Change>,
    pub rollout: Option<Rollout>,
    /// The same changes through the API server alone, timed to a bare client's watch event
    /// rather than to a kernel: no commits, CPU or RSS to report.
    #[serde(default)]
    pub api_server_alone: bool,
}

impl BigResult {
    /// Latencies of the single changes seen, ms, sorted.
    pub fn change_ms(&self) -> Vec<f64> {
        sorted(self.changes.iter().filter_map(|c| c.ms))
    }

    /// The API server's answers to the single changes' writes, ms, sorted (empty with the fake).
    pub fn answered_ms(&self) -> Vec<f64> {
        sorted(self.changes.iter().filter_map(|c| c.answered_ms))
    }

    /// Element operations per single change seen, sorted.
    pub fn change_elements(&self) -> Vec<f64> {
        sorted(self.changes.iter().filter(|c| c.ms.is_some()).map(|c| c.cost.elements as f64))
    }
}

fn sorted(v: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The big Service's endpoints as last written, and the next unused address of its pool.
/// Several proxies measured one after the other on the same objects each start from where the
/// last left them.
#[derive(Debug, Clone)]
pub struct BigState {
    /// The big Service's number (`n`, after the others).
    pub service: usize,
    endpoints: Endpoints,
    next: usize,
}

impl BigState {
    /// The big Service (number `service`) with its `m` initial endpoints.
    pub fn new(service: usize, m: usize) -> BigState {
        BigState { service, endpoints: objects::big_initial_endpoints(m), next: m }
    }

    /// Endpoints of the big Service.
    pub(super) fn endpoint_count(&self) -> usize {
        self.endpoints.len()
    }

    /// Replaces endpoints `range` with addresses the Service never had; returns the slices to
    /// write and the new addresses.
    pub(super) fn replace(&mut self, range: std::ops::Range<usize>) -> (Vec<usize>, Vec<IpAddr>) {
        let mut slices = Vec::new();
        let mut fresh = Vec::new();
        for j in range {
            let ip: IpAddr = objects::big_endpoint(self.next).into();
            self.next += 1;
            self.endpoints[j].0 = ip;
            fresh.push(ip);
            if slices.last() != Some(&(j / BIG_SLICE)) {
                slices.push(j / BIG_SLICE);
            }
        }
        (slices, fresh)
    }

    /// Slice `s` as it stands.
    pub(super) fn slice(&self, s: usize) -> Endpoints {
        let end = ((s + 1) * BIG_SLICE).min(self.endpoints.len());
        self.endpoints[s * BIG_SLICE..end].to_vec()
    }
}

/// Addresses the big Service's pool must have left for `runs` runs of its changes (each proxy's,
/// and with a real API server the API server's alone).
pub fn addresses_needed(m: usize, args: &DaemonArgs, runs: usize) -> usize {
    m + runs * (args.big_changes + if args.rollout_step > 0 { m } else { 0 })
}

/// Where the big Service's slices are written.
pub enum Writer<'a> {
    /// The fake API server: stored at once.
    Fake(&'a FakeApiServer),
    /// A real API server: a merge PATCH of the slice's endpoints, in flight while the kernel is
    /// watched (a proxy may program a change before the writer has the answer).
    Real { runtime: &'a tokio::runtime::Runtime, client: &'a kube::Client },
}

/// Writes in flight, awaited once the change was seen; each says when it was answered.
type InFlight = Vec<tokio::task::JoinHandle<anyhow::Result<Instant>>>;

impl Writer<'_> {
    fn write(&self, state: &BigState, slices: &[usize], in_flight: &mut InFlight) {
        let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
        for &s in slices {
            let endpoints = state.slice(s);
            match self {
                Writer::Fake(server) => {
                    server.apply(Kind::EndpointSlice, objects::big_slice(state.service, s, &endpoints, &trigger));
                }
                Writer::Real { runtime, client } => {
                    let (client, service) = ((*client).clone(), state.service);
                    in_flight.push(runtime.spawn(async move {
                        super::real::create::set_big_slice(&client, service, s, &endpoints).await?;
                        Ok(Instant::now())
                    }));
                }
            }
        }
    }

    /// Awaits the writes in flight; when the last was answered (`None` for the fake server).
    fn finish(&self, in_flight: &mut InFlight) -> anyhow::Result<Option<Instant>> {
        let mut last = None;
        if let Writer::Real { runtime, .. } = self {
            for write in in_flight.drain(..) {
                let answered = runtime.block_on(write)??;
                last = last.max(Some(answered));
            }
        }
        Ok(last)
    }
}

/// How the kernel is seen to hold the big Service's new endpoints, per proxy and mode.
struct Witness {
    proxy: Proxy,
    mode: Mode,
    probe: KernelProbe,
    cluster_ip: IpAddr,
    /// kproxy's nftables mode: the first bytes of the keys of the ClusterIP's slots.
    key_prefix: Vec<u8>,
    /// The new endpoints not seen yet.
    wanted: HashSet<IpAddr>,
}

impl Witness {
    fn open(proxy: Proxy, mode: Mode, service: usize) -> anyhow::Result<Witness> {
        let table = match (proxy, mode) {
            (Proxy::Kproxy, Mode::Nftables) => kernel::TABLE,
            (Proxy::Upstream, Mode::Nftables) => upstream::NFT_TABLE,
            (_, Mode::Iptables) => "nat",
        };
        let cluster_ip: IpAddr = objects::cluster_ip_v4(service).into();
        // `address . proto . port`, then the slot.
        let mut key_prefix = kernel::endpoint_key(cluster_ip, 80, 0);
        key_prefix.truncate(key_prefix.len().saturating_sub(4));
        Ok(Witness {
            proxy,
            mode,
            probe: KernelProbe::open_table(table)?,
            cluster_ip,
            key_prefix,
            wanted: HashSet::new(),
        })
    }

    /// The monitor of the proxy's tables (open it before the first write).
    fn monitor(&self) -> anyhow::Result<Monitor> {
        let monitor = commit::monitor(&commit::tables(self.mode, self.probe_table()))?;
        Ok(if (self.proxy, self.mode) == (Proxy::Kproxy, Mode::Nftables) {
            monitor.with_added_elements()
        } else {
            monitor
        })
    }

    fn probe_table(&self) -> &'static str {
        match self.proxy {
            Proxy::Kproxy => kernel::TABLE,
            Proxy::Upstream => upstream::NFT_TABLE,
        }
    }

    /// Whether every wanted endpoint is in the kernel now.
    fn seen(&mut self, monitor: &mut Monitor) -> anyhow::Result<bool> {
        let (ns, name) = BIG;
        let ip = self.cluster_ip;
        match (self.proxy, self.mode) {
            (Proxy::Kproxy, Mode::Nftables) => {
                for e in monitor.take_added() {
                    if !kernel::is_cluster_tcp_endpoints(&e.set) || !e.key.starts_with(&self.key_prefix) {
                        continue;
                    }
                    let Some(data) = e.data else { continue };
                    self.wanted.retain(|w| kernel::endpoint_data(*w, TARGET_PORT) != data);
                }
            }
            (Proxy::Kproxy, Mode::Iptables) => {
                let rules = self.probe.iptables_rules(ip, "nat", &objects::svc_chain_of(ns, name))?.unwrap_or_default();
                self.wanted.retain(|w| !kernel::mention(&rules, &kernel::ip_bytes(*w)));
            }
            (Proxy::Upstream, Mode::Nftables) => {
                let data = self.probe.rule_map_data(ip, &upstream::nft_service_chain_of(ns, name))?;
                self.wanted.retain(|w| !data.contains(&kernel::endpoint_data(*w, TARGET_PORT)));
            }
            (Proxy::Upstream, Mode::Iptables) => {
                let mut still = HashSet::new();
                for w in &self.wanted {
                    if !self.probe.chain_exists(ip, &upstream::iptables_endpoint_chain_of(ns, name, *w))? {
                        still.insert(*w);
                    }
                }
                self.wanted = still;
            }
        }
        Ok(self.wanted.is_empty())
    }
}

/// Makes one change (endpoints `range` replaced) and waits for it; also when it was written.
fn change(
    writer: &Writer,
    state: &mut BigState,
    witness: &mut Witness,
    monitor: &mut Monitor,
    range: std::ops::Range<usize>,
    timeout: Duration,
) -> anyhow::Result<(Change, Instant)> {
    let (slices, fresh) = state.replace(range);
    witness.wanted = fresh.into_iter().collect();
    // What earlier commits added is not this change's.
    let _ = monitor.take_added();
    let mut in_flight = Vec::new();
    let sent = Instant::now();
    writer.write(state, &slices, &mut in_flight);
    let (ms, cost) = commit::wait_counting(sent, timeout, monitor, |m| witness.seen(m))?;
    let answered_ms = writer.finish(&mut in_flight)?.map(|at| at.duration_since(sent).as_secs_f64() * 1000.0);
    Ok((Change { ms, cost, answered_ms }, sent))
}

/// The big Service's single changes, then its rollout, for `proxy` in `mode` (running as
/// `daemon`), from the node namespace.
#[allow(clippy::too_many_arguments)] // the run's context, each a different thing
pub fn measure(
    node: &Netns,
    writer: &Writer,
    state: &mut BigState,
    proxy: Proxy,
    mode: Mode,
    args: &DaemonArgs,
    daemon: &mut Kproxy,
) -> anyhow::Result<BigResult> {
    let m = state.endpoints.len();
    node.run_in(|| -> anyhow::Result<BigResult> {
        let mut witness = Witness::open(proxy, mode, state.service)?;
        let mut monitor = witness.monitor()?;
        let mut result = BigResult { endpoints: m, changes: Vec::new(), rollout: None, api_server_alone: false };
        // Every write of the big Service comes at least one change interval after the writes
        // before it (the other changes' too): one sooner would find the proxy's `minSyncPeriod`
        // bucket empty and time the wait for it instead of the change; and with writes exactly
        // one period apart the proxy would never catch up with that wait.
        let mut next = Instant::now() + args.change_interval();
        for k in 0..args.big_changes {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += args.change_interval();
            let j = (k * 7919 + 13) % m;
            let (c, _) = change(writer, state, &mut witness, &mut monitor, j..j + 1, CHANGE_TIMEOUT)?;
            if c.ms.is_none() {
                eprintln!("  big Service: change {k} (endpoint {j}) not seen within {CHANGE_TIMEOUT:?}");
            }
            result.changes.push(c);
            anyhow::ensure!(daemon.alive(), "the proxy exited during the big Service's changes");
        }
        if args.rollout_step == 0 {
            return Ok(result);
        }
        let step = args.rollout_step;
        let mut rollout = Rollout {
            step,
            interval_ms: args.rollout_interval_ms,
            steps: m.div_ceil(step),
            done: Vec::new(),
            finished: false,
            total_s: 0.0,
            timeout_s: args.rollout_timeout,
            cpu_s: 0.0,
            rss_mib: f64::NAN,
        };
        let deadline = Duration::from_secs(args.rollout_timeout);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        let cpu_before = daemon.cpu_seconds()?;
        let started = Instant::now();
        // The first write → the commit notice of the last step seen.
        let mut last_seen = Duration::ZERO;
        let mut next_write = started;
        for r in 0..rollout.steps {
            // A Deployment's next step comes when its new pods are ready, not the moment the
            // proxy has the last: back to back, every step would wait out the proxy's
            // `minSyncPeriod` and time that instead of the step.
            std::thread::sleep(next_write.saturating_duration_since(Instant::now()));
            next_write = Instant::now() + args.rollout_interval();
            let left = deadline.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            let range = r * step..((r + 1) * step).min(m);
            let (c, sent) = change(writer, state, &mut witness, &mut monitor, range, left)?;
            rollout.done.push(c);
            let Some(ms) = c.ms else { break };
            last_seen = (sent - started) + Duration::from_secs_f64(ms / 1000.0);
            anyhow::ensure!(daemon.alive(), "the proxy exited during the rollout");
        }
        rollout.finished = rollout.done.len() == rollout.steps && rollout.done.iter().all(|c| c.ms.is_some());
        rollout.total_s = if rollout.finished { last_seen.as_secs_f64() } else { started.elapsed().as_secs_f64() };
        rollout.cpu_s = daemon.cpu_seconds()? - cpu_before;
        rollout.rss_mib = daemon.memory_mib()?.rss;
        let seen = rollout.done.iter().filter(|c| c.ms.is_some()).count();
        eprintln!(
            "  big Service rollout: {seen} of {} steps of {step} in {:.2} s{}, {:.2} s of CPU",
            rollout.steps,
            rollout.total_s,
            if rollout.finished { "" } else { " (called off)" },
            rollout.cpu_s
        );
        result.rollout = Some(rollout);
        Ok(result)
    })?
}

/// (target, measured, met).
pub type Target = (String, String, bool);

/// The shape #38's targets are set at: 5,000 Services of 50 endpoints and one of 5,000.
pub fn is_target_shape(services: usize, layout: objects::Layout) -> bool {
    services == 5_000 && layout == (objects::Layout { endpoints: 50, big: 5_000 })
}

/// The title of #38's targets for a run at `services` laid out as `layout`: whether they count.
pub fn targets_title(services: usize, layout: objects::Layout, run: &str) -> String {
    let note = if is_target_shape(services, layout) {
        ""
    } else {
        " (set at 5,000 Services × 50 endpoints and one of 5,000: reported, not judged here)"
    };
    format!(
        "Targets of #38 at {services} Services × {} endpoints and one of {} ({run}){note}:",
        layout.endpoints, layout.big
    )
}

fn median_max(v: &[f64]) -> String {
    match v.last() {
        Some(max) => format!("{:.0} / {max:.0}", pct(v, 0.5)),
        None => "–".into(),
    }
}

fn max_objects(changes: &[Change]) -> usize {
    changes.iter().filter(|c| c.ms.is_some()).map(|c| c.cost.objects).max().unwrap_or(0)
}

/// The big Service's table: one row per proxy run, `label` naming it.
pub fn write_table(s: &mut String, rows: &[(String, &BigResult)]) -> std::fmt::Result {
    let Some((_, first)) = rows.first() else { return Ok(()) };
    writeln!(s)?;
    writeln!(
        s,
        "The big Service ({} endpoints, ClusterIP, slices of {BIG_SLICE}): one endpoint replaced at a time, then \
         every endpoint replaced, a step at a time, each step written once the last was in the kernel and no sooner \
         than the interval given after the last write (0 ms: back to back, so that each step waits out the \
         proxy's minSyncPeriod). Element \
         operations and other objects (rules, chains, sets) as the kernel's commit notices counted them, from a \
         change's write to its arrival.",
        first.endpoints
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "| proxy | one endpoint replaced: p50 / p99 (seen) | the API server's answer to its PATCH, p50 | element ops per change: median / max | other objects per change, max | rollout: steps of (written ≥ ms apart) | rollout: all endpoints in the kernel after | step p50 / p99 | element ops per step: median / max | other objects per step, max | CPU over the rollout | RSS after | notices lost |"
    )?;
    writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for (label, r) in rows {
        let changes = r.change_ms();
        let answered = match r.answered_ms() {
            a if a.is_empty() => "–".to_owned(),
            a => ms(pct(&a, 0.5)),
        };
        let lost: usize = r.changes.iter().chain(r.rollout.iter().flat_map(|o| &o.done)).map(|c| c.cost.overruns).sum();
        // The API server alone: timed to a watch, so nothing of a kernel or a proxy to count.
        let kernel = |counted: String| if r.api_server_alone { "–".to_owned() } else { counted };
        let rollout = match &r.rollout {
            None => "| – | – | – | – | – | – | – ".to_owned(),
            Some(o) => {
                let steps = o.step_ms();
                let seen = steps.len();
                let total = if o.finished {
                    format!("{:.2} s", o.total_s)
                } else {
                    format!("> {:.0} s ({seen} of {} steps)", o.total_s, o.steps)
                };
                format!(
                    "| {} × {} ({} ms) | {total} | {} / {} | {} | {} | {} | {} ",
                    o.steps,
                    o.step,
                    o.interval_ms,
                    ms(pct(&steps, 0.5)),
                    ms(pct(&steps, 0.99)),
                    kernel(median_max(&o.step_elements())),
                    kernel(max_objects(&o.done).to_string()),
                    kernel(format!("{:.2} s", o.cpu_s)),
                    kernel(format!("{:.0} MiB", o.rss_mib)),
                )
            }
        };
        writeln!(
            s,
            "| {label} | {} / {} ({} of {}) | {} | {} | {} {rollout}| {} |",
            ms(pct(&changes, 0.5)),
            ms(pct(&changes, 0.99)),
            changes.len(),
            r.changes.len(),
            answered,
            kernel(median_max(&r.change_elements())),
            kernel(max_objects(&r.changes).to_string()),
            kernel(lost.to_string()),
        )?;
    }
    Ok(())
}

/// The targets of #38 for one kproxy run (nftables mode): its start (against a real API server
/// only, `start_s`), the big Service's changes and rollout, and the rollout's CPU against
/// kube-proxy's same-mode run in the same size, if there is one.
pub fn targets(start_s: Option<Option<f64>>, k: &BigResult, upstream: Option<&BigResult>) -> Vec<Target> {
    let mut out = Vec::new();
    if let Some(start) = start_s {
        out.push((
            "start → programmed ≤ 10 s (real API server)".into(),
            start.map_or_else(|| "not within the bound".into(), |s| format!("{s:.2} s")),
            start.is_some_and(|s| s <= 10.0),
        ));
    }
    let changes = k.change_ms();
    let elements = k.change_elements();
    let all_seen = !k.changes.is_empty() && changes.len() == k.changes.len();
    let most = elements.last().copied().unwrap_or(f64::NAN);
    out.push((
        "one endpoint changed in the big Service: ≤ 4 element operations in the kernel (every change)".into(),
        format!("{most:.0} at most ({} changes)", elements.len()),
        all_seen && most <= 4.0 && k.changes.iter().all(|c| c.cost.overruns == 0),
    ));
    let p50 = pct(&changes, 0.5);
    out.push(("… write → kernel ≤ 10 ms (p50)".into(), ms(p50), all_seen && p50 <= 10.0));
    if let Some(o) = &k.rollout {
        let steps = o.step_ms();
        let p99 = pct(&steps, 0.99);
        out.push((
            format!(
                "rollout of all {} endpoints, {} at a time: each step in the kernel ≤ 20 ms (p99)",
                k.endpoints, o.step
            ),
            format!("{} ({} of {} steps, {:.2} s in all)", ms(p99), steps.len(), o.steps, o.total_s),
            o.finished && p99 <= 20.0,
        ));
        if let Some(u) = upstream.and_then(|u| u.rollout.as_ref()) {
            let ratio = u.cpu_s / o.cpu_s;
            let partial = if u.finished {
                String::new()
            } else {
                format!(
                    "; kube-proxy called off after {} of {} steps: its CPU is a lower bound",
                    u.step_ms().len(),
                    u.steps
                )
            };
            out.push((
                "the rollout costs kproxy ≤ 1/10 of kube-proxy's CPU (same run)".into(),
                format!("{:.2} s vs {:.1} s: 1/{ratio:.0}{partial}", o.cpu_s, u.cpu_s),
                o.finished && o.cpu_s * 10.0 <= u.cpu_s,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(ms: f64, elements: usize) -> Change {
        Change {
            ms: Some(ms),
            cost: Cost { commits: 1, elements, objects: 0, overruns: 0 },
            answered_ms: Some(ms / 2.0),
        }
    }

    fn result(change_elements: usize, step_ms: f64, cpu_s: f64, finished: bool) -> BigResult {
        let done: Vec<Change> = (0..if finished { 200 } else { 40 }).map(|_| change(step_ms, 50)).collect();
        BigResult {
            endpoints: 5000,
            changes: (0..20).map(|_| change(5.0, change_elements)).collect(),
            api_server_alone: false,
            rollout: Some(Rollout {
                step: 25,
                interval_ms: 1000,
                steps: 200,
                done,
                finished,
                total_s: if finished { 1.5 } else { 900.2 },
                timeout_s: 900,
                cpu_s,
                rss_mib: 200.0,
            }),
        }
    }

    #[test]
    fn the_targets_judge_element_operations_step_latency_and_cpu_against_a_called_off_upstream() {
        let kproxy = result(2, 6.0, 0.8, true);
        let upstream = result(10_001, 15_000.0, 300.0, false);
        let t = targets(Some(Some(8.0)), &kproxy, Some(&upstream));
        assert!(t.iter().all(|(_, _, ok)| *ok), "{t:#?}");
        assert!(t.last().is_some_and(|(_, m, _)| m.contains("lower bound")), "{t:#?}");
        // Five element operations for one change misses; so does a slow step, or a rollout
        // that was called off.
        assert!(!targets(None, &result(5, 6.0, 0.8, true), None)[0].2);
        assert!(targets(None, &result(2, 25.0, 0.8, true), None).iter().any(|(_, _, ok)| !ok));
        assert!(targets(None, &result(2, 6.0, 0.8, false), None).iter().any(|(_, _, ok)| !ok));

        let mut text = String::new();
        write_table(&mut text, &[("kproxy".into(), &kproxy), ("kube-proxy".into(), &upstream)]).unwrap();
        assert!(
            text.contains(
                "| kproxy | 5.00 ms / 5.00 ms (20 of 20) | 2.50 ms | 2 / 2 | 0 | 200 × 25 (1000 ms) | 1.50 s |"
            ),
            "{text}"
        );
        assert!(text.contains("> 900 s (40 of 200 steps)"), "{text}");

        // The API server alone has no kernel: its counts are not zeros but absent.
        let alone = BigResult { api_server_alone: true, ..result(0, 4.0, 0.0, true) };
        let mut text = String::new();
        write_table(&mut text, &[("the API server alone".into(), &alone)]).unwrap();
        assert!(
            text.contains(
                "| the API server alone | 5.00 ms / 5.00 ms (20 of 20) | 2.50 ms | – | – | 200 × 25 (1000 ms) | 1.50 s | 4.00 ms / 4.00 ms | – | – | – | – | – |"
            ),
            "{text}"
        );
    }
}
