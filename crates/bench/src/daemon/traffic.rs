//! Real TCP traffic from the client pod: connection rates, and a prober that connects
//! continuously while kproxy is restarted.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kproxy_testbed::{Netns, NsThread};
use serde::{Deserialize, Serialize};

/// One new connection: connect, read the backend's one-line answer, close. True when `backend`
/// answered.
fn connect_once(dest: SocketAddr, backend: &str, timeout: Duration) -> bool {
    attempt(dest, backend, timeout).is_ok()
}

/// One new connection as [`connect_once`]; a failure says what went wrong (`connect: refused`,
/// `read: timed out`, `another backend answered`...).
fn attempt(dest: SocketAddr, backend: &str, timeout: Duration) -> Result<(), String> {
    let kind = |stage: &str, e: std::io::Error| format!("{stage}: {}", e.kind());
    let mut stream = TcpStream::connect_timeout(&dest, timeout).map_err(|e| kind("connect", e))?;
    stream.set_read_timeout(Some(timeout)).map_err(|e| kind("read", e))?;
    let mut answer = String::new();
    // The backend writes its line and closes.
    stream.read_to_string(&mut answer).map_err(|e| kind("read", e))?;
    if answer.split_whitespace().next() == Some(backend) { Ok(()) } else { Err("another backend answered".into()) }
}

/// New connections per second, through the ClusterIP and straight to the pod.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct ConnectionRates {
    /// Straight to the pod's address, connections per second.
    pub direct: f64,
    /// To the ClusterIP, connections per second.
    pub cluster_ip: f64,
    /// Failed connections (either way; a healthy run has none).
    pub failed: u64,
}

/// Connects back to back from `client` for `phase` to `direct`, then `phase` to `cluster_ip`,
/// twice over (alternating, so drift on the machine hits both alike); one thread, one
/// connection at a time.
pub fn connection_rates(
    client: &Netns,
    direct: SocketAddr,
    cluster_ip: SocketAddr,
    backend: &str,
    phase: Duration,
) -> anyhow::Result<ConnectionRates> {
    let backend = backend.to_owned();
    let rates = client.run_in(move || {
        let mut ok = [0u64; 2];
        let mut spent = [Duration::ZERO; 2];
        let mut failed = 0;
        for round in 0..4 {
            let which = round % 2;
            let dest = if which == 0 { direct } else { cluster_ip };
            let start = Instant::now();
            while start.elapsed() < phase {
                if connect_once(dest, &backend, Duration::from_secs(1)) {
                    ok[which] += 1;
                } else {
                    failed += 1;
                }
            }
            spent[which] += start.elapsed();
        }
        ConnectionRates {
            direct: ok[0] as f64 / spent[0].as_secs_f64(),
            cluster_ip: ok[1] as f64 / spent[1].as_secs_f64(),
            failed,
        }
    })?;
    Ok(rates)
}

/// What the continuous prober saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ProbeLog {
    /// Each attempt: its start (since the prober started) and whether the backend answered.
    pub attempts: Vec<(Duration, bool)>,
    /// How the failed attempts failed, and how many of each.
    #[serde(default)]
    pub failures: std::collections::BTreeMap<String, usize>,
}

impl ProbeLog {
    /// Failed attempts.
    pub fn failed(&self) -> usize {
        self.attempts.iter().filter(|(_, ok)| !ok).count()
    }

    /// The longest time from a failed attempt's start to the next successful attempt's start
    /// (or the end of the log), zero when nothing failed.
    pub fn longest_outage(&self) -> Duration {
        let mut longest = Duration::ZERO;
        let mut down_since = None;
        for &(at, ok) in &self.attempts {
            match (ok, down_since) {
                (false, None) => down_since = Some(at),
                (true, Some(since)) => {
                    longest = longest.max(at - since);
                    down_since = None;
                }
                _ => {}
            }
        }
        if let (Some(since), Some(&(last, _))) = (down_since, self.attempts.last()) {
            longest = longest.max(last - since);
        }
        longest
    }
}

/// Connects to `dest` from `client` every `interval` (or back to back when an attempt takes
/// longer) until stopped.
#[derive(Debug)]
pub struct Prober {
    /// When probing began (attempt times count from here).
    pub started: Instant,
    stop: Arc<AtomicBool>,
    thread: NsThread<ProbeLog>,
}

impl Prober {
    pub fn start(client: &Netns, dest: SocketAddr, backend: &str, interval: Duration) -> anyhow::Result<Prober> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let backend = backend.to_owned();
        let started = Instant::now();
        let thread = client.spawn_in("restart-prober", move || {
            let mut log = ProbeLog::default();
            let start = started;
            while !flag.load(Ordering::Relaxed) {
                let at = start.elapsed();
                let result = attempt(dest, &backend, Duration::from_millis(250));
                if let Err(kind) = &result {
                    *log.failures.entry(kind.clone()).or_default() += 1;
                    // Wall-clock time, to line a failure up with kproxy's log.
                    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                    eprintln!("  probe to {dest} failed at unix {:.3} s: {kind}", unix.as_secs_f64());
                }
                log.attempts.push((at, result.is_ok()));
                if let Some(rest) = (at + interval).checked_sub(start.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
            log
        })?;
        Ok(Prober { started, stop, thread })
    }

    pub fn stop(self) -> anyhow::Result<ProbeLog> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.thread.join()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_outage_runs_from_the_first_failure_to_the_next_success() {
        let ms = Duration::from_millis;
        let log = ProbeLog {
            failures: Default::default(),
            attempts: vec![
                (ms(0), true),
                (ms(5), false),
                (ms(10), false),
                (ms(40), true),
                (ms(45), false),
                (ms(50), true),
            ],
        };
        assert_eq!(log.failed(), 3);
        assert_eq!(log.longest_outage(), ms(35));
        let clean = ProbeLog { attempts: vec![(ms(0), true), (ms(5), true)], ..Default::default() };
        assert_eq!(clean.longest_outage(), Duration::ZERO);
        let ends_down =
            ProbeLog { attempts: vec![(ms(0), true), (ms(5), false), (ms(60), false)], ..Default::default() };
        assert_eq!(ends_down.longest_outage(), ms(55));
    }
}
