//! Real client traffic from any namespace, reduced to the verdict a packet test asserts on:
//! which backend answered and which source address it saw, or how the connection failed.
//!
//! Backends ([`crate::EchoServer`]) answer every TCP/SCTP connection and every UDP datagram
//! with one line `<backend> <peer-ip> <peer-port>\n`, so one probe tells both where the packet
//! went (DNAT) and what it looked like on arrival (SNAT / masquerade).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::error::{Result, TestbedError};
use crate::netns::Netns;
use crate::socket::{classify_failure, new_client_socket};

/// How long a probe waits before calling a silent destination dropped. Short enough that a
/// suite of dozens of cases stays fast; a veth/bridge round trip takes well under a millisecond.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// How long a probe that must be answered may wait: a hang guard, not a speed bound. An answer
/// between namespaces of one machine takes about 0.1 ms on the idle host, yet a loaded 2-core
/// host or the guest under TCG has held one back for over 2 s (an SCTP ClusterIP probe in the
/// guest, 2026-12-06, beside a build). A path that drops still fails; it only fails later. What
/// this cannot tell apart is a first packet dropped and its retransmission answered (TCP after
/// 1 s, SCTP after 3 s): the tests that mean that (a reused port's first INIT) bound it
/// explicitly.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a probe that must *not* be answered waits before it counts a drop: short, since a
/// slow machine can only make such a probe pass (and each such test shows in the same sandbox
/// that the path answers when allowed); longer in the guest, where everything runs about 8 times
/// slower under emulation.
pub fn drop_window() -> Duration {
    if crate::kernel::in_guest() { Duration::from_millis(2000) } else { Duration::from_millis(700) }
}

/// Transport protocol of a probe or a backend port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
    /// Needs a kernel with SCTP sockets (the guest kernel); on the host kernel serving or
    /// probing SCTP fails with [`TestbedError::SctpUnsupported`].
    Sctp,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        })
    }
}

/// What happened to one probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeResult {
    /// A backend answered; `seen_source` is the client address as the backend saw it.
    Answered { backend: String, seen_source: IpAddr },
    /// Rejected: TCP RST, ICMP port unreachable or ICMP administratively prohibited.
    Refused,
    /// Any other ICMP error, or no route.
    Unreachable,
    /// No answer within the timeout: the packet was dropped.
    TimedOut,
}

impl ProbeResult {
    /// The answering backend, if any.
    pub fn backend(&self) -> Option<&str> {
        match self {
            ProbeResult::Answered { backend, .. } => Some(backend),
            _ => None,
        }
    }
}

/// Knobs for a probe beyond protocol and destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOptions {
    /// How long to wait for the connection and the answer.
    pub timeout: Duration,
    /// Bind the client to this address first (for example a pod's own IP in hairpin tests, or
    /// a fixed source port). Port 0 picks an ephemeral port.
    pub bind: Option<SocketAddr>,
}

impl Default for ProbeOptions {
    fn default() -> Self {
        ProbeOptions { timeout: DEFAULT_PROBE_TIMEOUT, bind: None }
    }
}

impl ProbeOptions {
    /// Default options with another timeout.
    pub fn with_timeout(timeout: Duration) -> Self {
        ProbeOptions { timeout, ..ProbeOptions::default() }
    }

    /// For probes that must be answered (refused counts as an answer): [`ANSWER_TIMEOUT`].
    pub fn must_answer() -> Self {
        ProbeOptions::with_timeout(ANSWER_TIMEOUT)
    }

    /// For probes that must be dropped: [`drop_window`].
    pub fn must_drop() -> Self {
        ProbeOptions::with_timeout(drop_window())
    }
}

/// Sends one probe from inside `from` to `dest`.
pub fn probe(from: &Netns, proto: Proto, dest: SocketAddr, timeout: Duration) -> Result<ProbeResult> {
    probe_with(from, proto, dest, &ProbeOptions::with_timeout(timeout))
}

/// Sends one probe from inside `from` to `dest` with explicit options.
pub fn probe_with(from: &Netns, proto: Proto, dest: SocketAddr, options: &ProbeOptions) -> Result<ProbeResult> {
    let options = *options;
    from.run_in(move || probe_here(proto, dest, &options))?
}

/// Sends `n` probes (each a new connection / a new UDP socket, hence a new conntrack entry)
/// from inside `from` to `dest` and counts the outcomes.
pub fn probe_many(from: &Netns, proto: Proto, dest: SocketAddr, n: usize, options: &ProbeOptions) -> Result<Tally> {
    let options = *options;
    from.run_in(move || {
        let mut tally = Tally::default();
        for _ in 0..n {
            let mut options = options;
            if proto == Proto::Sctp && options.bind.is_none_or(|b| b.port() == 0) {
                // An SCTP INIT from the port of a just-closed association is held back by
                // conntrack and only retransmitted after 3 s: give every SCTP probe a fresh port.
                let ip = options.bind.map(|b| b.ip()).unwrap_or(if dest.is_ipv4() {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                });
                options.bind = Some(SocketAddr::new(ip, fresh_sctp_port()));
            }
            tally.record(probe_here(proto, dest, &options)?);
        }
        Ok(tally)
    })?
}

/// A source port no earlier SCTP probe of this process used (below the kernel's ephemeral range,
/// so it never collides with ports the kernel picks).
fn fresh_sctp_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Processes running at the same time start at different offsets.
    let offset = std::process::id().wrapping_mul(2_654_435_761) % SPAN;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (FIRST + (offset + n) % SPAN) as u16
}

/// Outcomes of many probes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Answers per backend name.
    pub backends: BTreeMap<String, usize>,
    /// Answers per source address the backends saw.
    pub seen_sources: BTreeMap<IpAddr, usize>,
    pub refused: usize,
    pub unreachable: usize,
    pub timed_out: usize,
}

impl Tally {
    /// Adds one outcome.
    pub fn record(&mut self, result: ProbeResult) {
        match result {
            ProbeResult::Answered { backend, seen_source } => {
                *self.backends.entry(backend).or_default() += 1;
                *self.seen_sources.entry(seen_source).or_default() += 1;
            }
            ProbeResult::Refused => self.refused += 1,
            ProbeResult::Unreachable => self.unreachable += 1,
            ProbeResult::TimedOut => self.timed_out += 1,
        }
    }

    /// How many probes answered.
    pub fn answered(&self) -> usize {
        self.backends.values().sum()
    }

    /// How many probes were recorded.
    pub fn total(&self) -> usize {
        self.answered() + self.refused + self.unreachable + self.timed_out
    }

    /// Answer counts for exactly these backends, in this order (0 for a backend that never
    /// answered) — the input for [`crate::chi_square_uniform`].
    pub fn counts_for(&self, backends: &[&str]) -> Vec<usize> {
        backends.iter().map(|b| self.backends.get(*b).copied().unwrap_or(0)).collect()
    }
}

/// Sends one probe from the namespace of the calling thread.
pub(crate) fn probe_here(proto: Proto, dest: SocketAddr, options: &ProbeOptions) -> Result<ProbeResult> {
    let socket = new_client_socket(proto, &dest)?;
    if let Some(bind) = options.bind {
        socket.set_reuse_address(true).map_err(|e| TestbedError::io("setting SO_REUSEADDR", e))?;
        socket.bind(&bind.into()).map_err(|e| TestbedError::io(format!("binding probe socket to {bind}"), e))?;
    }
    match proto {
        Proto::Tcp | Proto::Sctp => probe_stream(socket, dest, options.timeout),
        Proto::Udp => probe_datagram(socket, dest, options.timeout),
    }
}

fn probe_stream(socket: Socket, dest: SocketAddr, timeout: Duration) -> Result<ProbeResult> {
    let started = Instant::now();
    if let Err(e) = socket.connect_timeout(&dest.into(), timeout) {
        return classify_failure(&socket, e, &format!("connecting to {dest}"));
    }
    let remaining = timeout.saturating_sub(started.elapsed()).max(Duration::from_millis(1));
    socket.set_read_timeout(Some(remaining)).map_err(|e| TestbedError::io("setting read timeout", e))?;
    let mut reply = Vec::new();
    let mut stream: TcpStream = socket.try_clone().map_err(|e| TestbedError::io("cloning socket", e))?.into();
    match stream.read_to_end(&mut reply) {
        Ok(_) => parse_reply(&reply),
        Err(e) => classify_failure(&socket, e, &format!("reading answer from {dest}")),
    }
}

fn probe_datagram(socket: Socket, dest: SocketAddr, timeout: Duration) -> Result<ProbeResult> {
    if let Err(e) = socket.connect(&dest.into()) {
        return classify_failure(&socket, e, &format!("connecting UDP socket to {dest}"));
    }
    let udp: UdpSocket = socket.try_clone().map_err(|e| TestbedError::io("cloning socket", e))?.into();
    exchange_datagram(&udp, &socket, dest, timeout)
}

/// One request/answer on a connected UDP socket. `raw` is the same socket, for error-queue
/// classification.
pub(crate) fn exchange_datagram(
    udp: &UdpSocket,
    raw: &Socket,
    dest: SocketAddr,
    timeout: Duration,
) -> Result<ProbeResult> {
    udp.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
        .map_err(|e| TestbedError::io("setting read timeout", e))?;
    if let Err(e) = udp.send(b"probe\n") {
        return classify_failure(raw, e, &format!("sending to {dest}"));
    }
    let mut buf = [0u8; 512];
    match udp.recv(&mut buf) {
        Ok(n) => parse_reply(&buf[..n]),
        Err(e) => classify_failure(raw, e, &format!("receiving from {dest}")),
    }
}

/// Parses `<backend> <peer-ip> <peer-port>\n`.
fn parse_reply(reply: &[u8]) -> Result<ProbeResult> {
    let text = String::from_utf8_lossy(reply);
    let bad = || TestbedError::BadReply(text.to_string());
    let mut fields = text.trim_end_matches('\n').rsplitn(3, ' ');
    let _port: u16 = fields.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let seen_source: IpAddr = fields.next().and_then(|ip| ip.parse().ok()).ok_or_else(bad)?;
    let backend = fields.next().filter(|b| !b.is_empty()).ok_or_else(bad)?.to_owned();
    Ok(ProbeResult::Answered { backend, seen_source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_answer() {
        let parsed = parse_reply(b"pod-a 198.18.0.10 40000\n").unwrap();
        assert_eq!(
            parsed,
            ProbeResult::Answered { backend: "pod-a".into(), seen_source: "198.18.0.10".parse().unwrap() }
        );
        let v6 = parse_reply(b"b fd00:18::10 1\n").unwrap();
        assert_eq!(v6.backend(), Some("b"));
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(parse_reply(b"hello\n"), Err(TestbedError::BadReply(_))));
        assert!(matches!(parse_reply(b" 1.2.3.4 5\n"), Err(TestbedError::BadReply(_))));
        assert!(matches!(parse_reply(b"x 1.2.3.4 99999\n"), Err(TestbedError::BadReply(_))));
    }

    #[test]
    fn tally_counts() {
        let mut t = Tally::default();
        let src: IpAddr = "198.18.0.2".parse().unwrap();
        t.record(ProbeResult::Answered { backend: "a".into(), seen_source: src });
        t.record(ProbeResult::Answered { backend: "a".into(), seen_source: src });
        t.record(ProbeResult::TimedOut);
        assert_eq!(t.counts_for(&["a", "b"]), vec![2, 0]);
        assert_eq!(t.total(), 3);
        assert_eq!(t.answered(), 2);
        assert_eq!(t.seen_sources[&src], 2);
    }
}
