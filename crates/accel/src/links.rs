//! The node's network interfaces, over rtnetlink: which links the flowtable should hold, and
//! a subscription to link events so a new interface joins quickly.
//!
//! Netlink sockets act on the network namespace of the thread that opens them, like the `nft`
//! processes the fast path spawns, so everything here follows the caller into a test's node
//! namespace. (`/sys/class/net` would show the namespace sysfs was mounted in instead.)

use std::collections::BTreeSet;
use std::os::fd::AsFd;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage, State};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use crate::error::AccelError;

/// rtnetlink multicast group of link changes (`RTNLGRP_LINK`).
const RTNLGRP_LINK: u32 = 1;

/// Whether a link belongs in the flowtable: administratively up, not loopback, and not known
/// to be down (virtual devices often report an `Unknown` operational state while working).
pub fn eligible(message: &LinkMessage) -> Option<String> {
    let flags = message.header.flags;
    if !flags.contains(LinkFlags::Up) || flags.contains(LinkFlags::Loopback) {
        return None;
    }
    let mut name = None;
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::OperState(State::Down | State::LowerLayerDown | State::NotPresent) => return None,
            _ => {}
        }
    }
    name
}

/// Every link of the calling thread's network namespace that belongs in the flowtable.
pub fn eligible_links() -> Result<BTreeSet<String>, AccelError> {
    links().map(|(eligible, _)| eligible)
}

/// The links that belong in the flowtable, and the names of all links.
pub fn links() -> Result<(BTreeSet<String>, BTreeSet<String>), AccelError> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = 1;
    let mut request =
        NetlinkMessage::new(header, NetlinkPayload::from(RouteNetlinkMessage::GetLink(LinkMessage::default())));
    request.finalize();
    let mut buffer = vec![0u8; request.buffer_len()];
    request.serialize(&mut buffer);
    socket.send(&buffer, 0)?;

    let (mut eligible_names, mut all) = (BTreeSet::new(), BTreeSet::new());
    loop {
        let (data, _) = socket.recv_from_full()?;
        for message in messages::<RouteNetlinkMessage>(&data)? {
            match message.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => {
                    all.extend(link.attributes.iter().find_map(|a| match a {
                        LinkAttribute::IfName(name) => Some(name.clone()),
                        _ => None,
                    }));
                    eligible_names.extend(eligible(&link));
                }
                NetlinkPayload::Done(_) => return Ok((eligible_names, all)),
                NetlinkPayload::Error(error) => {
                    return Err(AccelError::Decode { what: "link dump", detail: format!("{error:?}") });
                }
                _ => {}
            }
        }
    }
}

/// A subscription to link changes (new, changed and deleted links) in the namespace of the
/// thread that created it.
#[derive(Debug)]
pub struct LinkEvents {
    socket: Socket,
}

impl LinkEvents {
    /// Subscribes.
    pub fn subscribe() -> Result<Self, AccelError> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.add_membership(RTNLGRP_LINK)?;
        socket.set_non_blocking(true)?;
        Ok(LinkEvents { socket })
    }

    /// Waits up to `timeout` for link events; returns how many arrived (0 on timeout). Drains
    /// everything queued, so a burst of events counts once per call. An overrun (the kernel
    /// dropped events because nobody read) counts as one event: the caller re-reads the links.
    pub fn wait(&mut self, timeout: Duration) -> Result<usize, AccelError> {
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(self.socket.as_fd(), nix::poll::PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(millis)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => return Ok(0),
            Ok(_) => {}
            Err(errno) => return Err(AccelError::Netlink(errno.into())),
        }
        let mut events = 0;
        loop {
            match self.socket.recv_from_full() {
                Ok((data, _)) if data.is_empty() => return Ok(events),
                Ok((data, _)) => events += messages::<RouteNetlinkMessage>(&data).map_or(1, |m| m.len().max(1)),
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => return Ok(events),
                // ENOBUFS: events were lost; the caller resynchronises anyway.
                Err(error) if error.raw_os_error() == Some(nix::libc::ENOBUFS) => events += 1,
                Err(error) => return Err(error.into()),
            }
        }
    }
}

/// Splits a datagram into netlink messages.
fn messages<I: NetlinkDeserializable>(mut data: &[u8]) -> Result<Vec<NetlinkMessage<I>>, AccelError> {
    let mut out = Vec::new();
    while data.len() >= 16 {
        let length = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        if length < 16 || length > data.len() {
            return Err(AccelError::Decode { what: "netlink message", detail: format!("length {length}") });
        }
        let message = NetlinkMessage::<I>::deserialize(&data[..length])
            .map_err(|e| AccelError::Decode { what: "netlink message", detail: e.to_string() })?;
        out.push(message);
        // Messages are 4-byte aligned.
        let advance = (length + 3) & !3;
        data = data.get(advance..).unwrap_or_default();
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use netlink_packet_route::link::LinkHeader;

    fn link(name: &str, flags: LinkFlags, state: State) -> LinkMessage {
        let mut message = LinkMessage::default();
        message.header = LinkHeader { flags, ..LinkHeader::default() };
        message.attributes = vec![LinkAttribute::IfName(name.into()), LinkAttribute::OperState(state)];
        message
    }

    #[test]
    fn up_non_loopback_links_are_eligible() {
        let up = LinkFlags::Up | LinkFlags::Broadcast;
        assert_eq!(eligible(&link("eth0", up, State::Up)).as_deref(), Some("eth0"));
        assert_eq!(eligible(&link("dummy0", up, State::Unknown)).as_deref(), Some("dummy0"));
        assert_eq!(eligible(&link("lo", LinkFlags::Up | LinkFlags::Loopback, State::Unknown)), None);
        assert_eq!(eligible(&link("eth1", LinkFlags::Broadcast, State::Down)), None);
        assert_eq!(eligible(&link("veth9", up, State::LowerLayerDown)), None);
    }
}
