//! What each node's kernel holds, watched by one thread per node inside the node's namespace
//! (its netlink sockets belong there), told what to look for over a channel. The benchmark's
//! only witness of what a proxy programmed, as in `kproxy-bench daemon`: never a proxy's log
//! or metrics.
//!
//! - **First sync**: polled (a proxy that is not yet synced is looked at every `poll`, a few
//!   point lookups: its hooked chains and up to [`SAMPLES`] sampled ClusterIPs), then one dump
//!   of the maps to confirm every ClusterIP; its time is that of the look that found it, so the
//!   resolution is `poll`. Not by commit notices: subscribing makes the kernel build a
//!   notification for every object of a first sync, a cost kube-proxy does not otherwise pay.
//! - **A change**: by commit notices (`daemon::commit`, `nft monitor`'s), subscribed once the
//!   proxy is synced; each thread looks after each notice and answers the time of the notice of
//!   the commit that made the change true. Before the PATCH leaves, every thread has looked once
//!   (the change is not there) and said so, so a time is always a notice's, never a late look's.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_nft_netlink::monitor::Monitor;
use kproxy_testbed::{Netns, NsThread};

use crate::daemon::kernel::{self, KernelProbe, MapKey};
use crate::daemon::objects::{self, Layout, TARGET_PORT};
use crate::daemon::real::upstream::{self, NFT_TABLE};
use crate::daemon::{Mode, Proxy, commit};

/// ClusterIPs looked up per poll of a proxy not yet synced (the last Service's among them).
const SAMPLES: usize = 8;
/// How long a wait for a change goes without a commit notice before it looks anyway.
const MISSED_NOTICE: Duration = Duration::from_millis(250);
/// Slots looked at for a changed endpoint (a Service has at most 6 endpoints during a change).
const SLOTS: u32 = 8;

/// What every proxy's first sync must have programmed: `(ClusterIP, map key)` of every
/// Service, in kproxy's endpoints maps and in upstream's `service-ips` maps.
pub struct Expected {
    kproxy: Vec<MapKey>,
    upstream: Vec<MapKey>,
}

impl Expected {
    pub fn of(services: usize) -> Arc<Expected> {
        Arc::new(Expected {
            kproxy: crate::daemon::first_sync::expected_keys(services, Layout::default()),
            upstream: crate::daemon::real::observe::expected(services, Layout::default()),
        })
    }

    fn of_proxy(&self, proxy: Proxy) -> &[MapKey] {
        match proxy {
            Proxy::Kproxy => &self.kproxy,
            Proxy::Upstream => &self.upstream,
        }
    }
}

/// A change to look for: Service `service`'s endpoint `fresh`.
#[derive(Debug, Clone, Copy)]
pub struct Change {
    pub service: usize,
    pub fresh: IpAddr,
}

enum Ask {
    FirstSync {
        proxy: Proxy,
        deadline: Instant,
        poll: Duration,
    },
    Subscribe {
        proxy: Proxy,
    },
    Change {
        proxy: Proxy,
        change: Change,
        deadline: Instant,
    },
    /// Drops the subscription (between two fleets).
    Unsubscribe,
}

enum Answer {
    /// When the first sync was found complete (`None`: not by the deadline).
    Synced(Option<Instant>),
    Subscribed,
    /// Looked once: the change is not there yet; now waiting for notices.
    Armed,
    /// The notice of the commit that made the change true (`None`: not by the deadline).
    Changed(Option<Instant>),
    Done,
}

/// Asked while waiting: an error ends the wait.
pub type Alive<'a> = &'a mut dyn FnMut() -> anyhow::Result<()>;

/// One thread per node.
pub struct Observers {
    asks: Vec<Sender<Ask>>,
    answers: Receiver<(usize, anyhow::Result<Answer>)>,
    threads: Vec<NsThread<()>>,
}

impl Observers {
    pub fn start(nodes: &[Netns], expected: Arc<Expected>) -> anyhow::Result<Observers> {
        let (answer, answers) = channel();
        let mut asks = Vec::new();
        let mut threads = Vec::new();
        for (k, node) in nodes.iter().enumerate() {
            let (ask, asked) = channel();
            let answer = answer.clone();
            let expected = expected.clone();
            let thread = node.spawn_in(&format!("observe-{k}"), move || observe(k, &expected, asked, answer))?;
            asks.push(ask);
            threads.push(thread);
        }
        Ok(Observers { asks, answers, threads })
    }

    /// Asks the first `count` observers and collects one answer from each, by node.
    fn ask_all(
        &self,
        count: usize,
        ask: impl Fn() -> Ask,
        timeout: Duration,
        alive: Alive,
    ) -> anyhow::Result<Vec<Answer>> {
        for sender in &self.asks[..count] {
            sender.send(ask()).map_err(|_| anyhow::anyhow!("an observer thread has ended"))?;
        }
        self.collect(count, timeout, alive)
    }

    /// One answer from each of the first `count` observers, by node; `alive` is asked every
    /// second meanwhile (an error from it, say a proxy that exited, ends the wait).
    fn collect(&self, count: usize, timeout: Duration, alive: Alive) -> anyhow::Result<Vec<Answer>> {
        let mut answers: Vec<Option<Answer>> = (0..count).map(|_| None).collect();
        let deadline = Instant::now() + timeout;
        let mut missing = count;
        while missing > 0 {
            let wait = deadline.saturating_duration_since(Instant::now());
            anyhow::ensure!(!wait.is_zero(), "{missing} observers did not answer within {timeout:?}");
            match self.answers.recv_timeout(wait.min(Duration::from_secs(1))) {
                Ok((k, answer)) => {
                    answers[k] = Some(answer.with_context(|| format!("observing node {k}"))?);
                    missing -= 1;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => alive()?,
                Err(e) => return Err(e).context("the observers have ended"),
            }
        }
        answers.into_iter().map(|a| a.context("an observer answered twice")).collect()
    }

    /// Waits until each of the first `count` nodes has `proxy`'s first sync (or `deadline`);
    /// when each was seen.
    pub fn first_sync(
        &self,
        count: usize,
        proxy: Proxy,
        deadline: Instant,
        poll: Duration,
        alive: Alive,
    ) -> anyhow::Result<Vec<Option<Instant>>> {
        let answers = self.ask_all(
            count,
            || Ask::FirstSync { proxy, deadline, poll },
            deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(30),
            alive,
        )?;
        answers
            .into_iter()
            .map(|a| match a {
                Answer::Synced(at) => Ok(at),
                _ => anyhow::bail!("an observer answered out of turn"),
            })
            .collect()
    }

    /// Subscribes the first `count` observers to commit notices of `proxy`'s tables.
    pub fn subscribe(&self, count: usize, proxy: Proxy) -> anyhow::Result<()> {
        self.ask_all(count, || Ask::Subscribe { proxy }, Duration::from_secs(60), &mut || Ok(())).map(drop)
    }

    pub fn unsubscribe(&self, count: usize) -> anyhow::Result<()> {
        self.ask_all(count, || Ask::Unsubscribe, Duration::from_secs(60), &mut || Ok(())).map(drop)
    }

    /// Arms the first `count` observers for `change`, runs `make` (the PATCH) once every one has
    /// looked and not found it, and returns when each node's kernel showed it (`None`: not
    /// within `timeout`), and the instant `make` was called.
    pub fn change(
        &self,
        count: usize,
        proxy: Proxy,
        change: Change,
        timeout: Duration,
        make: impl FnOnce() -> anyhow::Result<Instant>,
        alive: Alive,
    ) -> anyhow::Result<(Instant, Vec<Option<Instant>>)> {
        let deadline = Instant::now() + timeout;
        for answer in self.ask_all(count, || Ask::Change { proxy, change, deadline }, timeout, alive)? {
            anyhow::ensure!(matches!(answer, Answer::Armed), "an observer answered out of turn");
        }
        let sent = make()?;
        let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(30);
        let seen = self.collect(count, wait, alive)?;
        let seen = seen
            .into_iter()
            .map(|a| match a {
                Answer::Changed(at) => Ok(at),
                _ => anyhow::bail!("an observer answered out of turn"),
            })
            .collect::<anyhow::Result<_>>()?;
        Ok((sent, seen))
    }
}

impl Drop for Observers {
    fn drop(&mut self) {
        // Closing the channels ends every thread's loop.
        self.asks.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// One node's thread: answers asks until the channel closes.
fn observe(k: usize, expected: &Expected, asks: Receiver<Ask>, answers: Sender<(usize, anyhow::Result<Answer>)>) {
    let mut probes = match (KernelProbe::open(), KernelProbe::open_table(NFT_TABLE)) {
        (Ok(kproxy), Ok(upstream)) => Probes { kproxy, upstream, monitor: None },
        (Err(e), _) | (_, Err(e)) => {
            let _ = answers.send((k, Err(anyhow::Error::from(e).context("opening netlink sockets"))));
            return;
        }
    };
    for ask in asks {
        let answer = match ask {
            Ask::FirstSync { proxy, deadline, poll } => {
                probes.first_sync(expected.of_proxy(proxy), proxy, deadline, poll).map(Answer::Synced)
            }
            Ask::Subscribe { proxy } => {
                let table = match proxy {
                    Proxy::Kproxy => kernel::TABLE,
                    Proxy::Upstream => NFT_TABLE,
                };
                Monitor::open(&commit::tables(Mode::Nftables, table))
                    .and_then(|m| m.with_timeout(MISSED_NOTICE))
                    .map(|m| {
                        probes.monitor = Some(m);
                        Answer::Subscribed
                    })
                    .context("subscribing to nf_tables notices")
            }
            Ask::Unsubscribe => {
                probes.monitor = None;
                Ok(Answer::Done)
            }
            Ask::Change { proxy, change, deadline } => match probes.seen(proxy, change) {
                Ok(true) => Err(anyhow::anyhow!("change {change:?} is in the kernel before it was made")),
                Err(e) => Err(e),
                Ok(false) => {
                    if answers.send((k, Ok(Answer::Armed))).is_err() {
                        return;
                    }
                    probes.wait_change(proxy, change, deadline).map(Answer::Changed)
                }
            },
        };
        if answers.send((k, answer)).is_err() {
            return;
        }
    }
}

struct Probes {
    kproxy: KernelProbe,
    upstream: KernelProbe,
    monitor: Option<Monitor>,
}

impl Probes {
    /// Polls until `proxy`'s first sync is complete.
    fn first_sync(
        &mut self,
        expected: &[MapKey],
        proxy: Proxy,
        deadline: Instant,
        poll: Duration,
    ) -> anyhow::Result<Option<Instant>> {
        let step = (expected.len() / SAMPLES).max(1);
        let mut samples: Vec<&MapKey> = expected.iter().step_by(step).collect();
        samples.extend(expected.last());
        samples.extend(expected.iter().rfind(|k| k.ip.is_ipv6()));
        while Instant::now() < deadline {
            let looked = Instant::now();
            if self.sampled(proxy, &samples)? && self.probe(proxy).has_all_keys(expected)? {
                return Ok(Some(looked));
            }
            std::thread::sleep(poll.saturating_sub(looked.elapsed()));
        }
        Ok(None)
    }

    fn probe(&mut self, proxy: Proxy) -> &mut KernelProbe {
        match proxy {
            Proxy::Kproxy => &mut self.kproxy,
            Proxy::Upstream => &mut self.upstream,
        }
    }

    fn sampled(&mut self, proxy: Proxy, samples: &[&MapKey]) -> anyhow::Result<bool> {
        if proxy == Proxy::Kproxy {
            let v4: IpAddr = objects::cluster_ip_v4(0).into();
            let v6: IpAddr = objects::cluster_ip_v6(0).into();
            let probe = &mut self.kproxy;
            if !(probe.chain_exists(v4, kernel::HOOKED_CHAIN)? && probe.chain_exists(v6, kernel::HOOKED_CHAIN)?) {
                return Ok(false);
            }
        }
        let probe = self.probe(proxy);
        for k in samples {
            if !probe.has_key(k)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether the kernel shows `change` in `proxy`'s rules.
    fn seen(&mut self, proxy: Proxy, change: Change) -> anyhow::Result<bool> {
        let i = change.service;
        let ip: IpAddr = objects::cluster_ip_v4(i).into();
        let want = kernel::endpoint_data(change.fresh, TARGET_PORT);
        Ok(match proxy {
            Proxy::Kproxy => self.kproxy.endpoint_in_slots(ip, objects::service_port(i), SLOTS, &want)?,
            Proxy::Upstream => self.upstream.rule_map_holds(ip, &upstream::nft_service_chain(i), &want)?,
        })
    }

    /// Waits for commit notices until one's look finds `change` (a look also every
    /// [`MISSED_NOTICE`] without one, should a notice be lost); the instant of that notice.
    /// Never looks before a notice: the thread may run late, after the PATCH and the commit,
    /// and a look then would be timed as if the change had been there before it was made.
    fn wait_change(&mut self, proxy: Proxy, change: Change, deadline: Instant) -> anyhow::Result<Option<Instant>> {
        let Some(mut monitor) = self.monitor.take() else { anyhow::bail!("a change asked for before subscribing") };
        let result = loop {
            if Instant::now() >= deadline {
                break Ok(None);
            }
            match monitor.wait() {
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => break Err(e.into()),
            }
            let noticed = Instant::now();
            match self.seen(proxy, change) {
                Ok(true) => break Ok(Some(noticed)),
                Ok(false) => {}
                Err(e) => break Err(e),
            }
        };
        self.monitor = Some(monitor);
        result
    }
}
