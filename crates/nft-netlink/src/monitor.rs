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
//!
//! Each notice also says what the commit did to the watched tables ([`Commit`]): how many
//! elements it added and deleted, and how many other objects (rules, chains, sets, tables) it
//! added or deleted, as the kernel reports them: the benchmarks' and tests' count of what a
//! change costs the kernel.

use std::io;

use kproxy_nft_model::TableRef;

use crate::batch::nfproto;
use crate::socket::{NfSocket, messages};
use crate::sys::*;
use crate::wire::{Attrs, NFGENMSG_LEN};

/// Every object message (table, chain, rule, set, element, object, flowtable) names its table
/// in its first attribute.
const NFTA_TABLE_OF_OBJECT: u16 = 1;
/// `NFTA_GEN_ID`: the generation a commit made, in its notice.
const NFTA_GEN_ID: u16 = 1;
/// `NFTA_GEN_PROC_PID`: the thread that committed, in the commit's notice.
const NFTA_GEN_PROC_PID: u16 = 2;

/// What one wait saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A commit by another process added or deleted something in one of the watched tables.
    Touched(Commit),
    /// Notifications were lost (the socket overflowed): anything may have happened.
    Overrun,
}

/// One commit that touched the watched tables, as its notifications tell it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Commit {
    /// The generation it made.
    pub generation: u32,
    /// Elements it added to the watched tables' sets and maps.
    pub elements_added: usize,
    /// Elements it deleted from them.
    pub elements_deleted: usize,
    /// Other objects (tables, chains, rules, sets, flowtables) it added or deleted there.
    pub objects: usize,
}

impl Commit {
    /// Elements added and deleted.
    pub fn elements(&self) -> usize {
        self.elements_added + self.elements_deleted
    }
}

/// A subscription to nf_tables' notifications, filtered to some tables.
#[derive(Debug)]
pub struct Monitor {
    sock: NfSocket,
    tables: Vec<(u8, String)>,
    /// What the commit in progress did to the watched tables so far.
    pending: Pending,
    /// Report this process's own commits too.
    own_commits: bool,
}

/// What the commit in progress did to the watched tables so far.
#[derive(Debug, Default)]
struct Pending {
    /// It touched a watched table.
    touched: bool,
    commit: Commit,
}

impl Monitor {
    /// Subscribes, in the calling thread's network namespace, to commits that touch any of
    /// `tables`.
    pub fn open(tables: &[TableRef]) -> io::Result<Monitor> {
        let tables = tables.iter().map(|t| (nfproto(t.family), t.name.clone())).collect();
        let sock = NfSocket::open()?;
        sock.subscribe(NFNLGRP_NFTABLES)?;
        Ok(Monitor { sock, tables, pending: Pending::default(), own_commits: false })
    }

    /// Makes the monitor report this process's own commits too (a test counting what its own
    /// syncs cost the kernel).
    pub fn with_own_commits(mut self) -> Monitor {
        self.own_commits = true;
        self
    }

    /// Makes [`Monitor::wait`] give up (with `WouldBlock`) after `timeout` without a notice.
    pub fn with_timeout(self, timeout: std::time::Duration) -> io::Result<Monitor> {
        self.sock.set_receive_timeout(timeout)?;
        Ok(self)
    }

    /// Blocks until a commit touched a watched table, or notifications were lost.
    pub fn wait(&mut self) -> io::Result<Notice> {
        loop {
            let datagram = match self.sock.receive() {
                Ok(datagram) => datagram,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS) => {
                    self.pending = Pending::default();
                    return Ok(Notice::Overrun);
                }
                Err(e) => return Err(e),
            };
            if let Some(commit) = scan(datagram, &self.tables, self.own_commits, &mut self.pending) {
                return Ok(Notice::Touched(commit));
            }
        }
    }
}

/// Reads one datagram of notifications; the last commit in it that another process (or, with
/// `own_commits`, any) made and that touched one of `tables`. `pending` carries over to the
/// next datagram what the commit in progress did so far.
fn scan(datagram: &[u8], tables: &[(u8, String)], own_commits: bool, pending: &mut Pending) -> Option<Commit> {
    let mut committed = None;
    for msg in messages(datagram) {
        if msg.kind >> 8 != NFNL_SUBSYS_NFTABLES {
            continue;
        }
        let Some((&family, attrs)) = msg.payload.first().zip(msg.payload.get(NFGENMSG_LEN..)) else { continue };
        match msg.kind & 0xff {
            NFT_MSG_NEWGEN => {
                let attr = |kind| Attrs(attrs).find(|a| a.kind == kind).and_then(|a| a.be32());
                let done = std::mem::take(pending);
                if done.touched && (own_commits || !attr(NFTA_GEN_PROC_PID).is_some_and(is_own_thread)) {
                    committed = Some(Commit { generation: attr(NFTA_GEN_ID).unwrap_or_default(), ..done.commit });
                }
            }
            kind => {
                let table = Attrs(attrs).find(|a| a.kind == NFTA_TABLE_OF_OBJECT).map(|a| a.str());
                if !table.is_some_and(|t| tables.iter().any(|(f, name)| *f == family && *name == t)) {
                    continue;
                }
                pending.touched = true;
                let elements = || {
                    let list = Attrs(attrs).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS);
                    list.map_or(0, |l| l.nested().filter(|e| e.kind == NFTA_LIST_ELEM).count())
                };
                match kind {
                    NFT_MSG_NEWSETELEM => pending.commit.elements_added += elements(),
                    NFT_MSG_DELSETELEM => pending.commit.elements_deleted += elements(),
                    _ => pending.commit.objects += 1,
                }
            }
        }
    }
    committed
}

/// Whether `tid` is a thread of this process.
fn is_own_thread(tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}
