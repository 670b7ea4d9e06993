//! The shared packet suite, unchanged, against the IPVS dataplane: one test per case, each in
//! its own testbed. Needs IPVS and dummy devices, so it runs in the guest kernel
//! (`cargo xtask guest-test`); on the host it skips with a message (the CI rule of
//! `kproxy_testbed::kernel`). A case that can not hold on IPVS is not silently dropped: it sits in
//! `CANNOT_APPLY_TO_IPVS` with the kernel's reason, and that list is printed on every run.

use kproxy_ipvs::{Config, IpvsDataplane, KernelHost};
use kproxy_packet_suite::{all_cases, run_named_in_mode};
use kproxy_plan::{Dataplane, DataplaneError, Plan, PlanDelta};
use kproxy_testbed::kernel::{self, KernelFeature};

/// The IPVS dataplane, dumping the kernel state before cleanup when `KPROXY_IPVS_DUMP` is set.
struct Ipvs(IpvsDataplane<KernelHost>);

impl Dataplane for Ipvs {
    fn full_sync(&mut self, plan: &Plan) -> Result<(), DataplaneError> {
        self.0.full_sync(plan).map(|_| ()).map_err(Into::into)
    }

    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), DataplaneError> {
        self.0.sync(plan, delta).map(|_| ()).map_err(Into::into)
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        if std::env::var_os("KPROXY_IPVS_DUMP").is_some() {
            dump_kernel_state();
        }
        self.0.cleanup().map_err(Into::into)
    }
}

/// With `KPROXY_IPVS_DUMP` set, prints the node's kernel state at the end of each case (before
/// cleanup): what a failing case needs to be understood in the guest.
fn dump_kernel_state() {
    let commands =
        ["nft list ruleset", "ipvsadm -Ln", "ipvsadm -Lnc", "conntrack -L", "ip route show table all", "ip -6 route"];
    for cmd in commands {
        let out = std::process::Command::new("sh").arg("-c").arg(format!("{cmd} 2>&1")).output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_else(|e| e.to_string());
        println!("### {cmd}\n{text}");
    }
}

/// Suite cases that can not hold on IPVS, with the kernel's reason. Their generated test prints
/// the reason instead of running the case, and `cases_that_cannot_apply_to_ipvs` prints the whole
/// list on every run.
const CANNOT_APPLY_TO_IPVS: &[(&str, &str)] = &[(
    "client_ip_affinity_sticks_and_expires",
    "IPVS implements ClientIP affinity as a persistence template, and the kernel does not expire a \
     template while a connection it scheduled is still in the IPVS connection table \
     (ip_vs_conn_expire re-arms it while n_control > 0). Every closed TCP probe stays in that table \
     in TIME_WAIT for 120 s (IP_VS_TCP_S_TIME_WAIT; the IPVS API sets only the tcp, tcpfin and udp \
     timeouts), so a 1 s affinity can not expire between TCP probes. tests/kernel.rs \
     affinity_is_persistence_with_the_service_timeout_and_expires checks the template's timeout and \
     shows its expiry with UDP.",
)];

#[test]
fn cases_that_cannot_apply_to_ipvs() {
    use std::io::Write;
    let names: Vec<&str> = all_cases().iter().map(|c| c.name).collect();
    let mut text = String::from("packet-suite cases that cannot apply to IPVS (no test here):\n");
    for (name, why) in CANNOT_APPLY_TO_IPVS {
        assert!(names.contains(name), "{name} is not a suite case any more");
        text.push_str(&format!("  {name}: {why}\n"));
    }
    // Straight to the process's stderr, past libtest's capture: the list is shown on every run.
    let _ = std::io::stderr().write_all(text.as_bytes());
}

fn run(name: &str) {
    if let Some((_, why)) = CANNOT_APPLY_TO_IPVS.iter().find(|(n, _)| *n == name) {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "{name}: cannot apply to IPVS, not run: {why}");
        return;
    }
    if !kernel::require_root() || !kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy]) {
        return;
    }
    // IPVS mode lists the node's addresses: its NodePorts are address services on each.
    let ipvs_mode = |p: &mut kproxy_plan::ProxyPolicy| p.list_local_addresses = true;
    run_named_in_mode(name, ipvs_mode, || Ipvs(IpvsDataplane::new(KernelHost::new(), Config::default())));
}

kproxy_packet_suite::packet_tests!(run);
