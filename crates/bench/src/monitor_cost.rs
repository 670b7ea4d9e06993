//! `kproxy-bench monitor-cost`: what following nf_tables' notifications
//! (`--watch-kernel-changes`, [`kproxy_nft_netlink::monitor`]) costs kproxy's own commits. While
//! anyone listens, the kernel builds a notice of every object a commit adds or deletes. In a
//! fresh network namespace, the same transactions are committed over netlink alternately with
//! no listener and with kproxy's monitor listening (its thread draining the notices, as in the
//! daemon); each figure is the wall time of the commit alone (one `apply`), median of the rounds.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_nft_model::{DataType, Element, Executor as _, Key, Op, SetDef, TableFamily, TableRef, Transaction, Value};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nft_netlink::monitor::Monitor;
use kproxy_testbed::Netns;

/// Measure the monitor's cost (root; builds its own network namespace).
#[derive(Debug, Clone, clap::Args)]
pub struct MonitorCostArgs {
    /// Elements in each commit, one size per row.
    #[arg(long, value_delimiter = ',', default_value = "10,1000,100000")]
    pub elements: Vec<usize>,
    /// Rounds per size and setting.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

fn table() -> TableRef {
    TableRef { family: TableFamily::Ip, name: "kproxy".into() }
}

/// A set of `n` addresses, created in one transaction.
fn commit(n: usize) -> Transaction {
    let t = table();
    let mut tx = Transaction::new();
    tx.push(Op::AddTable { table: t.clone(), comment: None });
    tx.push(Op::AddSet(t.clone(), SetDef::of("s", vec![DataType::Ipv4Addr])));
    for i in 0..n as u32 {
        let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
        tx.push(Op::AddElement(t.clone(), Element::new("s", Key::new([Value::Addr(ip.into())]))));
    }
    tx
}

fn timed(exec: &mut NetlinkExecutor, tx: &Transaction) -> anyhow::Result<Duration> {
    let start = Instant::now();
    exec.apply(tx).context("committing")?;
    let took = start.elapsed();
    let mut delete = Transaction::new();
    delete.push(Op::DeleteTable(table()));
    exec.apply(&delete).context("deleting the table")?;
    Ok(took)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn main(args: &MonitorCostArgs) -> anyhow::Result<bool> {
    let ns = Netns::new("kpb-monitor").context("creating the namespace")?;
    println!("kproxy-bench monitor-cost: one commit creating a table and a set of N addresses, over netlink,");
    println!(
        "alternately with no listener and with kproxy's monitor draining the notices (median of {} rounds)\n",
        args.rounds
    );
    println!("| elements | no listener | monitor listening | ratio |");
    println!("|---:|---:|---:|---:|");
    for &n in &args.elements {
        let tx = commit(n);
        let (quiet, watched) = ns
            .run_in(|| -> anyhow::Result<(Duration, Duration)> {
                let mut exec = NetlinkExecutor::new();
                let (mut quiet, mut watched) = (Vec::new(), Vec::new());
                for _ in 0..args.rounds {
                    quiet.push(timed(&mut exec, &tx)?);
                    // Drains until the notices stop for a while, then closes the socket: the next
                    // round has no listener again.
                    let mut monitor =
                        Monitor::open(&[table()]).and_then(|m| m.with_timeout(Duration::from_millis(300)))?;
                    let drain = std::thread::spawn(move || while monitor.wait().is_ok() {});
                    watched.push(timed(&mut exec, &tx)?);
                    drain.join().map_err(|_| anyhow::anyhow!("the drain thread panicked"))?;
                }
                Ok((median(quiet), median(watched)))
            })
            .context("entering the namespace")??;
        println!(
            "| {n} | {:.2} ms | {:.2} ms | {:.2}× |",
            quiet.as_secs_f64() * 1e3,
            watched.as_secs_f64() * 1e3,
            watched.as_secs_f64() / quiet.as_secs_f64()
        );
    }
    Ok(true)
}
