//! Following the manifest directory: file events (inotify) trigger a re-read after a short quiet
//! period, and only the difference from the last snapshot is emitted.
//!
//! Re-reading the whole directory is simple and cheap: unchanged files are recognized by their
//! bytes and not parsed again. Where file events are unavailable (or `poll` is set) the directory
//! is simply re-read every `poll_interval`. This is kproxy's own polling rather than notify's
//! `PollWatcher` on purpose: a poller that compares the directory with *its own* last scan misses
//! a file created and removed between two scans, while a re-read compares with the state kproxy
//! last emitted, so it never does. A slower periodic re-read backs up the event watcher too, which
//! can miss events on some filesystems (NFS, some overlays) or stop when the directory is replaced.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kproxy_state::Change;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::error::{ManifestError, SourceError};
use super::snapshot::{Snapshot, load};

/// How the directory is followed.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Quiet period after the last file event before re-reading, so an editor's save (truncate,
    /// write, rename) or a `cp -r` of many files becomes one update.
    pub debounce: Duration,
    /// Re-read the directory every `poll_interval` instead of using file events.
    pub poll: bool,
    /// How often the directory is re-read when polling (forced, or because file events are
    /// unavailable).
    pub poll_interval: Duration,
    /// Re-read the directory this often even with file events, as a safety net.
    pub rescan_interval: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            debounce: Duration::from_millis(100),
            poll: false,
            poll_interval: Duration::from_secs(1),
            rescan_interval: Duration::from_secs(60),
        }
    }
}

/// Upper bound on the wait for a quiet period, so a directory that is written continuously still
/// gets read.
const MAX_DEBOUNCE_ROUNDS: u32 = 10;

/// A manifest directory and the last snapshot read from it.
#[derive(Debug)]
pub struct ManifestSource {
    options: WatchOptions,
    snapshot: Snapshot,
}

impl ManifestSource {
    /// Reads `dir` (an unreadable directory is an error; bad files are not, see
    /// [`Snapshot::errors`]).
    pub fn open(dir: impl Into<PathBuf>, options: WatchOptions) -> Result<Self, SourceError> {
        let snapshot = load(&dir.into())?;
        Ok(Self { options, snapshot })
    }

    /// The last snapshot read.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Follows the directory until `changes`' receiver is dropped. First reports the current
    /// errors to `on_error` and sends [`Snapshot::initial_changes`]; then, after every change on
    /// disk, `Applied`/`Deleted` events for what changed, and each error not reported before.
    /// Skipped manifests are only logged at debug level here: `on_error` is expected to report
    /// them (log, metric, event).
    pub async fn run<F>(mut self, changes: mpsc::Sender<Change>, mut on_error: F) -> Result<(), SourceError>
    where
        F: FnMut(&ManifestError) + Send,
    {
        let dir = self.snapshot.dir().to_path_buf();
        let (wake_tx, mut wake) = mpsc::channel::<()>(1);
        // Start watching before the first re-read, so nothing written meanwhile is missed.
        let mut watcher = start_watcher(&dir, &self.options, &wake_tx);

        let mut reported = HashSet::new();
        report_new(&self.snapshot, &mut reported, &mut on_error);
        for change in self.snapshot.initial_changes() {
            if changes.send(change).await.is_err() {
                return Ok(());
            }
        }

        let mut tick = tokio::time::interval(self.options.poll_interval.min(self.options.rescan_interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        let mut last_read = Instant::now();
        let mut pending = true; // re-read once now: the files may have changed since `open`
        loop {
            if !pending {
                tokio::select! {
                    _ = changes.closed() => return Ok(()),
                    Some(()) = wake.recv() => {
                        self.debounce(&mut wake).await;
                        pending = true;
                    }
                    _ = tick.tick() => {
                        let every = if watcher.is_some() { self.options.rescan_interval } else { self.options.poll_interval };
                        pending = last_read.elapsed() >= every;
                    }
                }
                if !pending {
                    continue;
                }
            }
            pending = false;
            last_read = Instant::now();

            let previous = self.snapshot;
            let result = tokio::task::spawn_blocking(move || {
                let next = previous.reload_if_changed();
                (previous, next)
            })
            .await;
            let (previous, next) = match result {
                Ok(pair) => pair,
                Err(join) => {
                    // Reading files panicked: a bug. Stop rather than serve a state we lost.
                    tracing::error!(error = %join, "re-reading the manifest directory failed");
                    return Err(SourceError::ReadDir { dir, source: std::io::Error::other(join.to_string()) });
                }
            };
            match next {
                Ok(None) => self.snapshot = previous,
                Ok(Some(next)) => {
                    report_new(&next, &mut reported, &mut on_error);
                    let diff = next.changes_since(&previous);
                    self.snapshot = next;
                    if !diff.is_empty() {
                        tracing::info!(changes = diff.len(), dir = %dir.display(), "manifest directory changed");
                    }
                    for change in diff {
                        if changes.send(change).await.is_err() {
                            return Ok(());
                        }
                    }
                }
                Err(e) => {
                    // The directory vanished or became unreadable: keep serving the last state,
                    // and watch it again once it is back (the old watch died with it).
                    tracing::warn!(error = %e, "keeping the last state of the manifest directory");
                    let error = ManifestError::new(&dir, None, e.to_string());
                    if reported.insert(error.clone()) {
                        on_error(&error);
                    }
                    watcher = None;
                    self.snapshot = previous;
                    continue;
                }
            }
            reported.retain(|e| e.file != dir);
            if watcher.is_none() && !self.options.poll {
                watcher = start_watcher(&dir, &self.options, &wake_tx);
            }
        }
    }

    /// Waits until no event came for `debounce` (bounded), swallowing the events.
    async fn debounce(&self, wake: &mut mpsc::Receiver<()>) {
        for _ in 0..MAX_DEBOUNCE_ROUNDS {
            match tokio::time::timeout(self.options.debounce, wake.recv()).await {
                Ok(Some(())) => continue,
                Ok(None) | Err(_) => return,
            }
        }
    }
}

/// Reads `dir` and follows it with default [`WatchOptions`]; see [`ManifestSource::run`].
pub async fn watch<F>(dir: impl Into<PathBuf>, changes: mpsc::Sender<Change>, on_error: F) -> Result<(), SourceError>
where
    F: FnMut(&ManifestError) + Send,
{
    ManifestSource::open(dir, WatchOptions::default())?.run(changes, on_error).await
}

/// Reports (to the callback and the log) the errors of `snapshot` not reported yet. Errors that
/// went away are forgotten, so an error that comes back is reported again.
fn report_new<F: FnMut(&ManifestError)>(snapshot: &Snapshot, reported: &mut HashSet<ManifestError>, on_error: &mut F) {
    let current: HashSet<&ManifestError> = snapshot.errors().iter().collect();
    reported.retain(|e| current.contains(e));
    for error in snapshot.errors() {
        if reported.insert(error.clone()) {
            // The callback is the reporting channel (it usually logs); avoid saying it twice.
            tracing::debug!(%error, "skipping manifest");
            on_error(error);
        }
    }
}

/// The platform's file-event watcher, or `None` (then the directory is polled) when polling is
/// asked for or file events are unavailable.
fn start_watcher(dir: &Path, options: &WatchOptions, wake: &mpsc::Sender<()>) -> Option<notify::RecommendedWatcher> {
    if options.poll {
        return None;
    }
    let wake = wake.clone();
    let handler = move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            // Our own reads open files: only the end of a write matters among accesses.
            Ok(event) => match event.kind {
                EventKind::Access(notify::event::AccessKind::Close(notify::event::AccessMode::Write)) => true,
                EventKind::Access(_) => false,
                _ => true,
            },
            Err(e) => {
                tracing::warn!(error = %e, "file watcher error; re-reading the directory");
                true
            }
        };
        if relevant {
            // A full channel already holds a wake-up: nothing is lost.
            let _ = wake.try_send(());
        }
    };
    let watcher =
        notify::recommended_watcher(handler).and_then(|mut w| w.watch(dir, RecursiveMode::NonRecursive).map(|()| w));
    match watcher {
        Ok(watcher) => Some(watcher),
        Err(e) => {
            tracing::warn!(error = %e, dir = %dir.display(), interval = ?options.poll_interval, "file events unavailable; polling");
            None
        }
    }
}
