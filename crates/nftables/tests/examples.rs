//! Golden snapshot of the ruleset kproxy programs for the shipped example cluster, as node-a.

use std::path::Path;

use kproxy_nftables::{Config, NftablesDataplane, Recording};
use kproxy_plan::{DetectLocal, NodeContext, Planner, ProxyPolicy};
use kproxy_state::ClusterState;

#[test]
fn example_cluster_ruleset() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let snapshot = kproxy_source::manifest::load(&dir).expect("examples load");
    assert!(snapshot.errors().is_empty(), "{:?}", snapshot.errors());
    let mut state = ClusterState::new();
    for change in snapshot.initial_changes() {
        let outcome = state.apply(change);
        assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
    }
    let policy = ProxyPolicy { detect_local: DetectLocal::NodeCidr, ..Default::default() };
    let plan = Planner::new(policy, NodeContext { name: "node-a".into(), ..Default::default() }).build(&state);
    let dataplane = NftablesDataplane::new(Recording::default(), Config::default());
    insta::assert_snapshot!(dataplane.render_initial(&plan).render());
}
