//! The IPVS dataplane's settings: kube-proxy's `ipvs.*` configuration plus kproxy's choices of
//! names and marks.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;

use crate::genl::F_SCHED2;

/// `--ipvs-scheduler`: the kernel's schedulers kube-proxy accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scheduler {
    /// Round robin (the default).
    #[default]
    Rr,
    /// Weighted round robin.
    Wrr,
    /// Least connection.
    Lc,
    /// Weighted least connection.
    Wlc,
    /// Locality-based least connection.
    Lblc,
    /// Locality-based least connection with replication.
    Lblcr,
    /// Source hashing.
    Sh,
    /// Destination hashing.
    Dh,
    /// Shortest expected delay.
    Sed,
    /// Never queue.
    Nq,
    /// Maglev hashing (kube-proxy sets `mh-port`).
    Mh,
}

impl Scheduler {
    /// Every scheduler.
    pub const ALL: [Scheduler; 11] = [
        Scheduler::Rr,
        Scheduler::Wrr,
        Scheduler::Lc,
        Scheduler::Wlc,
        Scheduler::Lblc,
        Scheduler::Lblcr,
        Scheduler::Sh,
        Scheduler::Dh,
        Scheduler::Sed,
        Scheduler::Nq,
        Scheduler::Mh,
    ];

    /// The kernel's name.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Rr => "rr",
            Scheduler::Wrr => "wrr",
            Scheduler::Lc => "lc",
            Scheduler::Wlc => "wlc",
            Scheduler::Lblc => "lblc",
            Scheduler::Lblcr => "lblcr",
            Scheduler::Sh => "sh",
            Scheduler::Dh => "dh",
            Scheduler::Sed => "sed",
            Scheduler::Nq => "nq",
            Scheduler::Mh => "mh",
        }
    }

    /// Scheduler flags kube-proxy sets: `mh-port` for Maglev (hash the source port too, else
    /// one client's connections all land on one endpoint), nothing for the others.
    pub fn flags(self) -> u32 {
        if self == Scheduler::Mh { F_SCHED2 } else { 0 }
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown `--ipvs-scheduler` (kube-proxy exits on it, so does kproxy).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown IPVS scheduler {0:?} (want one of rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh)")]
pub struct UnknownScheduler(pub String);

impl FromStr for Scheduler {
    type Err = UnknownScheduler;

    /// Empty means the default, like kube-proxy.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.is_empty() {
            return Ok(Scheduler::Rr);
        }
        Scheduler::ALL.into_iter().find(|sc| sc.name() == s).ok_or_else(|| UnknownScheduler(s.to_owned()))
    }
}

/// Dataplane settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `ipvs.scheduler`.
    pub scheduler: Scheduler,
    /// `ipvs.strictARP`: `arp_ignore=1`, `arp_announce=2` on all interfaces.
    pub strict_arp: bool,
    /// `ipvs.tcpTimeout` (zero: leave the kernel's value).
    pub tcp_timeout: Duration,
    /// `ipvs.tcpFinTimeout` (zero: leave the kernel's value).
    pub tcp_fin_timeout: Duration,
    /// `ipvs.udpTimeout` (zero: leave the kernel's value).
    pub udp_timeout: Duration,
    /// `ipvs.excludeCIDRs`: virtual services in these are never deleted (someone else's).
    pub exclude_cidrs: Vec<IpNet>,
    /// The dummy interface holding the VIPs.
    pub interface: String,
    /// The auxiliary nftables table (both families).
    pub table: String,
    /// Conntrack mark bit: masquerade this connection (`1 << masqueradeBit`).
    pub masquerade_mark: u32,
    /// Conntrack mark bit: this connection comes from a local pod (KEP-6246 exemption).
    pub local_pod_mark: u32,
    /// Packet marks of kproxy's firewall-mark virtual services are `fwmark_base | id` with
    /// `id` below `!fwmark_mask + 1`; marks outside belong to someone else.
    pub fwmark_base: u32,
    /// See `fwmark_base`.
    pub fwmark_mask: u32,
    /// A removed TCP/SCTP real server is kept at weight 0 while it has connections, at most
    /// this long.
    pub graceful_period: Duration,
}

/// The dummy interface that holds IPVS's VIPs, kube-proxy's name for it (and kproxy's: taking a
/// node over from kube-proxy's IPVS mode adopts it). Its addresses are Services', not the node's.
pub const DUMMY_INTERFACE: &str = "kube-ipvs0";

impl Default for Config {
    fn default() -> Self {
        Self {
            scheduler: Scheduler::Rr,
            strict_arp: false,
            tcp_timeout: Duration::ZERO,
            tcp_fin_timeout: Duration::ZERO,
            udp_timeout: Duration::ZERO,
            exclude_cidrs: Vec::new(),
            interface: DUMMY_INTERFACE.to_owned(),
            table: "kproxy-ipvs".to_owned(),
            masquerade_mark: 0x4000,
            local_pod_mark: 0x2000,
            fwmark_base: 0x1000_0000,
            fwmark_mask: 0xf000_0000,
            graceful_period: Duration::from_secs(15 * 60),
        }
    }
}

impl Config {
    /// Whether `mark` is in kproxy's firewall-mark range.
    pub fn owns_fwmark(&self, mark: u32) -> bool {
        mark & self.fwmark_mask == self.fwmark_base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedulers_parse_by_kernel_name_and_empty_is_rr() {
        for s in Scheduler::ALL {
            assert_eq!(s.name().parse::<Scheduler>(), Ok(s));
        }
        assert_eq!("".parse::<Scheduler>(), Ok(Scheduler::Rr));
        assert!("fo".parse::<Scheduler>().is_err());
        assert_eq!(Scheduler::Mh.flags(), F_SCHED2);
        assert_eq!(Scheduler::Sh.flags(), 0);
    }

    #[test]
    fn fwmark_ownership_is_by_mask() {
        let c = Config::default();
        assert!(c.owns_fwmark(0x1000_0001));
        assert!(!c.owns_fwmark(0x4000));
        assert!(!c.owns_fwmark(0x2000_0001));
    }
}
