//! What every fuzz target of a reader of outside input holds besides its own checks: no case
//! allocates without bound (a length field that says 4 GiB must not make 4 GiB be allocated),
//! and the case counts that CI and the long run give each target.
//!
//! The allocator of the test binary notes the largest single allocation, on each thread and
//! across all of them: a reader that trusts a length or a count from its input asks for that
//! much at once, which is what the targets bound. An allocation over [`REFUSED_ABOVE`] is
//! refused outright (the test binary aborts, naming the size), so that such a bug cannot take
//! the memory of a shared machine before the assertion sees it.
#![allow(dead_code)] // each target uses part of it

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::test_runner::Config;

/// Allocations larger than this are refused: no input of any target comes near it.
pub const REFUSED_ABOVE: usize = 1 << 30;

/// The system allocator, noting the largest allocation asked for.
struct Tracking;

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// The largest allocation on the threads of the measurement across threads under way.
static LARGEST_OF_THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Const-initialized and without a destructor: reading them never allocates.
    static LARGEST_HERE: Cell<usize> = const { Cell::new(0) };
    static MEASURED: Cell<bool> = const { Cell::new(false) };
}

/// One measurement across threads at a time (see [`largest_allocation_of_threads`]).
static MEASURING: Mutex<()> = Mutex::new(());

fn note(size: usize) -> bool {
    let _ = LARGEST_HERE.try_with(|largest| largest.set(largest.get().max(size)));
    if MEASURED.try_with(Cell::get).unwrap_or(false) {
        LARGEST_OF_THREADS.fetch_max(size, Ordering::Relaxed);
    }
    size <= REFUSED_ABOVE
}

// SAFETY: every call is forwarded unchanged to `System`, or refused with a null pointer (which
// `GlobalAlloc` allows); only counters are updated around it.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note(new_size) {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` on this thread; returns what it returned and the largest single allocation it made
/// on this thread.
pub fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LARGEST_HERE.with(|largest| largest.replace(0));
    let out = f();
    let largest = LARGEST_HERE.with(|largest| largest.replace(before.max(largest.get())));
    (out, largest)
}

/// Runs `f`, which may start threads that call [`join_measurement`] first; returns what it
/// returned and the largest single allocation made on this thread and on those meanwhile.
/// Measurements of this kind in one test binary take turns.
pub fn largest_allocation_of_threads<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let _turn = MEASURING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    LARGEST_OF_THREADS.store(0, Ordering::Relaxed);
    MEASURED.with(|m| m.set(true));
    let out = f();
    MEASURED.with(|m| m.set(false));
    (out, LARGEST_OF_THREADS.load(Ordering::Relaxed))
}

/// Counts the calling thread's allocations in the measurement across threads under way (call
/// it first thing on a thread that `f` of [`largest_allocation_of_threads`] starts).
pub fn join_measurement() {
    MEASURED.with(|m| m.set(true));
}

/// The most a reader may allocate at once for an input of `len` bytes: a fixed allowance for
/// its own buffers and tables, and a few times the input (copies of it, a decoded form).
pub fn allowance(len: usize, fixed: usize) -> usize {
    fixed + 16 * len
}

/// proptest's configuration for a target: `ci_cases` cases unless `PROPTEST_CASES` says
/// otherwise (the long run, docs/reliability.md).
pub fn cases(ci_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(ci_cases);
    Config { cases, ..Config::default() }
}

#[test]
fn a_large_allocation_is_measured_on_its_thread_and_on_the_threads_that_join() {
    let (len, here) = largest_allocation(|| vec![0u8; 3 << 20].len());
    assert_eq!(len, 3 << 20);
    assert!(here >= 3 << 20, "{here}");
    let (_, threads) = largest_allocation_of_threads(|| {
        std::thread::spawn(|| {
            join_measurement();
            vec![1u8; 5 << 20].len()
        })
        .join()
    });
    assert!(threads >= 5 << 20, "{threads}");
    let (_, not_joined) = largest_allocation_of_threads(|| std::thread::spawn(|| vec![1u8; 5 << 20].len()).join());
    assert!(not_joined < 1 << 20, "a thread that did not join is not counted: {not_joined}");
    let (_, small) = largest_allocation(|| vec![0u8; 100].len());
    assert!(small < 1 << 20, "only this closure's allocations count: {small}");
}
