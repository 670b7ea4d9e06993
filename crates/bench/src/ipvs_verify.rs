//! `kproxy-bench ipvs-verify`: what the IPVS dataplane's periodic check (every `syncPeriod`)
//! costs at scale, next to what it cost before, a full sync. Needs IPVS and dummy interfaces
//! (the guest kernel: `cargo xtask guest-run`).
//!
//! Per size, in a fresh network namespace, the IPVS dataplane in this process syncs the
//! synthetic cluster of [`crate::cluster`] once (timed, for context), then each round times,
//! as the wall time of the one call:
//! - the old check: `full_sync` (a dest dump per virtual service, the addresses, the sysctls,
//!   and the auxiliary table recreated in one transaction);
//! - the new check with nothing changed anywhere (`verify`; must find it clean);
//! - the new check after someone committed to another nftables table (the generation moved, so
//!   the auxiliary table is listed and compared; must find it clean);
//! - the new check after one virtual service was deleted from outside (must repair just it);
//! - and, apart, the two ways of reading every real server: the check's (one dump of the
//!   services, one read of `/proc/net/ip_vs`) and the full sync's (a dump per service).

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use kproxy_ipvs::{Config, Host as _, IpvsDataplane, IpvsOp, KernelHost, ServiceKey};
use kproxy_nft_model::{Executor as _, Op, TableFamily, TableRef, Transaction};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_plan::{Plan, Verified};
use kproxy_testbed::Netns;

use crate::cluster;

/// Time the IPVS periodic check against a full sync (root; builds its own network namespace).
#[derive(Debug, Clone, clap::Args)]
pub struct IpvsVerifyArgs {
    /// Cluster sizes, in Services (one TCP port each).
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    pub services: Vec<usize>,
    /// Endpoints per Service.
    #[arg(long, default_value_t = 5)]
    pub endpoints: usize,
    /// Rounds per size (each figure is the median).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// One size's figures.
#[derive(Debug, Default)]
struct Figures {
    first_sync: Duration,
    full_sync: Vec<Duration>,
    clean: Vec<Duration>,
    listed: Vec<Duration>,
    repair: Vec<Duration>,
    read_text: Vec<Duration>,
    read_per_service: Vec<Duration>,
    virtual_services: usize,
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

/// A commit by someone else to a table of their own: it moves the nf_tables generation.
fn bystander_commit(exec: &mut NetlinkExecutor) -> anyhow::Result<()> {
    let table = TableRef { family: TableFamily::Ip, name: "bystander".into() };
    let mut tx = Transaction::new();
    tx.push(Op::AddTable { table: table.clone(), comment: None });
    tx.push(Op::DeleteTable(table));
    exec.apply(&tx).context("committing to another table")
}

fn expect_clean(what: &str, v: Verified) -> anyhow::Result<()> {
    match v {
        Verified::Clean => Ok(()),
        other => bail!("{what}: the check found {other:?} where nothing differed"),
    }
}

fn measure(plan: &Plan, rounds: usize) -> anyhow::Result<Figures> {
    let mut f = Figures::default();
    let mut dp = IpvsDataplane::new(KernelHost::new(), Config::default());
    let mut bystander = NetlinkExecutor::new();
    let (result, took) = timed(|| dp.full_sync(plan));
    result.context("first sync")?;
    f.first_sync = took;
    f.virtual_services = dp.host_mut().ipvs_services().context("listing virtual services")?.len();
    for round in 0..rounds {
        let (result, took) = timed(|| dp.full_sync(plan));
        result.context("full sync")?;
        f.full_sync.push(took);
        let (result, took) = timed(|| dp.verify(plan));
        expect_clean("untouched", result.context("check")?)?;
        f.clean.push(took);
        bystander_commit(&mut bystander)?;
        let (result, took) = timed(|| dp.verify(plan));
        expect_clean("after a commit elsewhere", result.context("check")?)?;
        f.listed.push(took);
        let key = some_cluster_ip(plan, round).context("the plan has no Service")?;
        dp.host_mut().ipvs(&IpvsOp::DeleteService(key)).context("deleting a virtual service")?;
        let (result, took) = timed(|| dp.verify(plan));
        match result.context("check")? {
            Verified::Repaired(lines) if lines.len() == 1 => {}
            other => bail!("one deleted virtual service: the check found {other:?}"),
        }
        f.repair.push(took);
        // The check's read of every real server, and the full sync's way, alone.
        let (result, took) = timed(|| dp.host_mut().ipvs_table());
        result.context("reading the IPVS table")?;
        f.read_text.push(took);
        let (result, took) = timed(|| -> Result<usize, kproxy_ipvs::Error> {
            let host = dp.host_mut();
            let mut dests = 0;
            for s in host.ipvs_services()? {
                dests += host.ipvs_dests(&s.key)?.len();
            }
            Ok(dests)
        });
        result.context("dumping real servers service by service")?;
        f.read_per_service.push(took);
    }
    dp.cleanup().context("cleanup")?;
    Ok(f)
}

/// The ClusterIP virtual service of the `round`-th Service.
fn some_cluster_ip(plan: &Plan, round: usize) -> Option<ServiceKey> {
    let services = &plan.families.values().next()?.services;
    let p = services.values().nth(round * 997 % services.len().max(1))?;
    Some(ServiceKey::Addr { addr: p.cluster_ip, protocol: p.protocol, port: p.port })
}

pub fn main(args: &IpvsVerifyArgs) -> anyhow::Result<bool> {
    println!("kproxy-bench ipvs-verify: the IPVS dataplane's periodic check, old (a full sync) and new (verify),");
    println!(
        "wall time of the one call in this process, median of {} rounds; {} endpoints per Service\n",
        args.rounds, args.endpoints
    );
    println!(
        "| Services | virtual services | first sync | old check: full sync | new check, untouched | \
         new check, generation moved | new check, one service deleted | IPVS read: text | IPVS read: dump per service |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &args.services {
        let (plan, _) = cluster::plan(n, args.endpoints);
        let ns = Netns::new("kpb-ipvs").context("creating the namespace")?;
        let f = ns.run_in(|| measure(&plan, args.rounds.max(1))).context("entering the namespace")??;
        println!(
            "| {n} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f.virtual_services,
            ms(f.first_sync),
            ms(median(&f.full_sync)),
            ms(median(&f.clean)),
            ms(median(&f.listed)),
            ms(median(&f.repair)),
            ms(median(&f.read_text)),
            ms(median(&f.read_per_service)),
        );
    }
    Ok(true)
}
