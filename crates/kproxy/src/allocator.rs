//! The process's allocator: mimalloc, told to give freed memory back to the kernel at once.
//!
//! glibc's allocator consolidates its free lists on a large allocation, a pause that grows with
//! the heap and showed up as a millisecond per sync at 10k Services (kproxy-bench).
//!
//! mimalloc by default gives freed pages back only after a delay, and only when some thread
//! allocates or frees again after it. An idle daemon does neither, so what a cold start or a
//! relist freed stayed resident: 355 MiB at 100k Services against 305 MiB with immediate purging,
//! same start time (`kproxy-bench daemon --services 100000`, docs/benchmarks.md).

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay`, in milliseconds. libmimalloc-sys names no constant for it; it is
/// option 15 in both mimalloc versions it bundles (v2 and v3, `include/mimalloc.h`).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc return freed memory to the kernel as soon as it is free (a purge delay of 0).
/// Call before any other thread starts.
pub fn purge_freed_memory_at_once() {
    // SAFETY: `mi_option_set` stores the value in mimalloc's option table, which is not
    // synchronized: it is called first thing in `main`, before any other thread exists.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
}
