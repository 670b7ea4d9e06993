//! Keeps the flowtable's devices in line with the node's links: a thread that listens to
//! rtnetlink link events, refreshes at most once per `min_interval` (a burst of pod creations
//! costs one refresh), and re-reads the links every `resync_every` regardless, in case an event
//! was lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::accelerator::Accelerator;
use crate::error::AccelError;
use crate::exec::AccelKernel;
use crate::links::LinkEvents;

/// Pacing of device refreshes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchOptions {
    /// At most one refresh per this interval.
    pub min_interval: Duration,
    /// Refresh at least this often, even without events.
    pub resync_every: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions { min_interval: Duration::from_secs(1), resync_every: Duration::from_secs(60) }
    }
}

/// The running watcher; stops (and joins its thread) on drop or [`LinkWatcher::stop`].
#[derive(Debug)]
pub struct LinkWatcher {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl LinkWatcher {
    /// Subscribes to link events in the calling thread's network namespace and starts the
    /// watcher thread (which inherits that namespace, so the `nft` it runs acts there too).
    pub fn spawn<K: AccelKernel + 'static>(
        accelerator: Arc<Mutex<Accelerator<K>>>,
        options: WatchOptions,
    ) -> Result<LinkWatcher, AccelError> {
        let mut events = LinkEvents::subscribe()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kproxy-accel-links".into())
            .spawn(move || {
                let poll = options.min_interval.min(Duration::from_millis(200));
                let mut dirty = false;
                let mut last_refresh = Instant::now();
                while !stopping.load(Ordering::Relaxed) {
                    match events.wait(poll) {
                        Ok(0) => {}
                        Ok(_) => dirty = true,
                        Err(error) => {
                            tracing::warn!(%error, "reading link events");
                            dirty = true;
                        }
                    }
                    let since = last_refresh.elapsed();
                    if (dirty && since >= options.min_interval) || since >= options.resync_every {
                        last_refresh = Instant::now();
                        dirty = false;
                        let mut accelerator = accelerator.lock().unwrap_or_else(PoisonError::into_inner);
                        if let Err(error) = accelerator.refresh_devices() {
                            tracing::warn!(%error, "refreshing flowtable devices");
                        }
                    }
                }
            })
            .map_err(AccelError::Netlink)?;
        Ok(LinkWatcher { stop, thread: Some(thread) })
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LinkWatcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}
