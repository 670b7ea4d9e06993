//! The xtables lock (iptables-legacy): a restore waits while another thread holds the lock and
//! goes ahead once it is released; held for good, the restore gives up after 5 s with an error
//! naming the lock, instead of hanging kproxy's sync loop. The lock is a private file
//! (`XTABLES_LOCKFILE`), never the host's `/run/xtables.lock`; the rules go to a namespace of
//! the test's own.

// `std::env::set_var` is unsafe: this file holds one test, which sets the variable before it
// starts any thread.
#![allow(clippy::unwrap_used, unsafe_code)]

use std::time::{Duration, Instant};

use kproxy_iptables::{Backend, Executor, IptablesRestore};
use kproxy_state::IpFamily;
use kproxy_testbed::Netns;

const INPUT: &str = "*filter\n:KPROXY-LOCK-TEST - [0:0]\nCOMMIT\n";

/// Holds the lock file from another thread until `release` sends (or is dropped), or `at_most`
/// passed; returns once it is held.
fn hold_lock(path: &std::path::Path, at_most: Duration) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let file = std::fs::File::options().create(true).truncate(false).write(true).open(path).unwrap();
    file.lock().unwrap();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let _ = released.recv_timeout(at_most);
        file.unlock().unwrap();
    });
    (release, holder)
}

/// Timing: "it waited" is a lower bound, which a slow machine only makes easier to meet. That a
/// restore held up gives up on its own is shown by what happened: it fails before the lock's
/// holder lets go (which it does only once the restore returned, or after a minute: then a
/// restore that waited for ever would succeed and fail the test). That it gives up after 5 s,
/// not much later, is the one upper bound, and it is derived from this machine's pace: the 5 s
/// of waiting plus ten times what a restore with the lock free took here a moment before (the
/// tool's start and its polls of the lock every 100 ms slow down with the machine), and never
/// less than a second on top.
#[test]
fn a_restore_waits_for_the_xtables_lock_and_gives_up_after_5_s_when_it_is_never_released() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("xtables.lock");
    // SAFETY: no other thread exists yet in this test binary's only test.
    unsafe { std::env::set_var("XTABLES_LOCKFILE", &lock) };
    let ns = Netns::new("xtlock").unwrap();
    let restore = |ns: &Netns| {
        ns.run_in(|| {
            let started = Instant::now();
            let result = IptablesRestore::new(Backend::Legacy).restore(IpFamily::V4, INPUT);
            (result, started.elapsed())
        })
        .unwrap()
    };

    // Free: goes ahead.
    let (result, free) = restore(&ns);
    assert!(result.is_ok(), "{result:?}");

    // Held for 1.5 s: waits, then succeeds.
    let (_release, holder) = hold_lock(&lock, Duration::from_millis(1500));
    let (result, took) = restore(&ns);
    holder.join().unwrap();
    assert!(result.is_ok(), "the restore went ahead once the lock was released: {result:?}");
    assert!(took >= Duration::from_millis(1300), "it waited for the lock: {took:?}");

    // Held until the restore returns: it gives up after about 5 s, naming the lock.
    let (release, holder) = hold_lock(&lock, Duration::from_secs(60));
    let (result, took) = restore(&ns);
    let still_held = !holder.is_finished();
    let _ = release.send(());
    holder.join().unwrap();
    let error = result.expect_err("the restore gave up while the lock was held");
    assert!(still_held, "the restore returned only after the lock's holder gave up ({took:?})");
    assert!(error.to_string().contains("lock"), "{error}");
    assert!(took >= Duration::from_secs(4), "gave up after 5 s of waiting, not sooner: {took:?}");
    let bound = Duration::from_secs(5) + Duration::from_secs(1).max(free * 10);
    eprintln!("a restore with the lock free took {free:?}; held for good, it gave up after {took:?} (bound {bound:?})");
    assert!(took < bound, "gave up after {took:?}: 5 s of waiting and a restore's own {free:?} allow {bound:?}");
}
