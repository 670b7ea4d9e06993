//! The fast path's sync logic without a kernel: what it would apply for each plan change (the
//! transactions, compared as their nft rendering).
//! (Creating the table reads the links of the test's own namespace; nothing is applied.)

#![allow(clippy::unwrap_used)]

use kproxy_accel::harness::{FAST_NODE_PORT, FAST_VIP, Hint, SLOW_VIP, service_object};
use kproxy_accel::{AccelConfig, Accelerator, RecordingKernel};
use kproxy_packet_suite::{NODE_A, node_objects};
use kproxy_plan::{NodeContext, Plan, PlanDelta, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState, Object};

struct World {
    planner: Planner,
    state: ClusterState,
    plan: Plan,
}

impl World {
    fn new(acceleration: bool, objects: Vec<Object>) -> (World, PlanDelta) {
        let policy = ProxyPolicy { acceleration, ..ProxyPolicy::default() };
        let planner = Planner::new(policy, NodeContext { name: NODE_A.into(), ..NodeContext::default() });
        let mut state = ClusterState::new();
        for object in node_objects().into_iter().chain(objects) {
            state.apply(Change::Applied(object));
        }
        let _ = state.take_dirty();
        let plan = planner.build(&state);
        let delta = PlanDelta::between(&Plan::default(), &plan);
        (World { planner, state, plan }, delta)
    }

    fn apply(&mut self, object: Object) -> PlanDelta {
        self.state.apply(Change::Applied(object));
        let dirty = self.state.take_dirty();
        self.planner.update(&mut self.plan, &self.state, &dirty)
    }
}

fn accelerator() -> Accelerator<RecordingKernel> {
    Accelerator::new(RecordingKernel::default(), AccelConfig::default())
}

/// The transactions applied so far, as nft text.
fn applied(accel: &Accelerator<RecordingKernel>) -> Vec<String> {
    accel.kernel().applied.iter().map(|tx| tx.render()).collect()
}

fn last(accel: &Accelerator<RecordingKernel>) -> String {
    applied(accel).pop().unwrap_or_default()
}

#[test]
fn first_sync_creates_the_table_with_every_opted_in_frontend() {
    let (world, delta) = World::new(
        true,
        vec![
            service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::Field),
            service_object("slow", SLOW_VIP, None, Hint::None),
        ],
    );
    let mut accel = accelerator();
    let report = accel.sync(&world.plan, &delta).unwrap();
    assert!(report.recreated);
    let batch = &applied(&accel)[0];
    assert!(batch.starts_with("add table inet kproxy-accel\ndelete table inet kproxy-accel\n"), "{batch}");
    for element in ["tcp . 198.18.128.20 . 80", "udp . 198.18.128.20 . 80"] {
        assert!(batch.contains(&format!("add element inet kproxy-accel vips-v4 {{ {element} }}\n")), "{batch}");
    }
    assert!(batch.contains("add element inet kproxy-accel nodeports { tcp . 30020 }"), "{batch}");
    assert!(!batch.contains("198.18.128.21"), "the service without the hint is in the sets:\n{batch}");
}

#[test]
fn changes_cost_only_the_elements_that_flip() {
    let (mut world, delta) = World::new(
        true,
        vec![
            service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::Field),
            service_object("slow", SLOW_VIP, None, Hint::None),
        ],
    );
    let mut accel = accelerator();
    accel.sync(&world.plan, &delta).unwrap();

    let delta = world.apply(service_object("slow", SLOW_VIP, None, Hint::Annotation));
    accel.sync(&world.plan, &delta).unwrap();
    assert_eq!(
        last(&accel),
        "add element inet kproxy-accel vips-v4 { tcp . 198.18.128.21 . 80 }\n\
         add element inet kproxy-accel vips-v4 { udp . 198.18.128.21 . 80 }\n"
    );

    let delta = world.apply(service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::None));
    accel.sync(&world.plan, &delta).unwrap();
    assert_eq!(
        last(&accel),
        "delete element inet kproxy-accel vips-v4 { tcp . 198.18.128.20 . 80 }\n\
         delete element inet kproxy-accel vips-v4 { udp . 198.18.128.20 . 80 }\n\
         delete element inet kproxy-accel nodeports { tcp . 30020 }\n"
    );

    // An unchanged plan sends nothing; the last opted-in service leaving removes the table.
    let batches = applied(&accel).len();
    accel.sync(&world.plan, &PlanDelta::default()).unwrap();
    assert_eq!(applied(&accel).len(), batches);
    let delta = world.apply(service_object("slow", SLOW_VIP, None, Hint::None));
    assert!(accel.sync(&world.plan, &delta).unwrap().removed);
    assert!(!accel.is_active());
    assert_eq!(last(&accel), "add table inet kproxy-accel\ndelete table inet kproxy-accel\n");
}

#[test]
fn a_failed_batch_is_repaired_by_recreating_the_table() {
    let (mut world, delta) =
        World::new(true, vec![service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::Field)]);
    let mut accel = accelerator();
    accel.sync(&world.plan, &delta).unwrap();
    accel.kernel_mut().fail_next = true;
    let delta = world.apply(service_object("slow", SLOW_VIP, None, Hint::Field));
    assert!(accel.sync(&world.plan, &delta).is_err());
    let report = accel.sync(&world.plan, &PlanDelta::default()).unwrap();
    assert!(report.recreated, "{report:?}");
    let batch = last(&accel);
    assert!(batch.contains("198.18.128.20") && batch.contains("198.18.128.21"), "{batch}");
}

#[test]
fn acceleration_switched_off_means_no_table() {
    let (world, delta) = World::new(false, vec![service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::Field)]);
    let mut accel = accelerator();
    let report = accel.sync(&world.plan, &delta).unwrap();
    assert!(report.removed && !accel.is_active());
    assert!(applied(&accel).iter().all(|b| !b.contains("flowtable")), "{:?}", applied(&accel));
}

#[test]
fn a_kernel_without_flowtables_gets_nothing_and_is_asked_once() {
    let (mut world, delta) =
        World::new(true, vec![service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::Field)]);
    let mut accel = accelerator();
    accel.kernel_mut().no_flowtables = true;
    assert_eq!(accel.supported(), None);
    let report = accel.sync(&world.plan, &delta).unwrap();
    assert!(report.skipped && !accel.is_active(), "{report:?}");
    assert_eq!(accel.supported(), Some(false));
    // Later syncs neither retry nor probe again: the answer is kept even if the kernel changed.
    accel.kernel_mut().no_flowtables = false;
    let delta = world.apply(service_object("slow", SLOW_VIP, None, Hint::Field));
    assert!(accel.sync(&world.plan, &delta).unwrap().skipped);
    assert_eq!(accel.supported(), Some(false));
    assert!(applied(&accel).is_empty(), "{:?}", applied(&accel));
}

#[test]
fn a_failing_batch_is_retried_with_backoff_not_at_every_sync() {
    let (world, delta) = World::new(true, vec![service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::Field)]);
    let mut accel = accelerator();
    accel.kernel_mut().failing = true;
    assert!(accel.sync(&world.plan, &delta).is_err());
    // The first retry is immediate (a transient error is repaired by the next sync) ...
    assert!(accel.sync(&world.plan, &PlanDelta::default()).is_err());
    // ... then the batch waits: syncs in between try nothing.
    for _ in 0..3 {
        assert!(accel.sync(&world.plan, &PlanDelta::default()).unwrap().skipped);
    }
    accel.kernel_mut().failing = false;
    assert!(accel.sync(&world.plan, &PlanDelta::default()).unwrap().skipped);
    assert!(applied(&accel).is_empty());
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let report = accel.sync(&world.plan, &PlanDelta::default()).unwrap();
    assert!(report.recreated && accel.is_active(), "{report:?}");
}
