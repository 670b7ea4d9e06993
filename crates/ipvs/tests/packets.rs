//! The shared packet suite, unchanged, against the IPVS dataplane: one test per case, each in
//! its own testbed. Needs IPVS and dummy devices, so it runs in the guest kernel
//! (`cargo xtask guest-test`); on the host it skips with a message (the CI rule of
//! `kproxy_testbed::kernel`). A case that can not hold on IPVS is not silently dropped: it sits in
//! `CANNOT_APPLY_TO_IPVS` with the kernel's reason, and that list is printed on every run.

use kproxy_ipvs::{Config, IpvsDataplane, KernelHost};
use kproxy_packet_suite::{Dataplane, all_cases, run_case};
use kproxy_plan::{Plan, PlanDelta};
use kproxy_testbed::kernel::{self, KernelFeature};

struct Ipvs(IpvsDataplane<KernelHost>);

impl Dataplane for Ipvs {
    fn sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), String> {
        self.0.sync(plan, delta).map(|_| ()).map_err(|e| e.to_string())
    }

    fn cleanup(&mut self) -> Result<(), String> {
        if std::env::var_os("KPROXY_IPVS_DUMP").is_some() {
            dump_kernel_state();
        }
        self.0.cleanup().map_err(|e| e.to_string())
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

/// Suite cases that can not hold on IPVS, with the kernel's reason. They get no test;
/// `every_suite_case_has_a_test` accepts a missing test only from this list, and
/// `cases_that_cannot_apply_to_ipvs` prints the list on every run.
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
    if !kernel::require_root() || !kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy]) {
        return;
    }
    let cases = all_cases();
    let Some(case) = cases.iter().find(|c| c.name == name) else { panic!("no case named {name}") };
    match run_case(case, || Ipvs(IpvsDataplane::new(KernelHost::new(), Config::default()))) {
        Ok(Some(log)) => println!("{log}"),
        Ok(None) => println!("case {name} skipped"),
        Err(report) => panic!("{report}"),
    }
}

macro_rules! cases {
    ($($name:ident),+ $(,)?) => {
        $( #[test] fn $name() { run(stringify!($name)); } )+

        #[test]
        fn every_suite_case_has_a_test() {
            let listed = [$(stringify!($name)),+];
            for case in all_cases() {
                let excluded = CANNOT_APPLY_TO_IPVS.iter().any(|(n, _)| *n == case.name);
                assert!(
                    listed.contains(&case.name) != excluded,
                    "case {} needs exactly one of: a test in tests/packets.rs, an entry in CANNOT_APPLY_TO_IPVS",
                    case.name
                );
            }
        }
    };
}

cases!(
    clusterip_tcp,
    clusterip_udp,
    clusterip_sctp,
    multi_port,
    endpoints_spread_evenly,
    nodeport_primary_ip_only,
    nodeport_all_addresses,
    loadbalancer_ip,
    external_ip,
    etp_local_keeps_client_ip_and_local_endpoints,
    etp_local_short_circuits_pods_and_host,
    itp_local,
    no_endpoints_rejects,
    local_policy_without_local_endpoints_drops,
    load_balancer_source_ranges,
    hairpin_is_masqueraded,
    masquerade_all,
    detect_local_node_cidr,
    detect_local_interface_name_prefix,
    detect_local_bridge_interface,
    detect_local_none_never_masquerades_cluster_ips,
    terminating_endpoints_are_a_fallback,
    topology_hints_pick_same_zone,
    ipv6_clusterip,
    ipv6_nodeport,
    ipv6_etp_local,
    service_updated_in_place,
    cleanup_leaves_the_kernel_as_found,
    kep6246_no_masquerade_cidrs_exempt_only_the_node_when_pods_are_undetectable,
    kep6246_no_masquerade_cidrs_override_masquerade_all_for_node_and_local_pods,
    kep6246_no_masquerade_cidrs_route_node_traffic_like_direct_traffic,
    kep6246_no_masquerade_cidrs_still_masquerade_hairpin,
    kep6246_snat_to_node_ip,
    kep6246_snat_to_node_ip_falls_back_per_family_and_follows_the_node,
    kep6246_snat_to_node_ip_with_no_masquerade_cidrs,
    kep6246_without_options_node_traffic_is_masqueraded_to_the_egress_interface,
);
