//! A long-lived UDP client that keeps sending from one fixed source address and port.
//!
//! Stale-conntrack tests need exactly this: a flow whose conntrack entry outlives an endpoint
//! change, so that the test can observe whether the dataplane cleared the entry (the next
//! datagram reaches the new backend) or not (it keeps going to the old one, or vanishes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::error::{Result, TestbedError};
use crate::netns::{Netns, panic_message};
use crate::probe::{ProbeResult, Proto, exchange_datagram};
use crate::socket::new_client_socket;

#[derive(Debug, Default)]
struct Log {
    results: Mutex<Vec<ProbeResult>>,
    grew: Condvar,
}

/// A running UDP client session; stops when dropped.
#[derive(Debug)]
pub struct UdpSession {
    local: SocketAddr,
    log: Arc<Log>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpSession {
    /// Starts sending one datagram to `dest` every `interval` from inside `from`, bound to
    /// `source_port` (0 picks an ephemeral port that then stays fixed) on `source_ip`
    /// (`None` = any). Each datagram waits up to `interval` for its answer and its outcome is
    /// recorded.
    pub fn start(
        from: &Netns,
        source_ip: Option<IpAddr>,
        source_port: u16,
        dest: SocketAddr,
        interval: Duration,
    ) -> Result<UdpSession> {
        if interval.is_zero() {
            return Err(TestbedError::Invalid("session interval must be positive".into()));
        }
        let ip = source_ip.unwrap_or(match dest {
            SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        });
        let bind = SocketAddr::new(ip, source_port);
        let socket = from.run_in(move || -> Result<Socket> {
            let socket = new_client_socket(Proto::Udp, &dest)?;
            socket.set_reuse_address(true).map_err(|e| TestbedError::io("setting SO_REUSEADDR", e))?;
            socket.bind(&bind.into()).map_err(|e| TestbedError::io(format!("binding session to {bind}"), e))?;
            socket.connect(&dest.into()).map_err(|e| TestbedError::io(format!("connecting session to {dest}"), e))?;
            Ok(socket)
        })??;
        let local = socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| TestbedError::Invalid("session socket has no IP address".into()))?;
        let udp: UdpSocket = socket.try_clone().map_err(|e| TestbedError::io("cloning socket", e))?.into();
        let log = Arc::new(Log::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (log, stop) = (Arc::clone(&log), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("udp-session-{}", local.port()))
                .spawn(move || run(&udp, &socket, dest, interval, &log, &stop))
                .map_err(|e| TestbedError::io("spawning session thread", e))?
        };
        Ok(UdpSession { local, log, stop, thread: Some(thread) })
    }

    /// The fixed local address the session sends from.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Every outcome so far, oldest first.
    pub fn results(&self) -> Vec<ProbeResult> {
        self.log.results.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The newest outcome.
    pub fn latest(&self) -> Option<ProbeResult> {
        self.log.results.lock().unwrap_or_else(PoisonError::into_inner).last().cloned()
    }

    /// Forgets the outcomes recorded so far.
    pub fn clear(&self) {
        self.log.results.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Waits until an outcome recorded after this call satisfies `pred` and returns it, or
    /// `None` after `timeout`.
    pub fn wait_for(&self, timeout: Duration, pred: impl Fn(&ProbeResult) -> bool) -> Option<ProbeResult> {
        let deadline = Instant::now() + timeout;
        let mut results = self.log.results.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = results.len();
        loop {
            if let Some(hit) = results[seen..].iter().find(|r| pred(r)) {
                return Some(hit.clone());
            }
            seen = results.len();
            let left = deadline.checked_duration_since(Instant::now())?;
            results = self.log.grew.wait_timeout(results, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl Drop for UdpSession {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take()
            && let Err(panic) = thread.join()
        {
            tracing::warn!(panic = %panic_message(&*panic), "UDP session thread panicked");
        }
    }
}

fn run(udp: &UdpSocket, raw: &Socket, dest: SocketAddr, interval: Duration, log: &Log, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let result = match exchange_datagram(udp, raw, dest, interval) {
            Ok(result) => result,
            Err(e) => {
                tracing::warn!(error = %e, "UDP session exchange failed");
                ProbeResult::Unreachable
            }
        };
        log.results.lock().unwrap_or_else(PoisonError::into_inner).push(result);
        log.grew.notify_all();
        if let Some(rest) = interval.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}
