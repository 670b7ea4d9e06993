//! A token bucket in front of the API client, as client-go has (`clientConnection.qps`/`burst`).
//!
//! kube-rs has no client-side rate limiter. kube-proxy's defaults (5 qps, burst 10) matter little
//! for a watcher in steady state, but they keep a crash-looping proxy on thousands of nodes from
//! hammering the API server with relists. The limit applies to request starts: a watch counts once
//! when it is opened, not for the events it streams.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// Tokens refilled at `qps` per second up to `burst`; a request takes one.
#[derive(Debug, Clone)]
pub(crate) struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub(crate) fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        Self { qps, burst, tokens: burst, last: now }
    }

    /// Takes a token, or says how long to wait until one is there.
    pub(crate) fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// Layer adding a [`RateLimit`] to a client's service stack.
#[derive(Debug, Clone, Copy)]
pub struct RateLimitLayer {
    qps: f64,
    burst: u32,
}

impl RateLimitLayer {
    /// `qps` requests per second on average, up to `burst` at once. `qps` must be positive.
    pub fn new(qps: f32, burst: u32) -> Self {
        Self { qps: f64::from(qps), burst }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: TokenBucket::new(self.qps, self.burst, Instant::now()),
            sleep: None,
            has_token: false,
        }
    }
}

/// A service that waits for a token before each request.
pub struct RateLimit<S> {
    inner: S,
    bucket: TokenBucket,
    sleep: Option<Pin<Box<Sleep>>>,
    has_token: bool,
}

impl<S> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit").field("bucket", &self.bucket).field("has_token", &self.has_token).finish()
    }
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.try_take(Instant::now()) {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.has_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_qps() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(5.0, 3, start);
        for _ in 0..3 {
            assert_eq!(bucket.try_take(start), Ok(()));
        }
        let wait = bucket.try_take(start).unwrap_err();
        assert_eq!(wait, Duration::from_millis(200));
        assert_eq!(bucket.try_take(start + Duration::from_millis(100)).unwrap_err(), Duration::from_millis(100));
        assert_eq!(bucket.try_take(start + Duration::from_millis(200)), Ok(()));
    }

    #[test]
    fn refill_stops_at_burst() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 2, start);
        let later = start + Duration::from_secs(60);
        assert_eq!(bucket.try_take(later), Ok(()));
        assert_eq!(bucket.try_take(later), Ok(()));
        assert!(bucket.try_take(later).is_err());
    }

    #[test]
    fn zero_burst_still_allows_one() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1.0, 0, start);
        assert_eq!(bucket.try_take(start), Ok(()));
        assert!(bucket.try_take(start).is_err());
    }
}
