//! Changes made at the API server (by the faults and soak benchmarks), and the check that the
//! kernel shows them all. Services are split by index so that what changes never meets what is watched for
//! staying put: endpoint changes go to Services `i ≡ 1 (mod 4)`, deletions to `i ≡ 2`, new
//! Services get indexes from `n` up, and the untouched sample is `i ≡ 0` (affinity Services,
//! whose endpoints are rules rather than map elements, are all `≡ 3`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kproxy_kube_source::fake::FakeApiServer;
use kproxy_state::Kind;
use kproxy_testbed::Netns;

use crate::daemon::api::NODE_NAME;
use crate::daemon::kernel::{self, KernelProbe, MapKey};
use crate::daemon::objects::{self, DEFAULT_ENDPOINTS, Shape, TARGET_PORT};

/// Slots looked at for a changed endpoint (a Service has 5).
const SLOTS: u32 = 8;
/// How often the kernel is polled while waiting for convergence.
const POLL: Duration = Duration::from_millis(5);

/// What the kernel must show once the changes are programmed.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Service `i` has this endpoint in one of its slots.
    Endpoint(usize, IpAddr),
    /// Service `i` exists.
    Created(usize),
    /// Service `i` is gone.
    Deleted(usize),
}

/// The changes made so far, and those the kernel has not been seen to show.
pub struct Churn {
    n: usize,
    web_pod: IpAddr,
    made: usize,
    endpoints: HashMap<usize, objects::Endpoints>,
    next_change: usize,
    next_created: usize,
    next_deleted: usize,
    pending: Vec<Expect>,
}

impl Churn {
    pub fn new(n: usize, web_pod: IpAddr) -> Churn {
        Churn {
            n,
            web_pod,
            made: 0,
            endpoints: HashMap::new(),
            next_change: 0,
            next_created: n,
            next_deleted: n - 1,
            pending: Vec::new(),
        }
    }

    /// Changes made in all.
    pub fn made(&self) -> usize {
        self.made
    }

    /// `count` changes: one new Service, one deleted, the rest endpoint replacements.
    pub fn apply(&mut self, server: &FakeApiServer, count: usize) {
        let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
        let web = (self.web_pod, NODE_NAME);

        // Not an affinity Service (its endpoints are rules, not map elements), nor one with a
        // health-check node port (deletions never remove one, so listeners would only grow).
        let plain = |i: &usize| !Shape::of(*i).affinity && !Shape::of(*i).etp_local;
        let i = (self.next_created..).find(plain).unwrap_or(self.next_created);
        self.next_created = i + 1;
        server.apply(Kind::Service, objects::service(i));
        server.apply(
            Kind::EndpointSlice,
            objects::slice(i, false, &objects::initial_endpoints(i, false, web, DEFAULT_ENDPOINTS), &trigger),
        );
        self.pending.push(Expect::Created(i));

        let i = (0..=self.next_deleted).rev().find(|i| i % 4 == 2).unwrap_or(2);
        self.next_deleted = i.saturating_sub(1);
        let (namespace, name) = objects::name(i);
        server.delete(Kind::EndpointSlice, &namespace, &objects::slice_name(i, false));
        if Shape::of(i).dual_stack {
            server.delete(Kind::EndpointSlice, &namespace, &objects::slice_name(i, true));
        }
        server.delete(Kind::Service, &namespace, &name);
        self.pending.push(Expect::Deleted(i));

        for _ in 2..count {
            let k = self.next_change;
            self.next_change += 1;
            // Spread over the cluster: the k-th Service ≡ 1 (mod 4), wrapping.
            let i = 1 + 4 * ((k * 7919) % (self.n / 4));
            let eps =
                self.endpoints.entry(i).or_insert_with(|| objects::initial_endpoints(i, false, web, DEFAULT_ENDPOINTS));
            let fresh: IpAddr = objects::fresh_endpoint(k).into();
            let j = k % eps.len();
            eps[j].0 = fresh;
            server.apply(Kind::EndpointSlice, objects::slice(i, false, eps, &trigger));
            // A later change to the same slot supersedes this one.
            self.pending
                .retain(|e| !matches!(e, Expect::Endpoint(s, ip) if *s == i && !eps.iter().any(|(a, _)| a == ip)));
            self.pending.push(Expect::Endpoint(i, fresh));
        }
        self.made += count;
    }

    /// Waits until the kernel shows every pending change and holds the endpoint map keys
    /// `present` (e.g. of unchanged Services, after someone damaged the table); the time since
    /// `since`, ms, or `None` after `timeout`.
    pub fn wait_converged(
        &mut self,
        node: &Netns,
        since: Instant,
        timeout: Duration,
        present: &[MapKey],
    ) -> anyhow::Result<Option<f64>> {
        let pending = std::mem::take(&mut self.pending);
        node.run_in(move || -> anyhow::Result<Option<f64>> {
            let mut probe = KernelProbe::open()?;
            let mut left = pending;
            while since.elapsed() < timeout {
                let mut still = Vec::new();
                for expect in left {
                    if !shown(&mut probe, expect)? {
                        still.push(expect);
                    }
                }
                left = still;
                let mut all_present = true;
                for k in present {
                    if probe.key_data(k)?.is_none() {
                        all_present = false;
                        break;
                    }
                }
                if left.is_empty() && all_present {
                    return Ok(Some(since.elapsed().as_secs_f64() * 1000.0));
                }
                std::thread::sleep(POLL);
            }
            Ok(None)
        })?
    }

    /// Slot-0 keys of up to `count` Services no change touches, spread over the cluster.
    pub fn untouched_keys(&self, n: usize, count: usize) -> Vec<MapKey> {
        let untouched: Vec<usize> = (0..n).filter(|i| i % 4 == 0).collect();
        let step = (untouched.len() / count).max(1);
        untouched
            .into_iter()
            .step_by(step)
            .map(|i| first_slot(i, objects::initial_endpoint_count(i, DEFAULT_ENDPOINTS)))
            .collect()
    }
}

/// Slot 0 of Service `i`'s ClusterIP, when it has `endpoints` endpoints.
fn first_slot(i: usize, endpoints: usize) -> MapKey {
    MapKey::endpoint(objects::cluster_ip_v4(i).into(), objects::service_port(i), 0, endpoints)
}

fn shown(probe: &mut KernelProbe, expect: Expect) -> anyhow::Result<bool> {
    Ok(match expect {
        Expect::Endpoint(i, ip) => {
            let want = kernel::endpoint_data(ip, TARGET_PORT);
            probe.endpoint_in_slots(objects::cluster_ip_v4(i).into(), objects::service_port(i), SLOTS, &want)?
        }
        Expect::Created(i) | Expect::Deleted(i) => {
            let present = probe.key_data(&first_slot(i, DEFAULT_ENDPOINTS))?.is_some();
            present == matches!(expect, Expect::Created(_))
        }
    })
}
