//! Which IP families this node can proxy, probed once at start (upstream probes its backends
//! the same way and runs single-stack when only one family is there): IPv4 always; IPv6 when
//! the network namespace has IPv6 enabled and, in iptables mode, `ip6tables` works.
//! Planning a family the node lacks made every iptables sync fail and exported IPv6 series on
//! IPv4-only nodes.

use std::fs;

use kproxy_config::ProxyMode;
use kproxy_state::IpFamily;
use tracing::info;

/// Why IPv6 is not proxied, if it is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ipv6Support {
    /// IPv6 is there.
    Available,
    /// It is not, for this reason.
    Missing(String),
}

/// IPv6 as the kernel reports it: `net.ipv6.conf.all.disable_ipv6` of this namespace (absent
/// when the kernel has no IPv6 at all).
pub fn kernel_ipv6(disable_ipv6: Option<&str>) -> Ipv6Support {
    match disable_ipv6.map(str::trim) {
        None => Ipv6Support::Missing("the kernel has no IPv6 (no /proc/sys/net/ipv6)".to_owned()),
        Some("0") => Ipv6Support::Available,
        Some(_) => Ipv6Support::Missing("IPv6 is disabled (net.ipv6.conf.all.disable_ipv6=1)".to_owned()),
    }
}

/// The families to plan in `mode`. `dry_run` skips the probes that run tools.
pub fn probe(mode: ProxyMode, dry_run: bool) -> Vec<IpFamily> {
    match ipv6_support(mode, dry_run) {
        Ipv6Support::Available => {
            info!("IPv4 and IPv6 available: proxying both families (dual-stack)");
            IpFamily::BOTH.to_vec()
        }
        Ipv6Support::Missing(why) => {
            info!("{why}: proxying IPv4 only (single-stack)");
            vec![IpFamily::V4]
        }
    }
}

/// The families whose iptables chains `--cleanup` removes: IPv6 only where `ip6tables` runs
/// (on an IPv4-only node it fails, and kproxy has nothing there to remove).
pub fn for_iptables_cleanup() -> Vec<IpFamily> {
    match ipv6_support(ProxyMode::Iptables, false) {
        Ipv6Support::Available => IpFamily::BOTH.to_vec(),
        Ipv6Support::Missing(why) => {
            info!("{why}: cleaning up IPv4 iptables chains only");
            vec![IpFamily::V4]
        }
    }
}

fn ipv6_support(mode: ProxyMode, dry_run: bool) -> Ipv6Support {
    let disable_ipv6 = fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6").ok();
    let ipv6 = kernel_ipv6(disable_ipv6.as_deref());
    if ipv6 == Ipv6Support::Available && mode == ProxyMode::Iptables && !dry_run { ip6tables_works() } else { ipv6 }
}

/// Whether `ip6tables` of the backend kproxy would use can read the nat table.
fn ip6tables_works() -> Ipv6Support {
    use kproxy_iptables::Executor;
    let mut exec = kproxy_iptables::IptablesRestore::new(kproxy_iptables::backend::detect());
    let args = ["-t", "nat", "-S", "POSTROUTING"].map(str::to_owned);
    match exec.run(IpFamily::V6, &args) {
        Ok(out) if out.success => Ipv6Support::Available,
        Ok(_) => Ipv6Support::Missing("ip6tables cannot list the nat table".to_owned()),
        Err(e) => Ipv6Support::Missing(format!("ip6tables does not run ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_follows_the_namespace_switch() {
        assert_eq!(kernel_ipv6(Some("0\n")), Ipv6Support::Available);
        assert!(matches!(kernel_ipv6(Some("1\n")), Ipv6Support::Missing(why) if why.contains("disabled")));
        assert!(matches!(kernel_ipv6(None), Ipv6Support::Missing(why) if why.contains("no IPv6")));
    }
}
