//! Socket plumbing shared by probes, sessions and echo servers: creating a socket for a
//! [`Proto`], and turning a failed connect/receive into the dataplane verdict it stands for.
//!
//! A reject shows up as `ECONNREFUSED` (TCP RST, ICMP port unreachable) but an ICMP
//! "administratively prohibited" arrives as `EHOSTUNREACH`, the same errno as a genuine host
//! unreachable. To tell them apart every client socket sets `IP_RECVERR`/`IPV6_RECVERR` and the
//! classifier reads the ICMP type and code from the socket's error queue.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg, setsockopt, sockopt};
use socket2::{Domain, Protocol, Socket, Type};

use crate::error::{Result, TestbedError};
use crate::probe::{ProbeResult, Proto};

/// IANA protocol number of SCTP (`IPPROTO_SCTP`).
const IPPROTO_SCTP: i32 = 132;

/// `SO_EE_ORIGIN_ICMP` / `SO_EE_ORIGIN_ICMP6` from `<linux/errqueue.h>`.
const ORIGIN_ICMP: u8 = 2;
const ORIGIN_ICMP6: u8 = 3;

/// Creates an unbound socket of `proto` for the family of `addr`.
pub(crate) fn new_socket(proto: Proto, addr: &SocketAddr) -> Result<Socket> {
    let domain = Domain::for_address(*addr);
    let (ty, protocol) = match proto {
        Proto::Tcp => (Type::STREAM, Protocol::TCP),
        Proto::Udp => (Type::DGRAM, Protocol::UDP),
        Proto::Sctp => (Type::STREAM, Protocol::from(IPPROTO_SCTP)),
    };
    Socket::new(domain, ty, Some(protocol)).map_err(|e| {
        let no_sctp = matches!(
            Errno::from_raw(e.raw_os_error().unwrap_or(0)),
            Errno::EPROTONOSUPPORT | Errno::ESOCKTNOSUPPORT | Errno::EAFNOSUPPORT
        );
        if proto == Proto::Sctp && no_sctp {
            TestbedError::SctpUnsupported(e)
        } else {
            TestbedError::io(format!("creating {proto} socket"), e)
        }
    })
}

/// Creates a client socket that records ICMP errors in its error queue.
pub(crate) fn new_client_socket(proto: Proto, dest: &SocketAddr) -> Result<Socket> {
    let socket = new_socket(proto, dest)?;
    let recv_err = match dest {
        SocketAddr::V4(_) => setsockopt(&socket, sockopt::Ipv4RecvErr, &true),
        SocketAddr::V6(_) => setsockopt(&socket, sockopt::Ipv6RecvErr, &true),
    };
    recv_err.map_err(|e| TestbedError::io("setting IP_RECVERR", e.into()))?;
    Ok(socket)
}

/// The ICMP error the kernel queued on a socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IcmpError {
    v6: bool,
    icmp_type: u8,
    code: u8,
}

impl IcmpError {
    /// Port unreachable and the "administratively prohibited" family are what a reject rule
    /// sends; every other ICMP error is a routing failure.
    fn verdict(self) -> ProbeResult {
        let refused = if self.v6 {
            // ICMPv6 destination unreachable: 1 admin prohibited, 4 port unreachable.
            self.icmp_type == 1 && matches!(self.code, 1 | 4)
        } else {
            // ICMP destination unreachable: 2 protocol, 3 port, 9/10 net/host prohibited,
            // 13 communication administratively prohibited.
            self.icmp_type == 3 && matches!(self.code, 2 | 3 | 9 | 10 | 13)
        };
        if refused { ProbeResult::Refused } else { ProbeResult::Unreachable }
    }
}

/// Pops the first ICMP error from the socket's error queue, if any.
fn queued_icmp_error(socket: &Socket) -> Option<IcmpError> {
    let mut data = [0u8; 256];
    let mut iov = [IoSliceMut::new(&mut data)];
    let mut control = nix::cmsg_space!(nix::libc::sock_extended_err, nix::libc::sockaddr_in6);
    let msg = recvmsg::<SockaddrStorage>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_ERRQUEUE | MsgFlags::MSG_DONTWAIT,
    )
    .ok()?;
    for cmsg in msg.cmsgs().ok()? {
        let err = match cmsg {
            ControlMessageOwned::Ipv4RecvErr(err, _) | ControlMessageOwned::Ipv6RecvErr(err, _) => err,
            _ => continue,
        };
        if err.ee_origin == ORIGIN_ICMP || err.ee_origin == ORIGIN_ICMP6 {
            return Some(IcmpError { v6: err.ee_origin == ORIGIN_ICMP6, icmp_type: err.ee_type, code: err.ee_code });
        }
    }
    None
}

/// Maps a failed connect/send/receive on a client socket to the verdict it means, or returns
/// the error when it is not a network outcome.
pub(crate) fn classify_failure(socket: &Socket, error: io::Error, what: &str) -> Result<ProbeResult> {
    if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
        return Ok(ProbeResult::TimedOut);
    }
    if let Some(icmp) = queued_icmp_error(socket) {
        tracing::debug!(?icmp, %error, "probe got an ICMP error");
        return Ok(icmp.verdict());
    }
    match Errno::from_raw(error.raw_os_error().unwrap_or(0)) {
        Errno::ECONNREFUSED | Errno::ECONNRESET => Ok(ProbeResult::Refused),
        Errno::EHOSTUNREACH | Errno::ENETUNREACH | Errno::EHOSTDOWN | Errno::ENONET => Ok(ProbeResult::Unreachable),
        // Netfilter dropped a packet this very namespace generated; the kernel tells the local
        // sender, but for the dataplane it is a silent drop.
        Errno::EPERM => Ok(ProbeResult::TimedOut),
        Errno::ETIMEDOUT => Ok(ProbeResult::TimedOut),
        _ => Err(TestbedError::io(what.to_owned(), error)),
    }
}

/// Turns a socket address as the kernel reports it into the address the peer really has
/// (`::ffff:a.b.c.d` on a dual-stack socket is the IPv4 peer `a.b.c.d`).
pub(crate) fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}
