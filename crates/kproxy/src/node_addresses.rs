//! The one owner of the node's interface addresses: read at start, then followed over
//! rtnetlink (address added or removed, IPv4 or IPv6) and re-read every `RESYNC` in case an
//! event was lost. Whoever needs them (the planner, for `nodePortAddresses` CIDRs; the conntrack
//! reconciler, for NodePort entries) holds a `watch` receiver. Upstream re-reads them at every
//! sync; following them means an address added inside a CIDR is served at once.

use std::net::IpAddr;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use netlink_sys::{Socket, protocols::NETLINK_ROUTE};
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// `RTNLGRP_IPV4_IFADDR` and `RTNLGRP_IPV6_IFADDR` (linux/rtnetlink.h).
const ADDRESS_GROUPS: [u32; 2] = [5, 9];
/// Re-read without an event at least this often.
const RESYNC: Duration = Duration::from_secs(30);
/// At most one re-read per this interval (a burst of pod veths costs one).
const MIN_INTERVAL: Duration = Duration::from_millis(200);

/// Starts following the addresses of the calling thread's network namespace; the receiver
/// holds the current list (sorted, deduplicated). Without rtnetlink, the addresses read now
/// are all there will be, and a warning says so.
pub fn follow() -> watch::Receiver<Vec<IpAddr>> {
    let (first, mut dirty) = match crate::node::local_addresses() {
        Ok(addresses) => (addresses, false),
        Err(error) => {
            warn!(%error, "cannot read the node's addresses; trying again");
            (Vec::new(), true)
        }
    };
    let (tx, rx) = watch::channel(first);
    let socket = match subscribe() {
        Ok(socket) => socket,
        Err(error) => {
            warn!(%error, "cannot follow node addresses over rtnetlink: using the ones read at start");
            return rx;
        }
    };
    let spawned = std::thread::Builder::new().name("kproxy-node-addresses".into()).spawn(move || {
        let mut last_read = Instant::now();
        // Failed reads are retried every MIN_INTERVAL: warn at the first, not at each.
        let mut failing = dirty;
        while !tx.is_closed() {
            dirty |= wait_for_events(&socket, MIN_INTERVAL);
            if (dirty && last_read.elapsed() >= MIN_INTERVAL) || last_read.elapsed() >= RESYNC {
                last_read = Instant::now();
                // A failed read keeps the addresses known and tries again after MIN_INTERVAL.
                let addresses = match crate::node::local_addresses() {
                    Ok(addresses) => addresses,
                    Err(error) => {
                        if !failing {
                            warn!(%error, "cannot read the node's addresses; keeping the last ones known");
                        }
                        (failing, dirty) = (true, true);
                        continue;
                    }
                };
                if std::mem::take(&mut failing) {
                    info!("the node's addresses can be read again");
                }
                dirty = false;
                tx.send_if_modified(|current| {
                    let changed = *current != addresses;
                    if changed {
                        debug!(?addresses, "node addresses changed");
                        *current = addresses;
                    }
                    changed
                });
            }
        }
    });
    if let Err(error) = spawned {
        warn!(%error, "cannot start the node address watcher: using the addresses read at start");
    }
    rx
}

fn subscribe() -> std::io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_ROUTE)?;
    socket.bind_auto()?;
    for group in ADDRESS_GROUPS {
        socket.add_membership(group)?;
    }
    socket.set_non_blocking(true)?;
    Ok(socket)
}

/// Waits up to `timeout`; true when address events (or an overrun: events were lost) arrived.
/// Drains what is queued: only "something changed" matters, the addresses are re-read.
fn wait_for_events(socket: &Socket, timeout: Duration) -> bool {
    let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
    let mut fds = [nix::poll::PollFd::new(socket.as_fd(), nix::poll::PollFlags::POLLIN)];
    if !matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(millis)), Ok(n) if n > 0) {
        return false;
    }
    let mut any = false;
    loop {
        match socket.recv_from_full() {
            Ok((data, _)) if !data.is_empty() => any = true,
            Err(error) if error.raw_os_error() == Some(nix::libc::ENOBUFS) => any = true,
            _ => return any,
        }
    }
}
