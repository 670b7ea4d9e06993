//! Echo backends: small servers that tell the client who they are and whom they saw.
//!
//! Each listening socket is created inside the backend's namespace (on a thread that entered
//! it) and then served from an ordinary thread: a socket stays in the namespace it was created
//! in, so the serving threads need no namespace of their own. Sockets are dual-stack
//! (`[::]`, `IPV6_V6ONLY` off), so one port answers IPv4 and IPv6.

use std::io::Write;
use std::net::{Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, poll};
use socket2::Socket;

use crate::error::{Result, TestbedError};
use crate::netns::{Netns, panic_message};
use crate::probe::Proto;
use crate::socket::{canonical, new_socket};

/// How often an idle server looks at its stop flag; bounds how long dropping a server takes.
const STOP_POLL: u16 = 50;

/// Backends running in one namespace; they stop when this is dropped.
#[derive(Debug)]
pub struct EchoServer {
    name: String,
    ports: Vec<(Proto, u16)>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// What a TCP (or SCTP) backend does after its greeting line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Closes the connection: one connection, one answer (what probes expect).
    OneAnswer,
    /// Keeps the connection and answers every line received with the greeting again, until the
    /// client closes it: a long-lived connection whose every exchange shows who serves it.
    Conversation,
}

impl EchoServer {
    /// Starts answering on every `(proto, port)` on all addresses of `netns`, identifying itself
    /// as `name`. Binding happens before this returns, so the ports are reachable immediately.
    pub fn start(netns: &Netns, name: &str, ports: &[(Proto, u16)]) -> Result<EchoServer> {
        Self::start_in(netns, name, ports, Mode::OneAnswer)
    }

    /// Like [`EchoServer::start`], but a TCP connection stays open after the greeting, and every
    /// line the client sends is answered with the greeting again.
    pub fn start_conversations(netns: &Netns, name: &str, ports: &[(Proto, u16)]) -> Result<EchoServer> {
        Self::start_in(netns, name, ports, Mode::Conversation)
    }

    fn start_in(netns: &Netns, name: &str, ports: &[(Proto, u16)], mode: Mode) -> Result<EchoServer> {
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(TestbedError::Invalid(format!("backend name {name:?} must be one non-empty word")));
        }
        let specs = ports.to_vec();
        let sockets: Vec<Socket> =
            netns.run_in(move || specs.iter().map(|&(proto, port)| listen(proto, port)).collect::<Result<_>>())??;
        let stop = Arc::new(AtomicBool::new(false));
        let mut server = EchoServer { name: name.to_owned(), ports: ports.to_vec(), stop, threads: Vec::new() };
        for (socket, &(proto, port)) in sockets.into_iter().zip(ports) {
            let stop = Arc::clone(&server.stop);
            let name = server.name.clone();
            let thread = std::thread::Builder::new()
                .name(format!("echo-{name}-{proto}-{port}"))
                .spawn(move || serve(socket, proto, &name, &stop, mode))
                .map_err(|e| TestbedError::io("spawning echo thread", e))?;
            server.threads.push(thread);
        }
        tracing::debug!(backend = %server.name, netns = netns.name(), ports = ?server.ports, "echo server started");
        Ok(server)
    }

    /// The name this server answers with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ports it serves.
    pub fn ports(&self) -> &[(Proto, u16)] {
        &self.ports
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            if let Err(panic) = thread.join() {
                tracing::warn!(backend = %self.name, panic = %panic_message(&*panic), "echo thread panicked");
            }
        }
    }
}

fn listen(proto: Proto, port: u16) -> Result<Socket> {
    let addr = SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port);
    let socket = new_socket(proto, &addr)?;
    let what = |step: &str| format!("{step} {proto} port {port}");
    socket.set_only_v6(false).map_err(|e| TestbedError::io(what("dual-stack"), e))?;
    socket.set_reuse_address(true).map_err(|e| TestbedError::io(what("reuse address on"), e))?;
    socket.bind(&addr.into()).map_err(|e| TestbedError::io(what("binding"), e))?;
    // Readiness comes from poll; a connection reset between poll and accept must not block.
    socket.set_nonblocking(true).map_err(|e| TestbedError::io(what("non-blocking"), e))?;
    if proto != Proto::Udp {
        socket.listen(128).map_err(|e| TestbedError::io(what("listening on"), e))?;
    }
    Ok(socket)
}

fn serve(socket: Socket, proto: Proto, name: &str, stop: &Arc<AtomicBool>, mode: Mode) {
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, STOP_POLL) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!(backend = name, error = %e, "echo server poll failed");
                return;
            }
        }
        let answered = match proto {
            Proto::Udp => answer_datagram(&socket, name),
            Proto::Tcp | Proto::Sctp => answer_connection(&socket, name, mode, stop),
        };
        if let Err(e) = answered {
            tracing::debug!(backend = name, %proto, error = %e, "echo server could not answer");
        }
    }
}

fn reply_line(name: &str, peer: SocketAddr) -> String {
    format!("{name} {} {}\n", peer.ip(), peer.port())
}

fn answer_connection(listener: &Socket, name: &str, mode: Mode, stop: &Arc<AtomicBool>) -> std::io::Result<()> {
    let (mut conn, peer) = listener.accept()?;
    let peer = peer.as_socket().map(canonical).ok_or_else(|| std::io::Error::other("peer is not an IP address"))?;
    conn.set_write_timeout(Some(Duration::from_secs(1)))?;
    let line = reply_line(name, peer);
    conn.write_all(line.as_bytes())?;
    conn.flush()?;
    if mode == Mode::Conversation {
        let stop = Arc::clone(stop);
        std::thread::Builder::new()
            .name(format!("echo-{name}-conversation"))
            .spawn(move || converse(conn, &line, &stop))?;
    }
    Ok(())
}

/// Answers every line read on `conn` with `line`, until the client closes or the server stops.
fn converse(conn: Socket, line: &str, stop: &AtomicBool) {
    use std::io::BufRead;
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_millis(u64::from(STOP_POLL))));
    let mut writer = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = std::io::BufReader::new(std::net::TcpStream::from(conn));
    let mut request = String::new();
    while !stop.load(Ordering::Relaxed) {
        match reader.read_line(&mut request) {
            Ok(0) => return,
            Ok(_) if request.ends_with('\n') => {
                request.clear();
                if writer.write_all(line.as_bytes()).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

fn answer_datagram(socket: &Socket, name: &str) -> std::io::Result<()> {
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 1500];
    let (_, peer) = socket.recv_from(&mut buf)?;
    let peer_addr =
        peer.as_socket().map(canonical).ok_or_else(|| std::io::Error::other("peer is not an IP address"))?;
    socket.send_to(reply_line(name, peer_addr).as_bytes(), &peer)?;
    Ok(())
}
