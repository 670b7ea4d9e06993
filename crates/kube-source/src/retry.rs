//! When a failed watcher tries again.
//!
//! kube-runtime's default is client-go's reflector backoff: 0.8 s doubling up to 30 s, with
//! jitter, for every error. That is right for an API server that is overloaded (`429`, `5xx`),
//! but it makes recovery slow where retrying costs the server nothing: after a 60 s outage the
//! watchers wait up to 30 s more before they look again, and a watch that merely broke waits
//! 0.8 s. A Service proxy must converge quickly once the API server is back (kproxy's target:
//! 2 s, see docs/reliability.md), so [`RecoveryBackoff`] sorts errors by what a retry costs:
//!
//! - **the first error after ≥ 10 s of health** (a dropped connection, a `410 Gone` relist):
//!   retried at once, as client-go's reflector re-watches at once;
//! - **the API server cannot be reached** (connection refused or reset, DNS, TLS, timeouts: no
//!   response at all): every 0.5–1 s. A connection attempt costs a down server nothing, and the
//!   first one after it is back finds it;
//! - **`401`/`403`** (credentials or RBAC): every 0.5–1 s for the first two minutes of a failure
//!   streak, which covers a token rotation or a role being re-applied; then as below, so a
//!   cluster whose RBAC lacks a kind is not asked every second forever;
//! - **`410 Gone`** (the watch fell out of the server's history): every 0.5–1 s. The server
//!   answers, and the next step is the relist that recovers; measured against kube-apiserver
//!   v1.36.2, a restart's `410` came after the outage had advanced client-go's backoff, and
//!   the relist waited 6–10 s for nothing;
//! - **everything else** (`404`, `429`, `5xx`, …): client-go's backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, DefaultBackoff};

/// Health this long before an error makes its first retry immediate.
const HEALTHY: Duration = Duration::from_secs(10);
/// How long credential and permission errors are retried quickly.
const FAST_AUTH_WINDOW: Duration = Duration::from_secs(120);
/// The quick retries wait between these two, evenly spread.
const FAST_MIN: Duration = Duration::from_millis(500);
const FAST_MAX: Duration = Duration::from_millis(1000);

/// What a watcher's last error says about the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ErrorClass {
    /// No response at all.
    Unreachable = 0,
    /// `401` or `403`.
    Unauthorized = 1,
    /// Any other answer.
    Answered = 2,
    /// `410 Gone`.
    Expired = 3,
}

impl ErrorClass {
    pub(crate) fn of(error: &watcher::Error) -> ErrorClass {
        let status = match error {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => match e {
                kube::Error::Api(status) => status.code,
                _ => return ErrorClass::Unreachable,
            },
            watcher::Error::WatchError(status) => status.code,
            _ => return ErrorClass::Answered,
        };
        match status {
            401 | 403 => ErrorClass::Unauthorized,
            410 => ErrorClass::Expired,
            _ => ErrorClass::Answered,
        }
    }
}

/// The class of a watcher's last error, written where the errors are seen (the watch stream)
/// and read by the backoff, which only learns that one happened.
#[derive(Debug, Clone)]
pub(crate) struct LastError(Arc<AtomicU8>);

impl LastError {
    pub(crate) fn new() -> Self {
        Self(Arc::new(AtomicU8::new(ErrorClass::Answered as u8)))
    }

    pub(crate) fn record(&self, error: &watcher::Error) {
        self.0.store(ErrorClass::of(error) as u8, Ordering::Relaxed);
    }

    fn get(&self) -> ErrorClass {
        match self.0.load(Ordering::Relaxed) {
            0 => ErrorClass::Unreachable,
            1 => ErrorClass::Unauthorized,
            3 => ErrorClass::Expired,
            _ => ErrorClass::Answered,
        }
    }
}

/// See the module documentation.
pub(crate) struct RecoveryBackoff {
    last_error: LastError,
    client_go: DefaultBackoff,
    /// Since when events have flowed without an error (`None` while failing).
    healthy_since: Option<Instant>,
    /// When the current failure streak began.
    failing_since: Option<Instant>,
    /// Spreads the quick retries of many nodes (xorshift; no need for more).
    jitter: u64,
}

impl std::fmt::Debug for RecoveryBackoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoveryBackoff")
            .field("healthy_since", &self.healthy_since)
            .field("failing_since", &self.failing_since)
            .finish_non_exhaustive()
    }
}

impl RecoveryBackoff {
    pub(crate) fn new(last_error: LastError) -> Self {
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        Self {
            last_error,
            client_go: DefaultBackoff::default(),
            // A watcher starts as if healthy: its first failure is retried at once.
            healthy_since: Some(Instant::now() - HEALTHY),
            failing_since: None,
            jitter: seed | 1,
        }
    }

    fn quick(&mut self) -> Duration {
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let spread = (FAST_MAX - FAST_MIN).as_millis() as u64;
        FAST_MIN + Duration::from_millis(self.jitter % (spread + 1))
    }
}

impl Iterator for RecoveryBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let was_healthy = self.healthy_since.take().is_some_and(|since| since.elapsed() >= HEALTHY);
        let failing_since = *self.failing_since.get_or_insert_with(Instant::now);
        // client-go's backoff advances on every error, so it is where it would be when used.
        let client_go = self.client_go.next();
        if was_healthy {
            return Some(Duration::ZERO);
        }
        match self.last_error.get() {
            ErrorClass::Unreachable | ErrorClass::Expired => Some(self.quick()),
            ErrorClass::Unauthorized if failing_since.elapsed() < FAST_AUTH_WINDOW => Some(self.quick()),
            _ => client_go,
        }
    }
}

impl Backoff for RecoveryBackoff {
    /// An event arrived: the failure streak (if any) is over.
    fn reset(&mut self) {
        self.healthy_since.get_or_insert_with(Instant::now);
        self.failing_since = None;
        self.client_go.reset();
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api_error(code: u16) -> watcher::Error {
        watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(Status::failure("x", "y").with_code(code))))
    }

    #[test]
    fn errors_are_sorted_by_what_a_retry_costs_the_server() {
        assert_eq!(ErrorClass::of(&api_error(403)), ErrorClass::Unauthorized);
        assert_eq!(ErrorClass::of(&api_error(401)), ErrorClass::Unauthorized);
        assert_eq!(ErrorClass::of(&api_error(429)), ErrorClass::Answered);
        assert_eq!(ErrorClass::of(&api_error(404)), ErrorClass::Answered);
        let gone = watcher::Error::WatchError(Box::new(Status::failure("too old", "Expired").with_code(410)));
        assert_eq!(ErrorClass::of(&gone), ErrorClass::Expired);
        let unreachable = watcher::Error::WatchStartFailed(kube::Error::Service("client error (Connect)".into()));
        assert_eq!(ErrorClass::of(&unreachable), ErrorClass::Unreachable);
    }

    #[test]
    fn first_error_after_health_is_retried_at_once_then_by_class() {
        let last = LastError::new();
        let mut backoff = RecoveryBackoff::new(last.clone());
        last.record(&api_error(500));
        assert_eq!(backoff.next(), Some(Duration::ZERO), "a watcher's first failure");
        // A second error in the streak: client-go's backoff (0.8 s with jitter, at least 0.4 s).
        assert!(backoff.next().is_some_and(|d| d >= Duration::from_millis(400)));

        last.record(&watcher::Error::WatchStartFailed(kube::Error::Service("refused".into())));
        for _ in 0..20 {
            let delay = backoff.next().unwrap();
            assert!((FAST_MIN..=FAST_MAX).contains(&delay), "unreachable: {delay:?}");
        }
        last.record(&api_error(403));
        let delay = backoff.next().unwrap();
        assert!((FAST_MIN..=FAST_MAX).contains(&delay), "forbidden, early in the streak: {delay:?}");
        // A 410 after an outage (client-go's backoff advanced meanwhile): relisted quickly.
        for _ in 0..10 {
            backoff.next();
        }
        last.record(&watcher::Error::WatchError(Box::new(Status::failure("too old", "Expired").with_code(410))));
        let delay = backoff.next().unwrap();
        assert!((FAST_MIN..=FAST_MAX).contains(&delay), "gone: {delay:?}");
    }

    #[test]
    fn a_short_recovery_does_not_make_the_next_retry_immediate() {
        let last = LastError::new();
        let mut backoff = RecoveryBackoff::new(last.clone());
        last.record(&api_error(500));
        assert_eq!(backoff.next(), Some(Duration::ZERO));
        // One event, then an error again at once: not ≥ 10 s of health, so no immediate retry
        // (a watch that fails right after every relist must not loop hot).
        backoff.reset();
        assert_ne!(backoff.next(), Some(Duration::ZERO));
    }
}
