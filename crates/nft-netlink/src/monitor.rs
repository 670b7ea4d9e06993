//! Notices commits that touch given tables, as `nft monitor` does: a `NETLINK_NETFILTER`
//! socket subscribed to the `NFNLGRP_NFTABLES` group, which the kernel tells about every
//! object each commit in the namespace adds or deletes, then the commit's new generation.
//!
//! Why: the periodic check (every `syncPeriod`) is what finds kproxy's tables changed by
//! another program; until it runs, a deleted table is an outage of every Service. With this, a
//! commit that touched kproxy's tables is known as soon as it is made. Commits made by this
//! process are not reported (the kernel names the committing thread in the commit's notice);
//! where its thread ids cannot be matched (a PID namespace of its own), they are, and the check
//! they cause costs one round trip (the generation is the one kproxy's commit left).

use std::io;
use std::os::fd::AsFd as _;

use netlink_sys::Socket;
use netlink_sys::protocols::NETLINK_NETFILTER;
use nix::sys::socket::{setsockopt, sockopt};

use kproxy_nft_model::TableRef;

use crate::batch::nfproto;
use crate::socket::messages;
use crate::sys::*;
use crate::wire::{Attrs, NFGENMSG_LEN};

/// `NFNLGRP_NFTABLES`: nf_tables' multicast group.
const NFNLGRP_NFTABLES: u32 = 7;
/// Every object message (table, chain, rule, set, element, object, flowtable) names its table
/// in its first attribute.
const NFTA_TABLE_OF_OBJECT: u16 = 1;
/// `NFTA_GEN_ID`: the generation a commit made, in its notice.
const NFTA_GEN_ID: u16 = 1;
/// `NFTA_GEN_PROC_PID`: the thread that committed, in the commit's notice.
const NFTA_GEN_PROC_PID: u16 = 2;
const RCVBUF: usize = 8 << 20;

/// What one wait saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A commit by another process added or deleted something in one of the watched tables;
    /// the generation it made.
    Touched(u32),
    /// Notifications were lost (the socket overflowed): anything may have happened.
    Overrun,
}

/// A subscription to nf_tables' notifications, filtered to some tables.
#[derive(Debug)]
pub struct Monitor {
    sock: Socket,
    tables: Vec<(u8, String)>,
    buf: Vec<u8>,
    /// A watched table was touched since the last commit notice.
    touched: bool,
}

impl Monitor {
    /// Subscribes, in the calling thread's network namespace, to commits that touch any of
    /// `tables`.
    pub fn open(tables: &[TableRef]) -> io::Result<Monitor> {
        let tables = tables.iter().map(|t| (nfproto(t.family), t.name.clone())).collect();
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        sock.add_membership(NFNLGRP_NFTABLES)?;
        if setsockopt(&sock.as_fd(), sockopt::RcvBufForce, &RCVBUF).is_err() {
            sock.set_rx_buf_sz(RCVBUF)?;
        }
        Ok(Monitor { sock, tables, buf: Vec::with_capacity(1 << 20), touched: false })
    }

    /// Makes [`Monitor::wait`] give up (with `WouldBlock`) after `timeout` without a notice.
    pub fn with_timeout(self, timeout: std::time::Duration) -> io::Result<Monitor> {
        let tv = nix::sys::time::TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
        setsockopt(&self.sock.as_fd(), sockopt::ReceiveTimeout, &tv).map_err(io::Error::from)?;
        Ok(self)
    }

    /// Blocks until a commit touched a watched table, or notifications were lost.
    pub fn wait(&mut self) -> io::Result<Notice> {
        loop {
            self.buf.clear();
            self.buf.reserve(1 << 20);
            match self.sock.recv(&mut self.buf, 0) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => {
                    self.touched = false;
                    return Ok(Notice::Overrun);
                }
                Err(e) => return Err(e),
            }
            if let Some(generation) = self.scan() {
                return Ok(Notice::Touched(generation));
            }
        }
    }

    /// Reads one datagram of notifications; the generation of the last commit in it that
    /// another process made and that touched a watched table.
    fn scan(&mut self) -> Option<u32> {
        let mut committed = None;
        for msg in messages(&self.buf) {
            if msg.kind >> 8 != NFNL_SUBSYS_NFTABLES {
                continue;
            }
            let Some((&family, attrs)) = msg.payload.first().zip(msg.payload.get(NFGENMSG_LEN..)) else { continue };
            match msg.kind & 0xff {
                NFT_MSG_NEWGEN => {
                    let attr = |kind| Attrs(attrs).find(|a| a.kind == kind).and_then(|a| a.be32());
                    if std::mem::take(&mut self.touched) && !attr(NFTA_GEN_PROC_PID).is_some_and(is_own_thread) {
                        committed = Some(attr(NFTA_GEN_ID).unwrap_or_default());
                    }
                }
                _ if !self.touched => {
                    let table = Attrs(attrs).find(|a| a.kind == NFTA_TABLE_OF_OBJECT).map(|a| a.str());
                    self.touched =
                        table.is_some_and(|t| self.tables.iter().any(|(f, name)| *f == family && *name == t));
                }
                _ => {}
            }
        }
        committed
    }
}

/// Whether `tid` is a thread of this process.
fn is_own_thread(tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}
