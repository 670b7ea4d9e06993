//! Taking the node over from kube-proxy, and handing it back: when the daemon does it, and which
//! of kproxy's rules go when it hands back. What kube-proxy left, and removing it, is
//! `kproxy_takeover`'s.
//!
//! **How kproxy knows whether kube-proxy runs on the node.** kube-proxy and kproxy serve
//! `/healthz` and `/metrics` on the same ports (10256 and 10249 by default; a drop-in uses the
//! same ConfigMap). Whoever holds them is the node's proxy: kproxy takes over only once it holds
//! every listener it is configured with ([`Listeners`], retried every [`BIND_RETRY`] while the
//! port is taken, with one clear message instead of a crash loop), and never before its own
//! rules are in the kernel. kube-proxy, for its part, keeps retrying a taken port every 5 s
//! (upstream's `serveHealthz`/`serveMetrics` without `bindAddressHardFail`) while it programs its
//! rules. With no listener configured kproxy cannot tell, and leaves kube-proxy's rules alone.
//!
//! **Taking over** ([`take_over`]): after kproxy's first sync reached the kernel and it holds its
//! listeners, kube-proxy's leftovers are removed and logged. Its IPVS virtual services go as
//! their connections end (looked at every [`DRAIN_CHECK`]).
//!
//! **Handing back** ([`hand_back`]): on SIGTERM, if kube-proxy's rules are in the kernel again
//! (a kube-proxy was started on the node while kproxy ran: `docs/migration.md`), kproxy stops
//! syncing, lets go of its ports so that kube-proxy can take them, waits (at most
//! [`HANDBACK_WAIT`]) until kube-proxy answers `/healthz` there and, where kproxy has a metrics
//! address, until kube-proxy's `/metrics` there reports a finished sync
//! (`kubeproxy_sync_proxy_rules_last_timestamp_seconds` above 0: upstream's `/healthz` answers
//! 200 from the moment it starts, before its first sync), then removes its own rules —
//! only those kube-proxy's running mode does not share ([`handback_removals`]) — and exits. So
//! the node is never without rules, and kproxy's stale rules never stay in front of
//! kube-proxy's. Without kube-proxy's rules (a restart, an upgrade) kproxy exits as always,
//! its rules in place.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kproxy_iptables::Backend;
use kproxy_iptables::cleanup::{is_kproxy_chain, is_kube_proxy_ipvs_chain};
use kproxy_servers::{ProxyHealth, RunningServer, ServeError};
use kproxy_takeover::{Leftovers, Own};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{error, info, warn};

/// How often a listener whose port is taken is tried again.
pub const BIND_RETRY: Duration = Duration::from_secs(2);

/// How often kube-proxy's IPVS services are looked at while they drain.
pub const DRAIN_CHECK: Duration = Duration::from_secs(5);

/// How long a handback waits for kube-proxy to answer `/healthz` on the port kproxy let go of
/// (kube-proxy tries a taken port every 5 s). Within the DaemonSet's 30 s grace period.
pub const HANDBACK_WAIT: Duration = Duration::from_secs(20);

/// A failed removal is tried again this much later, at most [`REMOVAL_ATTEMPTS`] times.
const REMOVAL_RETRY: Duration = Duration::from_secs(30);
const REMOVAL_ATTEMPTS: usize = 5;

/// Starts one listener (the healthz or the metrics server) on its address.
pub type Serve = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<RunningServer, ServeError>> + Send>> + Send + Sync>;

/// One listener kproxy is configured with.
pub struct ListenerSpec {
    /// `healthz server`, `metrics server`.
    pub what: &'static str,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Binds and serves it.
    pub serve: Serve,
}

/// kproxy's healthz and metrics listeners, which double as the node's proxy lease.
pub struct Listeners {
    servers: Arc<tokio::sync::Mutex<Vec<RunningServer>>>,
    held: watch::Receiver<bool>,
    binder: Option<tokio::task::JoinHandle<()>>,
    configured: bool,
}

impl std::fmt::Debug for Listeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listeners").field("held", &*self.held.borrow()).finish()
    }
}

fn is_taken(e: &ServeError) -> bool {
    matches!(e, ServeError::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse)
}

impl Listeners {
    /// Binds every listener of `specs`. With `hard_fail` (`bindAddressHardFail`) any failure is
    /// an error, as upstream; otherwise a taken port is tried again every [`BIND_RETRY`] until
    /// it is free, and any other failure leaves that listener off, with a warning.
    pub async fn start(specs: Vec<ListenerSpec>, hard_fail: bool) -> anyhow::Result<Listeners> {
        let configured = !specs.is_empty();
        let servers = Arc::new(tokio::sync::Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for spec in specs {
            match (spec.serve)().await {
                Ok(server) => servers.lock().await.push(server),
                Err(e) if hard_fail => anyhow::bail!("{}: {e}", spec.what),
                Err(e) if is_taken(&e) => {
                    warn!(
                        address = %spec.addr,
                        "the {} port is taken: another Service proxy (kube-proxy?) still runs on this node. kproxy \
                         programs its own rules meanwhile and leaves the other proxy's alone; it takes the port, and \
                         removes kube-proxy's leftover rules, once the port is free (tried every {}s)",
                        spec.what,
                        BIND_RETRY.as_secs()
                    );
                    waiting.push(spec);
                }
                Err(e) => warn!("{}: {e}", spec.what),
            }
        }
        let (tx, held) = watch::channel(configured && waiting.is_empty());
        let binder = (!waiting.is_empty()).then(|| {
            let servers = servers.clone();
            tokio::spawn(async move {
                while !waiting.is_empty() {
                    tokio::time::sleep(BIND_RETRY).await;
                    let mut still = Vec::new();
                    for spec in waiting {
                        match (spec.serve)().await {
                            Ok(server) => {
                                info!(address = %spec.addr, "the {} port is free now: serving it", spec.what);
                                servers.lock().await.push(server);
                            }
                            Err(e) if is_taken(&e) => still.push(spec),
                            Err(e) => warn!("{}: {e}; not retried", spec.what),
                        }
                    }
                    waiting = still;
                }
                let _ = tx.send(true);
            })
        });
        Ok(Listeners { servers, held, binder, configured })
    }

    /// Whether kproxy holds every listener it is configured with (`false` with none).
    pub fn held(&self) -> watch::Receiver<bool> {
        self.held.clone()
    }

    /// Whether any listener is configured (without one kproxy cannot tell whether kube-proxy runs).
    pub fn configured(&self) -> bool {
        self.configured
    }

    /// Stops trying to bind, and closes every listener (and its connections) now.
    pub async fn release(&mut self) {
        if let Some(binder) = self.binder.take() {
            binder.abort();
        }
        let servers: Vec<_> = std::mem::take(&mut *self.servers.lock().await);
        for server in servers {
            let addr = server.local_addr();
            if let Err(e) = server.shutdown().await {
                warn!(%addr, error = %e, "closing a listener");
            }
        }
    }
}

/// Removes kube-proxy's leftovers once kproxy's first sync reached the kernel (`health` says so)
/// and kproxy holds its listeners; repeats while kube-proxy's IPVS services drain. Sets
/// `took_over` once something of kube-proxy's was removed.
pub async fn take_over(
    own: Own,
    ipvs: kproxy_ipvs::Config,
    health: Arc<ProxyHealth>,
    listeners_configured: bool,
    mut held: watch::Receiver<bool>,
    took_over: Arc<AtomicBool>,
) {
    if !listeners_configured {
        warn!(
            "no healthz or metrics listener is configured: kproxy cannot tell whether kube-proxy runs on this node, \
             so it leaves kube-proxy's rules alone (docs/migration.md)"
        );
        return;
    }
    while health.status().last_updated.is_none() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if held.wait_for(|h| *h).await.is_err() {
        return;
    }
    let mut failures = 0;
    loop {
        let ipvs_config = ipvs.clone();
        let pass = tokio::task::spawn_blocking(move || {
            let found = kproxy_takeover::find(own, &ipvs_config)?;
            let removal = kproxy_takeover::remove(own, &ipvs_config, &found);
            Ok::<_, kproxy_takeover::Error>((found, removal))
        })
        .await;
        let (found, removal) = match pass {
            Ok(Ok(pass)) => pass,
            Ok(Err(e)) => {
                warn!(error = %e, "looking for kube-proxy's leftovers failed");
                (Leftovers::default(), kproxy_takeover::Removal { failed: vec![e.to_string()], ..Default::default() })
            }
            Err(e) => {
                error!(error = %e, "the takeover task failed");
                return;
            }
        };
        if found.is_empty() && removal.failed.is_empty() {
            if !took_over.load(Ordering::Relaxed) {
                info!("kube-proxy left nothing on this node");
            }
            return;
        }
        if !removal.removed.is_empty() {
            took_over.store(true, Ordering::Relaxed);
            info!(removed = ?removal.removed, "took the node over from kube-proxy: removed {found}");
        }
        if removal.is_complete() {
            return;
        }
        if !removal.failed.is_empty() {
            failures += 1;
            if failures >= REMOVAL_ATTEMPTS {
                error!(
                    failed = ?removal.failed,
                    "could not remove kube-proxy's leftovers after {REMOVAL_ATTEMPTS} attempts; \
                     `kube-proxy --cleanup` on the node removes them"
                );
                return;
            }
            warn!(failed = ?removal.failed, "some of kube-proxy's leftovers could not be removed; trying again later");
            tokio::time::sleep(REMOVAL_RETRY).await;
            continue;
        }
        let connections: u64 = removal.draining.iter().map(|(_, n)| n).sum();
        info!(
            services = removal.draining.len(),
            connections, "kube-proxy's IPVS services still carry connections: each goes once its connections end"
        );
        tokio::time::sleep(DRAIN_CHECK).await;
    }
}

/// One part of kproxy's own rules, as `kproxy --cleanup` removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnRules {
    /// `ip kproxy`, `ip6 kproxy`.
    NftablesTables,
    /// The acceleration table (`inet kproxy-accel`).
    AccelerationTable,
    /// Every chain of kproxy's iptables mode in this backend.
    IptablesChains(Backend),
    /// kproxy's iptables chains in this backend except those kube-proxy's IPVS mode also writes.
    IptablesChainsNotIpvs(Backend),
    /// kproxy's IPVS services, `kube-ipvs0` and the auxiliary table.
    Ipvs,
    /// Only what kproxy's IPVS mode alone has: firewall-mark services, the auxiliary table.
    IpvsKproxyOnly,
}

/// Which of kproxy's rules go when it hands the node back to a kube-proxy that left `found`:
/// everything of kproxy's except what kube-proxy's running mode shares (iptables chains of the
/// same names in the same backend; IPVS address services and `kube-ipvs0`).
pub fn handback_removals(own: Own, found: &Leftovers) -> Vec<OwnRules> {
    let mut out = vec![OwnRules::AccelerationTable];
    // kube-proxy in IPVS mode: its ip sets, its virtual services, or its own chains.
    let ipvs_mode = !found.ipsets.is_empty() || found.ipvs.is_some();
    match own {
        Own::Nftables => out.push(OwnRules::NftablesTables),
        Own::Iptables(backend) => {
            let in_my_backend = found.iptables.iter().any(|i| i.backend == backend);
            if !in_my_backend && !ipvs_mode {
                out.push(OwnRules::IptablesChains(backend));
            } else if ipvs_mode {
                out.push(OwnRules::IptablesChainsNotIpvs(backend));
            }
            // kube-proxy in iptables mode on kproxy's backend shares every chain: nothing goes.
        }
        Own::Ipvs => out.push(if ipvs_mode { OwnRules::IpvsKproxyOnly } else { OwnRules::Ipvs }),
    }
    out
}

/// Removes `parts` of kproxy's rules (in the calling thread's network namespace); returns what
/// could not be removed.
pub fn remove_own(parts: &[OwnRules], ipvs: &kproxy_ipvs::Config) -> Vec<String> {
    use kproxy_iptables::IptablesRestore;
    let mut failed = Vec::new();
    let families = crate::families::for_iptables_cleanup();
    for part in parts {
        let result = match part {
            OwnRules::NftablesTables => {
                kproxy_nftables::cleanup(&mut kproxy_nft_netlink::NetlinkExecutor::new()).map_err(|e| e.to_string())
            }
            OwnRules::AccelerationTable => {
                kproxy_accel::cleanup(&mut kproxy_accel::NetlinkExecutor::new()).map_err(|e| e.to_string())
            }
            OwnRules::IptablesChains(backend) => {
                kproxy_iptables::cleanup(&mut IptablesRestore::new(*backend), &families).map_err(|e| e.to_string())
            }
            OwnRules::IptablesChainsNotIpvs(backend) => families
                .iter()
                .try_for_each(|&family| {
                    kproxy_iptables::cleanup::remove_chains(
                        &mut IptablesRestore::new(*backend),
                        family,
                        &kproxy_iptables::rules::Table::ALL,
                        |t, c| is_kproxy_chain(t, c) && !is_kube_proxy_ipvs_chain(t, c),
                    )
                    .map(|_| ())
                })
                .map_err(|e| e.to_string()),
            OwnRules::Ipvs => {
                kproxy_ipvs::cleanup(&mut kproxy_ipvs::KernelHost::new(), ipvs).map_err(|e| e.to_string())
            }
            OwnRules::IpvsKproxyOnly => {
                kproxy_ipvs::cleanup_kproxy_only(&mut kproxy_ipvs::KernelHost::new(), ipvs).map_err(|e| e.to_string())
            }
        };
        if let Err(e) = result {
            failed.push(format!("{part:?}: {e}"));
        }
    }
    failed
}

/// What a stopping kproxy did about kube-proxy.
#[derive(Debug, PartialEq, Eq)]
pub enum Handback {
    /// kube-proxy's rules are not in the kernel: a plain stop, kproxy's rules stay.
    NotRunning,
    /// kproxy's rules (those kube-proxy does not share) are gone.
    HandedBack,
    /// kube-proxy's rules are there but it never answered `/healthz`, and they may be stale
    /// leftovers: kproxy's rules stay.
    Kept,
}

/// The SIGTERM side: see the module's doc. `stop_syncing` stops the sync loop (and resolves
/// once the sync in progress, if any, has ended). `took_over` says kproxy removed kube-proxy's
/// leftovers earlier in its life, so kube-proxy's rules in the kernel now are a running
/// kube-proxy's.
pub async fn hand_back(
    own: Own,
    ipvs: &kproxy_ipvs::Config,
    healthz: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    listeners: &mut Listeners,
    took_over: bool,
    stop_syncing: impl Future<Output = ()>,
) -> Handback {
    let ipvs_config = ipvs.clone();
    let found = match tokio::task::spawn_blocking(move || kproxy_takeover::find_running(own, &ipvs_config)).await {
        Ok(Ok(found)) => found,
        Ok(Err(e)) => {
            warn!(error = %e, "could not look for kube-proxy's rules; stopping as usual");
            return Handback::NotRunning;
        }
        Err(_) => return Handback::NotRunning,
    };
    if found.is_empty() {
        return Handback::NotRunning;
    }
    info!("kube-proxy's rules are in the kernel ({found}): handing the node back to kube-proxy");
    listeners.release().await;
    stop_syncing.await;
    let deadline = tokio::time::Instant::now() + HANDBACK_WAIT;
    let answered = match healthz {
        Some(addr) => wait_healthy(addr, deadline).await,
        None => false,
    };
    // Healthy from its start, kube-proxy has its rules in only once it reports a sync.
    let synced = match (answered, metrics) {
        (true, Some(addr)) => wait_synced(addr, deadline).await,
        (answered, _) => answered,
    };
    if !synced && !took_over {
        error!(
            "kube-proxy did not answer /healthz and report a sync on /metrics within {}s, and its rules may be \
             stale leftovers: kproxy's rules stay (`kproxy --cleanup` removes them)",
            HANDBACK_WAIT.as_secs()
        );
        return Handback::Kept;
    }
    if !synced {
        warn!(
            answered_healthz = answered,
            "kube-proxy did not report a sync, but it programmed its rules since kproxy took over: handing back"
        );
    }
    let parts = handback_removals(own, &found);
    let ipvs = ipvs.clone();
    let failed = tokio::task::spawn_blocking(move || remove_own(&parts, &ipvs)).await.unwrap_or_default();
    if failed.is_empty() {
        info!("handed the node back to kube-proxy: kproxy's rules are gone");
    } else {
        error!(?failed, "handing back: some of kproxy's rules could not be removed (`kproxy --cleanup` removes them)");
    }
    Handback::HandedBack
}

/// Whether something answers `GET /healthz` on `addr` with 200 before `deadline` (asked every
/// 250 ms).
pub async fn wait_healthy(addr: SocketAddr, deadline: tokio::time::Instant) -> bool {
    let target = reachable(addr);
    poll_until(deadline, || healthz_ok(target)).await
}

/// Whether the `/metrics` on `addr` reports a finished sync of kube-proxy's rules before
/// `deadline` (asked every 250 ms).
pub async fn wait_synced(addr: SocketAddr, deadline: tokio::time::Instant) -> bool {
    let target = reachable(addr);
    poll_until(deadline, || async move {
        let page = get(target, "/metrics", METRICS_PAGE_LIMIT).await?;
        Ok(reports_a_sync(&String::from_utf8_lossy(&page)))
    })
    .await
}

async fn poll_until<F, Fut>(deadline: tokio::time::Instant, mut ask: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = std::io::Result<bool>>,
{
    while tokio::time::Instant::now() < deadline {
        if let Ok(Ok(true)) = tokio::time::timeout(Duration::from_secs(1), ask()).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// The most of a `/metrics` page read (kube-proxy's is about 100 KiB).
const METRICS_PAGE_LIMIT: usize = 4 << 20;

/// The gauge kube-proxy sets at the end of every sync of its rules (0 until the first).
const LAST_SYNC_GAUGE: &str = "kubeproxy_sync_proxy_rules_last_timestamp_seconds";

/// Whether a Prometheus text page has [`LAST_SYNC_GAUGE`] above 0.
fn reports_a_sync(page: &str) -> bool {
    page.lines()
        .filter_map(|line| line.strip_prefix(LAST_SYNC_GAUGE))
        .filter_map(|rest| rest.strip_prefix(' ').or_else(|| rest.split_once("} ").map(|(_, value)| value)))
        .filter_map(|value| value.split_whitespace().next()?.parse::<f64>().ok())
        .any(|value| value > 0.0)
}

/// One `GET path` on `addr`: the whole response (head and body), at most `limit` bytes.
async fn get(addr: SocketAddr, path: &str, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut page = Vec::new();
    (&mut stream).take(limit as u64).read_to_end(&mut page).await?;
    Ok(page)
}

/// The address to ask for a listener bound to `addr` (loopback for the unspecified address).
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port()),
        _ => addr,
    }
}

/// One `GET /healthz`: whether the status line says 200. (A status line is all this needs; an
/// HTTP client crate would be a second HTTP stack next to the servers' hyper.)
async fn healthz_ok(addr: SocketAddr) -> std::io::Result<bool> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut head = [0u8; 32];
    let mut read = 0;
    while read < 12 {
        let n = stream.read(&mut head[read..]).await?;
        if n == 0 {
            break;
        }
        read += n;
    }
    Ok(head[..read].starts_with(b"HTTP/1.1 200") || head[..read].starts_with(b"HTTP/1.0 200"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use kproxy_iptables::rules::Table;
    use kproxy_nft_model::{TableFamily, TableRef};
    use kproxy_state::IpFamily;
    use kproxy_takeover::{IptablesLeftovers, IpvsLeftovers};

    fn nftables_kube_proxy() -> Leftovers {
        Leftovers {
            nft_tables: vec![TableRef { family: TableFamily::Ip, name: "kube-proxy".into() }],
            ..Default::default()
        }
    }

    fn iptables_kube_proxy(backend: Backend) -> Leftovers {
        Leftovers {
            iptables: vec![IptablesLeftovers { backend, family: IpFamily::V4, tables: vec![Table::Nat], chains: 3 }],
            ..Default::default()
        }
    }

    fn ipvs_kube_proxy() -> Leftovers {
        Leftovers { ipsets: vec!["KUBE-CLUSTER-IP".into()], ..iptables_kube_proxy(Backend::Nft) }
    }

    #[test]
    fn handing_back_removes_what_kube_proxys_mode_does_not_share() {
        use OwnRules::*;
        // nftables mode shares nothing with any kube-proxy mode.
        for found in [nftables_kube_proxy(), iptables_kube_proxy(Backend::Nft), ipvs_kube_proxy()] {
            assert_eq!(handback_removals(Own::Nftables, &found), [AccelerationTable, NftablesTables]);
        }
        let own = Own::Iptables(Backend::Nft);
        assert_eq!(handback_removals(own, &nftables_kube_proxy()), [AccelerationTable, IptablesChains(Backend::Nft)]);
        assert_eq!(
            handback_removals(own, &iptables_kube_proxy(Backend::Legacy)),
            [AccelerationTable, IptablesChains(Backend::Nft)],
            "kube-proxy on the other backend shares no chain"
        );
        assert_eq!(
            handback_removals(own, &ipvs_kube_proxy()),
            [AccelerationTable, IptablesChainsNotIpvs(Backend::Nft)],
            "kube-proxy's IPVS mode writes KUBE-SERVICES, KUBE-POSTROUTING, ... on the same backend"
        );
        assert_eq!(handback_removals(own, &iptables_kube_proxy(Backend::Nft)), [AccelerationTable]);
        assert_eq!(handback_removals(Own::Ipvs, &nftables_kube_proxy()), [AccelerationTable, Ipvs]);
        assert_eq!(handback_removals(Own::Ipvs, &ipvs_kube_proxy()), [AccelerationTable, IpvsKproxyOnly]);
        let with_services = Leftovers { ipvs: Some(IpvsLeftovers::default()), ..Default::default() };
        assert_eq!(handback_removals(Own::Ipvs, &with_services), [AccelerationTable, IpvsKproxyOnly]);
    }

    #[test]
    fn a_wildcard_listener_is_asked_on_loopback() {
        let v4: SocketAddr = "0.0.0.0:10256".parse().unwrap();
        let v6: SocketAddr = "[::]:10256".parse().unwrap();
        let node: SocketAddr = "198.18.0.2:10256".parse().unwrap();
        assert_eq!(reachable(v4).to_string(), "127.0.0.1:10256");
        assert_eq!(reachable(v6).to_string(), "[::1]:10256");
        assert_eq!(reachable(node), node);
    }

    /// A local HTTP server that answers its connections one after another with `answers`, then
    /// stops listening (the task ends).
    async fn answer_in_turn(answers: &[&'static str]) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = server.local_addr().unwrap();
        let answers = answers.to_vec();
        let serving = tokio::spawn(async move {
            for answer in answers {
                let (mut s, _) = server.accept().await.unwrap();
                let mut buf = [0u8; 256];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        (addr, serving)
    }

    #[tokio::test]
    async fn a_healthz_answer_is_seen_only_when_it_is_200() {
        let (addr, serving) = answer_in_turn(&[
            "HTTP/1.1 503 Service Unavailable\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        ])
        .await;
        assert!(!healthz_ok(addr).await.unwrap_or(true), "503 is not healthy");
        assert!(healthz_ok(addr).await.unwrap_or(false));
        serving.await.unwrap();
        // Nobody listens any more.
        assert!(!wait_healthy(addr, tokio::time::Instant::now() + Duration::from_millis(600)).await);
    }

    #[test]
    fn a_sync_is_seen_only_when_kube_proxys_last_sync_gauge_is_above_zero() {
        let help = "# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds [ALPHA] The last time proxy rules were successfully synced\n# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n";
        assert!(!reports_a_sync(&format!("{help}kubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n")));
        assert!(reports_a_sync(&format!("{help}kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7965495e+09\n")));
        assert!(reports_a_sync("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1.7e+09\n"));
        assert!(!reports_a_sync(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds_other 5\nkubeproxy_sync_proxy_rules_duration_seconds_count 3\n"
        ));
        assert!(!reports_a_sync(""));
    }

    #[tokio::test]
    async fn a_sync_is_waited_for_until_the_metrics_page_reports_one() {
        let (addr, serving) = answer_in_turn(&[
            "HTTP/1.1 200 OK\r\n\r\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n",
            "HTTP/1.1 200 OK\r\n\r\nkubeproxy_sync_proxy_rules_last_timestamp_seconds 1.79e+09\n",
        ])
        .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        assert!(wait_synced(addr, deadline).await, "the second page reports a sync");
        serving.await.unwrap();
        assert!(!wait_synced(addr, tokio::time::Instant::now() + Duration::from_millis(600)).await, "nobody listens");
    }
}
