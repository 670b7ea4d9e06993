//! Hand-made TCP segments, for packets no socket would send: a bare FIN that belongs to no
//! connection (conntrack deems every segment with that flag combination INVALID), and a tap
//! that counts such segments where they arrive. IPv4, over raw sockets; the kernel writes the
//! IP header, the segment's checksum is computed here, so only the flags make it invalid.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::error::{Result, TestbedError};
use crate::netns::Netns;

/// TCP flag FIN.
pub const TCP_FIN: u8 = 0x01;
/// TCP flag SYN.
pub const TCP_SYN: u8 = 0x02;
/// TCP flag RST.
pub const TCP_RST: u8 = 0x04;
/// TCP flag ACK.
pub const TCP_ACK: u8 = 0x10;

/// The first source port of the segments [`send_tcp_segments`] sends (one port each).
pub const SEGMENT_SOURCE_PORT: u16 = 47_000;

/// A 20-byte TCP header with `flags` and its checksum for `src` → `dest`.
pub fn tcp_segment(src: SocketAddrV4, dest: SocketAddrV4, flags: u8, seq: u32) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0..2].copy_from_slice(&src.port().to_be_bytes());
    h[2..4].copy_from_slice(&dest.port().to_be_bytes());
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = flags;
    h[14..16].copy_from_slice(&1024u16.to_be_bytes());
    let checksum = checksum(*src.ip(), *dest.ip(), &h);
    h[16..18].copy_from_slice(&checksum.to_be_bytes());
    h
}

/// The TCP checksum over the IPv4 pseudo-header and `segment` (whose checksum field is zero).
fn checksum(src: Ipv4Addr, dest: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
    };
    add(&src.octets());
    add(&dest.octets());
    add(&[0, 6]);
    add(&(segment.len() as u16).to_be_bytes());
    add(segment);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Sends `count` segments with only `flags` set from `from` to `dest`, each from its own source
/// port ([`SEGMENT_SOURCE_PORT`] and up); the source address is the one `from` routes `dest`
/// from.
pub fn send_tcp_segments(from: &Netns, dest: SocketAddrV4, flags: u8, count: u16) -> Result<()> {
    from.run_in(move || -> Result<()> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| TestbedError::io(what, e)
        };
        let route = UdpSocket::bind("0.0.0.0:0").map_err(io("binding a socket to find a route"))?;
        route.connect(dest).map_err(io("finding the route"))?;
        let source = match route.local_addr().map_err(io("reading the route's source"))? {
            SocketAddr::V4(a) => *a.ip(),
            SocketAddr::V6(a) => {
                return Err(TestbedError::io("finding the route", std::io::Error::other(a.to_string())));
            }
        };
        let raw = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP)).map_err(io("opening a raw socket"))?;
        for i in 0..count {
            let src = SocketAddrV4::new(source, SEGMENT_SOURCE_PORT + i);
            let segment = tcp_segment(src, dest, flags, 1_000_000 + u32::from(i));
            raw.send_to(&segment, &SocketAddr::V4(dest).into()).map_err(io("sending a TCP segment"))?;
        }
        Ok(())
    })?
}

/// Counts the TCP segments that arrive in a namespace for one port with exactly some flags.
#[derive(Debug)]
pub struct SegmentTap {
    socket: Socket,
    port: u16,
    flags: u8,
}

impl SegmentTap {
    /// Starts counting, in `ns`, segments to port `port` whose flags are exactly `flags`.
    pub fn open(ns: &Netns, port: u16, flags: u8) -> Result<SegmentTap> {
        let socket = ns
            .run_in(|| Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::TCP)))?
            .map_err(|e| TestbedError::io("opening a raw socket", e))?;
        Ok(SegmentTap { socket, port, flags })
    }

    /// The segments seen until `want` of them arrived or `within` passed.
    pub fn count(&self, want: usize, within: Duration) -> Result<usize> {
        let start = Instant::now();
        let mut seen = 0;
        let mut buf = [0u8; 2048];
        while seen < want {
            let left = within.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            self.socket
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .map_err(|e| TestbedError::io("setting a timeout", e))?;
            let n = match std::io::Read::read(&mut &self.socket, &mut buf) {
                Ok(n) => n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(TestbedError::io("receiving on a raw socket", e)),
            };
            if segment_matches(&buf[..n], self.port, self.flags) {
                seen += 1;
            }
        }
        Ok(seen)
    }
}

/// Whether an IPv4 packet (header included, as raw sockets read it) is a TCP segment to `port`
/// with exactly `flags`.
fn segment_matches(packet: &[u8], port: u16, flags: u8) -> bool {
    let Some(&first) = packet.first() else { return false };
    let tcp = usize::from(first & 0x0f) * 4;
    let dport = packet.get(tcp + 2..tcp + 4).map(|p| u16::from_be_bytes([p[0], p[1]]));
    dport == Some(port) && packet.get(tcp + 13) == Some(&flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIN from 198.18.0.10:47000 to 198.18.16.10:8080: the checksum makes the one's
    /// complement sum over pseudo-header and segment 0xffff, and a tap recognises it behind an
    /// IP header.
    #[test]
    fn segments_carry_a_valid_checksum_and_are_recognised_by_port_and_flags() {
        let src = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 10), 47_000);
        let dest = SocketAddrV4::new(Ipv4Addr::new(198, 18, 16, 10), 8080);
        let segment = tcp_segment(src, dest, TCP_FIN, 7);
        assert_eq!(checksum(*src.ip(), *dest.ip(), &segment), 0, "a correct checksum sums to zero");
        assert_eq!((segment[12], segment[13]), (0x50, TCP_FIN));
        let mut packet = vec![0x45; 1];
        packet.extend([0u8; 19]);
        packet.extend(segment);
        assert!(segment_matches(&packet, 8080, TCP_FIN));
        assert!(!segment_matches(&packet, 8081, TCP_FIN));
        assert!(!segment_matches(&packet, 8080, TCP_FIN | TCP_ACK));
        assert!(!segment_matches(&packet[..30], 8080, TCP_FIN));
    }
}
