//! Waiting for a change to reach the kernel without polling it: the proxy's tables are watched
//! for nf_tables commit notices (`nft monitor`'s, via `kproxy_nft_netlink::monitor`), and the
//! kernel is looked at once after each. A busy poll (every 0.2 ms, as both daemon modes used
//! to) competed for the node's two cores with the proxy (and the API server), and slowed the
//! very change it timed.

use std::time::{Duration, Instant};

use kproxy_nft_model::{TableFamily, TableRef};
use kproxy_nft_netlink::monitor::{Commit, Monitor, Notice};

use super::Mode;

/// How long a wait goes without a commit notice before it looks anyway (a notice lost to an
/// overflowing socket would otherwise cost the whole timeout).
const MISSED_NOTICE: Duration = Duration::from_millis(100);

/// A table of that name in both IP families.
pub fn both_families(name: &str) -> Vec<TableRef> {
    [TableFamily::Ip, TableFamily::Ip6].map(|family| TableRef { family, name: name.to_owned() }).to_vec()
}

/// The tables a change of that mode's proxy is written to: its own nftables tables, or the
/// iptables `nat` table (the IPv4 one: the changes the benchmarks time are IPv4 endpoints).
pub fn tables(mode: Mode, nftables_table: &str) -> Vec<TableRef> {
    match mode {
        Mode::Nftables => both_families(nftables_table),
        Mode::Iptables => vec![TableRef { family: TableFamily::Ip, name: "nat".into() }],
    }
}

/// Watches `tables` for commits (open it before the change is made).
pub fn monitor(tables: &[TableRef]) -> anyhow::Result<Monitor> {
    Ok(Monitor::open(tables)?.with_timeout(MISSED_NOTICE)?)
}

/// Waits until `seen` answers true or `timeout` passes, looking once before the first notice and
/// then only when the monitor reports a commit (or, should one be missed, after
/// [`MISSED_NOTICE`]); the time from `sent` to the notice of the commit that made it true, ms.
pub fn wait(
    sent: Instant,
    timeout: Duration,
    monitor: &mut Monitor,
    mut seen: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Option<f64>> {
    let mut noticed = sent;
    while sent.elapsed() < timeout {
        if seen()? {
            return Ok(Some(noticed.duration_since(sent).as_secs_f64() * 1000.0));
        }
        match monitor.wait() {
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
        noticed = Instant::now();
    }
    Ok(None)
}

/// What the commits between a change's write and its arrival in the kernel did to the watched
/// tables, as their notices said.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    /// Commits noticed.
    pub commits: usize,
    /// Elements added and deleted.
    pub elements: usize,
    /// Other objects (rules, chains, sets) added or deleted.
    pub objects: usize,
    /// Notices lost to an overflowing socket meanwhile (the counts above miss theirs).
    pub overruns: usize,
}

impl Cost {
    fn add(&mut self, c: &Commit) {
        self.commits += 1;
        self.elements += c.elements();
        self.objects += c.objects;
    }
}

/// As [`wait`], and also adds up what the commits noticed meanwhile did (`seen` gets the
/// monitor, to read the elements they added): the time from `sent` to the notice of the commit
/// that made it true, ms, and that cost; `None` when not seen within `timeout`.
pub fn wait_counting(
    sent: Instant,
    timeout: Duration,
    monitor: &mut Monitor,
    mut seen: impl FnMut(&mut Monitor) -> anyhow::Result<bool>,
) -> anyhow::Result<(Option<f64>, Cost)> {
    let mut noticed = sent;
    let mut cost = Cost::default();
    while sent.elapsed() < timeout {
        if seen(monitor)? {
            return Ok((Some(noticed.duration_since(sent).as_secs_f64() * 1000.0), cost));
        }
        match monitor.wait() {
            Ok(Notice::Touched(c)) => cost.add(&c),
            Ok(Notice::Overrun) => cost.overruns += 1,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e.into()),
        }
        noticed = Instant::now();
    }
    Ok((None, cost))
}

#[cfg(test)]
mod tests {
    use super::super::kernel;
    use super::*;

    #[test]
    fn iptables_mode_watches_the_ipv4_nat_table_and_nftables_mode_both_families_of_its_table() {
        assert_eq!(
            tables(Mode::Iptables, kernel::TABLE),
            vec![TableRef { family: TableFamily::Ip, name: "nat".into() }]
        );
        let nft = tables(Mode::Nftables, kernel::TABLE);
        assert_eq!(nft.iter().map(|t| t.family).collect::<Vec<_>>(), vec![TableFamily::Ip, TableFamily::Ip6]);
        assert!(nft.iter().all(|t| t.name == kernel::TABLE));
    }
}
