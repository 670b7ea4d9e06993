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
//! change costs the kernel. Asked to ([`Monitor::with_added_elements`]), it also keeps the
//! elements those commits added, as the kernel reported them, so a benchmark can see a change
//! arrive without looking it up in a map of thousands of slots.

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

/// The commits of one notice that touched the watched tables (almost always one), as their
/// notifications tell them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Commit {
    /// The generation the last of them made.
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

    fn then(self, next: Commit) -> Commit {
        Commit {
            generation: next.generation,
            elements_added: self.elements_added + next.elements_added,
            elements_deleted: self.elements_deleted + next.elements_deleted,
            objects: self.objects + next.objects,
        }
    }
}

/// An element a reported commit added, as the kernel's notification carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddedElement {
    /// Its set or map.
    pub set: String,
    /// Its key's bytes.
    pub key: Vec<u8>,
    /// Its data's bytes (a map's value; `None` for a set's element or a verdict).
    pub data: Option<Vec<u8>>,
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
    /// Keep the elements reported commits added.
    keep_added: bool,
    /// The elements reported commits added, since the last [`Monitor::take_added`].
    added: Vec<AddedElement>,
}

/// What the commit in progress did to the watched tables so far.
#[derive(Debug, Default)]
struct Pending {
    /// It touched a watched table.
    touched: bool,
    commit: Commit,
    /// The elements it added, when kept.
    added: Vec<AddedElement>,
}

impl Monitor {
    /// Subscribes, in the calling thread's network namespace, to commits that touch any of
    /// `tables`.
    pub fn open(tables: &[TableRef]) -> io::Result<Monitor> {
        let tables = tables.iter().map(|t| (nfproto(t.family), t.name.clone())).collect();
        let sock = NfSocket::open()?;
        sock.subscribe(NFNLGRP_NFTABLES)?;
        Ok(Monitor {
            sock,
            tables,
            pending: Pending::default(),
            own_commits: false,
            keep_added: false,
            added: Vec::new(),
        })
    }

    /// Makes the monitor keep the elements each reported commit added (see
    /// [`Monitor::take_added`]).
    pub fn with_added_elements(mut self) -> Monitor {
        self.keep_added = true;
        self
    }

    /// The elements the commits reported since the last call added (with
    /// [`Monitor::with_added_elements`]; else none).
    pub fn take_added(&mut self) -> Vec<AddedElement> {
        std::mem::take(&mut self.added)
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
            let watch = Watch { tables: &self.tables, own_commits: self.own_commits, keep_added: self.keep_added };
            if let Some(commit) = scan(datagram, &watch, &mut self.pending, &mut self.added) {
                return Ok(Notice::Touched(commit));
            }
        }
    }
}

/// What a monitor reports.
struct Watch<'a> {
    tables: &'a [(u8, String)],
    own_commits: bool,
    keep_added: bool,
}

/// Reads one datagram of notifications; the commits in it that another process (or, with
/// `own_commits`, any) made and that touched one of the watched tables, summed; the elements
/// they added go to `added` when kept. `pending` carries over to the next datagram what the
/// commit in progress did so far.
fn scan(datagram: &[u8], watch: &Watch<'_>, pending: &mut Pending, added: &mut Vec<AddedElement>) -> Option<Commit> {
    let mut committed: Option<Commit> = None;
    for msg in messages(datagram) {
        if msg.kind >> 8 != NFNL_SUBSYS_NFTABLES {
            continue;
        }
        let Some((&family, attrs)) = msg.payload.first().zip(msg.payload.get(NFGENMSG_LEN..)) else { continue };
        match msg.kind & 0xff {
            NFT_MSG_NEWGEN => {
                let attr = |kind| Attrs(attrs).find(|a| a.kind == kind).and_then(|a| a.be32());
                let done = std::mem::take(pending);
                if done.touched && (watch.own_commits || !attr(NFTA_GEN_PROC_PID).is_some_and(is_own_thread)) {
                    let commit = Commit { generation: attr(NFTA_GEN_ID).unwrap_or_default(), ..done.commit };
                    committed = Some(committed.map_or(commit, |c| c.then(commit)));
                    added.extend(done.added);
                }
            }
            kind => {
                let table = Attrs(attrs).find(|a| a.kind == NFTA_TABLE_OF_OBJECT).map(|a| a.str());
                if !table.is_some_and(|t| watch.tables.iter().any(|(f, name)| *f == family && *name == t)) {
                    continue;
                }
                pending.touched = true;
                let elements = || {
                    let list = Attrs(attrs).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS);
                    list.map_or(0, |l| l.nested().filter(|e| e.kind == NFTA_LIST_ELEM).count())
                };
                if kind == NFT_MSG_NEWSETELEM && watch.keep_added {
                    pending.added.extend(added_elements(attrs));
                }
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

/// The elements a `NEWSETELEM` notification carries.
fn added_elements(attrs: &[u8]) -> Vec<AddedElement> {
    let set = Attrs(attrs).find(|a| a.kind == NFTA_SET_ELEM_LIST_SET).map(|a| a.str()).unwrap_or_default();
    let value = |elem: crate::wire::Attr<'_>, kind: u16| {
        let nest = elem.nested().find(|a| a.kind == kind)?;
        nest.nested().find(|a| a.kind == NFTA_DATA_VALUE).map(|a| a.data.to_vec())
    };
    let Some(list) = Attrs(attrs).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS) else { return Vec::new() };
    list.nested()
        .filter(|e| e.kind == NFTA_LIST_ELEM)
        .filter_map(|e| {
            Some(AddedElement {
                set: set.to_string(),
                key: value(e, NFTA_SET_ELEM_KEY)?,
                data: value(e, NFTA_SET_ELEM_DATA),
            })
        })
        .collect()
}

/// Whether `tid` is a thread of this process.
fn is_own_thread(tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/self/task/{tid}")).exists()
}
