//! One `#[test]` per case for a dataplane's test file, from one list of case names.

/// Runs the case called `name` with dataplanes from `make`, printing its log; panics with the
/// report when it fails. What a generated test calls.
pub fn run_named<D: crate::Dataplane, F: FnOnce() -> D + Send>(name: &str, make: F) {
    run_named_in_mode(name, |_| {}, make);
}

/// [`run_named`] with the policy the daemon sets for the dataplane's mode (see
/// [`crate::run_case`]).
pub fn run_named_in_mode<D: crate::Dataplane, F: FnOnce() -> D + Send>(
    name: &str,
    mode_policy: fn(&mut kproxy_plan::ProxyPolicy),
    make: F,
) {
    let cases = crate::all_cases();
    let Some(case) = cases.iter().find(|c| c.name == name) else { panic!("no packet case named {name}") };
    match crate::run_case(case, mode_policy, make) {
        Ok(Some(log)) => println!("{log}"),
        Ok(None) => println!("case {name} skipped"),
        Err(report) => panic!("{report}"),
    }
}

/// Expands to one `#[test] fn <case>()` per packet case, each calling `$run(name)` (a function or
/// closure taking the case name), plus a guard test that fails when a case is missing here.
///
/// ```text
/// fn run(name: &str) { kproxy_packet_suite::run_named(name, || MyDataplane::new()) }
/// kproxy_packet_suite::packet_tests!(run);
/// ```
#[macro_export]
macro_rules! packet_tests {
    ($run:expr) => {
        $crate::__packet_tests!($run;
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
            client_ip_affinity_sticks_and_expires,
            client_ip_affinity_on_a_nodeport,
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
            rolling_replacement_reaches_every_endpoint,
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
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __packet_tests {
    ($run:expr; $($name:ident),+ $(,)?) => {
        $(
            #[test]
            fn $name() {
                ($run)(stringify!($name));
            }
        )+

        #[test]
        fn every_suite_case_has_a_test() {
            let listed = [$(stringify!($name)),+];
            for case in $crate::all_cases() {
                assert!(listed.contains(&case.name), "packet case {} is missing from packet_tests!", case.name);
            }
        }
    };
}
