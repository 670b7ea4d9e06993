//! Streaming lists, and the fall back to list + watch when a server does not finish one.
//!
//! A streaming list (KEP-3157: a watch with `sendInitialEvents=true`) is only done once its
//! `k8s.io/initial-events-end` bookmark arrives. Real servers fail one in many ways: refused at
//! the start (`422` with the WatchList feature off, `403`, `5xx` from a proxy), accepted and then
//! answered with an ERROR event inside the watch (kube-apiserver 1.36 on etcd 3.5: `500`,
//! "... the required storage feature RequestWatchProgress is disabled"), closed before the
//! bookmark, or `sendInitialEvents` silently ignored (the objects come, the bookmark never does).
//! Like client-go's reflector ("making progress is better than deadlocking"), any of these makes
//! the kind list and watch instead ([`ListMode::WatchCache`](crate::ListMode::WatchCache)),
//! logged once with the reason and counted ([`SourceStats::streaming_fallbacks`]).
//!
//! Only failures at the start that say nothing about streaming are retried as a streaming list:
//! no answer at all (the server is down: a list would fail the same way), `429` (client-go
//! retries both too), and `401`/`403`: a list and a watch are authorized alike, and a
//! kube-apiserver that was just restarted denies kube-proxy's own identity for a moment while its
//! RBAC caches fill (seen against v1.36.2: a relist after a restart refused `403`; falling back
//! then would have given up streaming for half an hour over nothing). Those are retried only
//! while they last less than the progress bound; then they fall back too. So no path retries for
//! ever what an ordinary list would do.
//!
//! When streaming is tried again: client-go tries a streaming list at every relist and forgets a
//! failure at once. kproxy remembers it: a kind that fell back tries streaming again at the first
//! relist (`410 Gone`, …) that comes at least [`STREAMING_RETRY_AFTER`] after the failure. What
//! makes streaming fail (a feature gate, the etcd version, a proxy) changes with an upgrade of the
//! control plane, not between two relists, and a relist is a recovery that a known failure
//! should not slow down (a server that ignores `sendInitialEvents` would cost the whole progress
//! bound each time); yet an upgraded control plane is used without restarting kproxy.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kproxy_state::Kind;
use kube::Api;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;

use crate::raw::{ApiKind, Decoded};
use crate::relist::relisting;
use crate::request::ContentTypes;
use crate::stats::SourceStats;
use crate::watch::{RetryBackoff, WatchEvent, WatchEvents, with_backoff};
use crate::watcher::{Strategy, watcher};

/// How long a streaming list may go without making progress (an answer to its request, an
/// event) before its `k8s.io/initial-events-end` bookmark, before the kind falls back.
/// kube-apiserver streams the initial events from its watch cache without pause, after waiting
/// at most a few seconds for the cache to be fresh: a minute of silence means the bookmark is
/// not coming (a server that ignores `sendInitialEvents`). The bound is on silence, not on the
/// whole listing: such a server on a busy cluster sends live changes after the objects, and the
/// kind then falls back when that watch ends without the bookmark (its `timeoutSeconds`).
pub const INITIAL_EVENTS_TIMEOUT: Duration = Duration::from_secs(60);

/// After a fallback, the first relist at least this long after the failure tries a streaming
/// list again.
pub const STREAMING_RETRY_AFTER: Duration = Duration::from_secs(30 * 60);

/// The bounds of [`lists`]; [`INITIAL_EVENTS_TIMEOUT`] and [`STREAMING_RETRY_AFTER`] unless
/// a test shortens them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) progress: Duration,
    pub(crate) retry_after: Duration,
}

/// Where a streaming watcher stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its next step starts a streaming list. `retrying_since`: when the current streak of start
    /// failures that say nothing about streaming began.
    Starting { retrying_since: Option<Instant> },
    /// The initial events are arriving.
    Initial,
    /// The bookmark came; watching (a broken watch resumes from its resource version).
    Watching,
}

/// What the source does for one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Streaming(Phase),
    /// Lists and watches since a streaming list failed at `failed_at`; `listed` once a listing
    /// has completed (a later `Init` is a relist).
    ListWatch {
        failed_at: Instant,
        listed: bool,
    },
}

/// The events of `api`'s objects: streaming lists, falling back to list + watch as the module
/// documentation says.
pub(crate) fn lists<K: ApiKind>(
    api: Api<Decoded<K>>,
    config: watcher::Config,
    accept: ContentTypes,
    backoff: RetryBackoff,
    bounds: Bounds,
    stats: Arc<SourceStats>,
) -> WatchEvents<K> {
    let events = watch_events(&api, &config, &accept, backoff, Strategy::Streaming);
    let lists = Lists { api, config, accept, backoff, bounds, stats, events, mode: Mode::Streaming(Phase::STARTING) };
    futures::stream::unfold(lists, |mut lists| async move {
        let event = lists.next().await?;
        Some((event, lists))
    })
    .boxed()
}

impl Phase {
    const STARTING: Phase = Phase::Starting { retrying_since: None };
}

struct Lists<K: ApiKind> {
    api: Api<Decoded<K>>,
    config: watcher::Config,
    accept: ContentTypes,
    backoff: RetryBackoff,
    bounds: Bounds,
    stats: Arc<SourceStats>,
    /// The current watcher.
    events: WatchEvents<K>,
    mode: Mode,
}

/// A watcher of `strategy` that relists after it ends, retried with `backoff`.
fn watch_events<K: ApiKind>(
    api: &Api<Decoded<K>>,
    config: &watcher::Config,
    accept: &ContentTypes,
    backoff: RetryBackoff,
    strategy: Strategy,
) -> WatchEvents<K> {
    let (api, config, accept) = (api.clone(), config.clone(), accept.clone());
    let start = move || watcher(api.clone(), config.clone(), strategy, accept.clone()).boxed();
    with_backoff(relisting(start), backoff)
}

impl<K: ApiKind> Lists<K> {
    async fn next(&mut self) -> Option<WatchEvent<K>> {
        loop {
            let events = &mut self.events;
            let event = match self.mode {
                Mode::Streaming(Phase::Starting { .. } | Phase::Initial) => {
                    match tokio::time::timeout(self.bounds.progress, events.next()).await {
                        Ok(event) => event?,
                        Err(_) => {
                            let reason =
                                format!("no initial-events-end bookmark: nothing came for {:?}", self.bounds.progress);
                            self.fall_back(&reason);
                            continue;
                        }
                    }
                }
                _ => events.next().await?,
            };
            match &mut self.mode {
                Mode::Streaming(phase) => {
                    if let Some(reason) = judge(phase, &event, Instant::now(), self.bounds.progress) {
                        self.fall_back(&reason);
                        continue;
                    }
                }
                Mode::ListWatch { failed_at, listed } => match event {
                    Ok(Event::Init) if *listed && failed_at.elapsed() >= self.bounds.retry_after => {
                        // A relist, long enough after the failure: as a streaming list. The
                        // list + watch watcher is dropped before it sends its list request.
                        tracing::info!(kind = %K::KIND, "relisting: trying a streaming list again");
                        self.mode = Mode::Streaming(Phase::STARTING);
                        self.events =
                            watch_events(&self.api, &self.config, &self.accept, self.backoff, Strategy::Streaming);
                        continue;
                    }
                    Ok(Event::InitDone) => *listed = true,
                    _ => {}
                },
            }
            return Some(event);
        }
    }

    /// Lists and watches from now on (the failed streaming list's events are dropped; a listing
    /// it had begun starts over, which the consumer handles as any listing that broke off).
    fn fall_back(&mut self, reason: &str) {
        let kind: Kind = K::KIND;
        tracing::warn!(
            %kind,
            reason,
            retry_after = ?self.bounds.retry_after,
            "a streaming list failed before its initial-events-end bookmark; listing and watching instead \
             (streaming is tried again at a relist after retry_after)"
        );
        self.stats.count_streaming_fallback(kind);
        self.mode = Mode::ListWatch { failed_at: Instant::now(), listed: false };
        self.events = watch_events(&self.api, &self.config, &self.accept, self.backoff, Strategy::WatchCache);
    }
}

/// Follows a streaming watcher's phase through one of its events; the reason to fall back when
/// the event says the streaming list failed.
fn judge<K>(phase: &mut Phase, event: &WatchEvent<K>, now: Instant, patience: Duration) -> Option<String> {
    match (*phase, event) {
        // A second start without the bookmark: kube-runtime restarts a streaming list whose
        // stream ended, without an error.
        (Phase::Initial, Ok(Event::Init)) => Some("the stream ended before the initial-events-end bookmark".into()),
        (_, Ok(Event::Init)) => {
            *phase = Phase::Initial;
            None
        }
        (_, Ok(Event::InitDone)) => {
            *phase = Phase::Watching;
            None
        }
        (Phase::Initial, Err(error)) => Some(describe(error)),
        (Phase::Starting { retrying_since }, Err(error)) => {
            if !says_nothing_about_streaming(error) {
                return Some(describe(error));
            }
            let since = retrying_since.unwrap_or(now);
            if now.duration_since(since) >= patience {
                return Some(format!("{} (retried for {patience:?})", describe(error)));
            }
            *phase = Phase::Starting { retrying_since: Some(since) };
            None
        }
        // The watcher relists after these (a streaming list); any other error of a watch
        // resumes it from its resource version.
        (Phase::Watching, Err(watcher::Error::WatchError(status))) if status.code == 410 => {
            *phase = Phase::STARTING;
            None
        }
        (Phase::Watching, Err(watcher::Error::NoResourceVersion)) => {
            *phase = Phase::STARTING;
            None
        }
        _ => None,
    }
}

/// No answer at all (the server is down or unreachable: a list would fail the same way),
/// `429 Too Many Requests` (both what client-go's reflector retries as a streaming list), or
/// `401`/`403` (a list is authorized as a watch is; a restarted kube-apiserver denies for a
/// moment while its RBAC caches fill).
fn says_nothing_about_streaming(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(status)) => matches!(status.code, 401 | 403 | 429),
        watcher::Error::WatchStartFailed(_) => true,
        _ => false,
    }
}

/// The reason a streaming list failed, for the log.
fn describe(error: &watcher::Error) -> String {
    let status = |s: &kube::core::Status| format!("{} {}: {}", s.code, s.reason, s.message);
    match error {
        watcher::Error::WatchStartFailed(kube::Error::Api(s)) => format!("refused at the start: {}", status(s)),
        watcher::Error::WatchError(s) => format!("an ERROR event inside the watch: {}", status(s)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use kube::core::Status;

    use super::*;

    const PATIENCE: Duration = Duration::from_secs(60);

    fn api_status(code: u16) -> Box<Status> {
        Status::failure("x", "Reason").with_code(code).boxed()
    }

    fn start_refused(code: u16) -> WatchEvent<Service> {
        Err(watcher::Error::WatchStartFailed(kube::Error::Api(api_status(code))))
    }

    fn unreachable() -> WatchEvent<Service> {
        Err(watcher::Error::WatchStartFailed(kube::Error::Service("connection refused".into())))
    }

    #[test]
    fn a_start_refused_with_any_status_falls_back_but_401_403_429_and_no_answer_are_retried_for_a_while() {
        let now = Instant::now();
        for code in [400, 404, 410, 422, 500, 503] {
            let mut phase = Phase::STARTING;
            let reason = judge(&mut phase, &start_refused(code), now, PATIENCE);
            assert!(reason.as_deref().is_some_and(|r| r.contains(&code.to_string())), "{code}: {reason:?}");
        }
        for event in [start_refused(401), start_refused(403), start_refused(429), unreachable()] {
            let mut phase = Phase::STARTING;
            assert_eq!(judge(&mut phase, &event, now, PATIENCE), None);
            assert_eq!(judge(&mut phase, &event, now + PATIENCE / 2, PATIENCE), None, "still within the bound");
            let reason = judge(&mut phase, &event, now + PATIENCE, PATIENCE);
            assert!(reason.is_some_and(|r| r.contains("retried for")), "not for ever");
        }
    }

    #[test]
    fn any_failure_before_the_bookmark_falls_back() {
        let now = Instant::now();
        let started = || {
            let mut phase = Phase::STARTING;
            assert_eq!(judge::<Service>(&mut phase, &Ok(Event::Init), now, PATIENCE), None);
            assert_eq!(phase, Phase::Initial);
            phase
        };
        let error_event: WatchEvent<Service> = Err(watcher::Error::WatchError(api_status(500)));
        assert!(judge(&mut started(), &error_event, now, PATIENCE).is_some_and(|r| r.contains("ERROR event")));
        let gone: WatchEvent<Service> = Err(watcher::Error::WatchError(api_status(410)));
        assert!(judge(&mut started(), &gone, now, PATIENCE).is_some(), "even 410");
        let broken: WatchEvent<Service> =
            Err(watcher::Error::WatchFailed(kube::Error::Service("connection reset".into())));
        assert!(judge(&mut started(), &broken, now, PATIENCE).is_some());
        let restarted = judge::<Service>(&mut started(), &Ok(Event::Init), now, PATIENCE);
        assert!(restarted.is_some_and(|r| r.contains("ended before")), "closed early");
    }

    #[test]
    fn after_the_bookmark_only_a_relist_is_a_streaming_list_again() {
        let now = Instant::now();
        let mut phase = Phase::Initial;
        assert_eq!(judge::<Service>(&mut phase, &Ok(Event::InitDone), now, PATIENCE), None);
        assert_eq!(phase, Phase::Watching);
        // A broken watch, or a refused re-watch, resumes from the resource version: no fallback.
        let broken: WatchEvent<Service> = Err(watcher::Error::WatchFailed(kube::Error::Service("reset".into())));
        assert_eq!(judge(&mut phase, &broken, now, PATIENCE), None);
        assert_eq!(judge(&mut phase, &start_refused(500), now, PATIENCE), None);
        assert_eq!(
            judge::<Service>(&mut phase, &Err(watcher::Error::WatchError(api_status(500))), now, PATIENCE),
            None
        );
        assert_eq!(phase, Phase::Watching);
        // 410 Gone: the watcher relists, as a streaming list, whose start is judged again.
        assert_eq!(
            judge::<Service>(&mut phase, &Err(watcher::Error::WatchError(api_status(410))), now, PATIENCE),
            None
        );
        assert_eq!(phase, Phase::STARTING);
        assert!(judge(&mut phase, &start_refused(422), now, PATIENCE).is_some());
    }
}
