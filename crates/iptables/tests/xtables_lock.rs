//! The xtables lock (iptables-legacy): a restore waits while another process holds the lock and
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

/// Holds the lock file for `hold`, from another thread; returns once it is held.
fn hold_lock(path: &std::path::Path, hold: Duration) -> std::thread::JoinHandle<()> {
    let file = std::fs::File::options().create(true).truncate(false).write(true).open(path).unwrap();
    file.lock().unwrap();
    std::thread::spawn(move || {
        std::thread::sleep(hold);
        file.unlock().unwrap();
    })
}

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

    // Free: at once.
    let (result, took) = restore(&ns);
    assert!(result.is_ok(), "{result:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");

    // Held for 1.5 s: waits, then succeeds.
    let holder = hold_lock(&lock, Duration::from_millis(1500));
    let (result, took) = restore(&ns);
    holder.join().unwrap();
    assert!(result.is_ok(), "the restore went ahead once the lock was released: {result:?}");
    assert!(took >= Duration::from_millis(1300), "it waited for the lock: {took:?}");

    // Held for 12 s: gives up after about 5 s, naming the lock.
    let holder = hold_lock(&lock, Duration::from_secs(12));
    let (result, took) = restore(&ns);
    let error = result.expect_err("the restore gave up while the lock was held");
    assert!(error.to_string().contains("lock"), "{error}");
    assert!(took >= Duration::from_secs(4) && took < Duration::from_secs(10), "gave up after 5 s: {took:?}");
    holder.join().unwrap();
}
