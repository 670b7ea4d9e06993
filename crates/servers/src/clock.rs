//! Wall-clock time behind a trait, so health timeouts can be tested by moving a fake clock
//! instead of sleeping.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// A source of the current wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug)]
pub struct FakeClock {
    now: Mutex<SystemTime>,
}

impl FakeClock {
    /// A fake clock standing at `start`.
    pub fn new(start: SystemTime) -> Self {
        Self { now: Mutex::new(start) }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        *now += by;
    }

    /// Puts the clock at `to`.
    pub fn set(&self, to: SystemTime) {
        *self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = to;
    }
}

impl Clock for FakeClock {
    fn now(&self) -> SystemTime {
        *self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
