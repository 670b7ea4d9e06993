//! One conntrack entry, reduced to what the reconciler reasons about.
//!
//! The kernel keeps two tuples per connection: the original direction (as the client sent it,
//! before DNAT) and the reply direction (as the endpoint answers, after DNAT). A service flow that
//! was load-balanced has the service address as the original destination and the chosen endpoint
//! as the reply source, which is exactly the pair the stale-flow decision needs.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use kproxy_state::{IpFamily, Protocol};

/// Addresses and ports of one direction of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl Tuple {
    /// The source as a socket address.
    pub fn source(&self) -> SocketAddr {
        SocketAddr::new(self.src, self.src_port)
    }

    /// The destination as a socket address.
    pub fn destination(&self) -> SocketAddr {
        SocketAddr::new(self.dst, self.dst_port)
    }
}

/// A conntrack entry of a port-based protocol (TCP, UDP or SCTP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flow {
    /// Layer-4 protocol.
    pub protocol: Protocol,
    /// The original direction, as the client sent it.
    pub original: Tuple,
    /// The reply direction, as the peer answers it (after NAT).
    pub reply: Tuple,
    /// Conntrack zone (0 unless something puts flows in zones).
    pub zone: u16,
    /// The kernel's id of the entry, when it reported one. A delete that carries it only removes
    /// that very entry, never a newer one that reused the tuple.
    pub id: Option<u32>,
}

impl Flow {
    /// The family of the flow's addresses.
    pub fn family(&self) -> IpFamily {
        if self.original.dst.is_ipv4() { IpFamily::V4 } else { IpFamily::V6 }
    }

    /// True when the reply does not come from where the client sent to: the flow was
    /// destination-NATed (or its reply is otherwise rewritten).
    pub fn is_dnat(&self) -> bool {
        self.reply.source() != self.original.destination()
    }
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} -> {} (reply from {})",
            self.protocol.as_str(),
            self.original.source(),
            self.original.destination(),
            self.reply.source()
        )?;
        if self.zone != 0 {
            write!(f, " zone {}", self.zone)?;
        }
        Ok(())
    }
}

/// The IANA protocol number of a protocol.
pub(crate) fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// The protocol of an IANA protocol number, for the protocols a service can use.
pub(crate) fn protocol_from_number(number: u8) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}
