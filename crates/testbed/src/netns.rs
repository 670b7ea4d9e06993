//! A named network namespace that is always removed again.
//!
//! Tests create namespaces with `ip netns add` so that the usual tools (`ip -n`, `nft`,
//! `conntrack`) can address them by name, and enter them from Rust with `setns(2)` on a fresh
//! thread: network namespaces are a per-thread attribute, so a thread that has switched creates
//! every socket inside the namespace without affecting the rest of the test process.
//!
//! Names are `kpt-<pid>-<counter>-<role>`: unique across parallel tests and test binaries, and
//! the pid lets [`Netns::remove_stale`] clean up after a process that was killed before its
//! destructors ran. Deleting a namespace destroys every veth end and bridge inside it (and the
//! peer end of each veth), so the testbed creates all its links inside namespaces, never in the
//! root namespace, and needs no other cleanup.

use std::ffi::OsStr;
use std::fs::File;
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};

use crate::command;
use crate::error::{Result, TestbedError};

/// Every namespace this crate creates starts with this prefix.
pub const NETNS_PREFIX: &str = "kpt-";

/// Where `ip netns` keeps its bind mounts.
const NETNS_DIR: &str = "/run/netns";

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A network namespace owned by the test; deleted on drop (including during a panic unwind).
#[derive(Debug)]
pub struct Netns {
    name: String,
    role: String,
}

impl Netns {
    /// Creates a fresh namespace for `role` (a short label such as `node` or `pod-a`) and brings
    /// its loopback up.
    pub fn new(role: &str) -> Result<Netns> {
        let role: String =
            role.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).take(24).collect();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NETNS_PREFIX}{}-{id}-{role}", std::process::id());
        command::checked("ip", &["netns", "add", &name], None)?;
        // From here on Drop removes the namespace, whatever fails next.
        let netns = Netns { name, role };
        netns.ip(["link", "set", "lo", "up"])?;
        tracing::debug!(netns = %netns.name, "created network namespace");
        Ok(netns)
    }

    /// The namespace's name as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The label this namespace was created for.
    pub fn role(&self) -> &str {
        &self.role
    }

    /// The bind mount that pins the namespace (`/run/netns/<name>`).
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// Runs `cmd args…` inside the namespace (`ip netns exec`) and returns its output, whatever
    /// its exit status.
    pub fn exec<S: AsRef<OsStr>>(&self, cmd: &str, args: &[S]) -> Result<Output> {
        command::output("ip", &self.exec_args(cmd, args), None)
    }

    /// Like [`Netns::exec`], but fails unless the command succeeds; returns its stdout.
    pub fn exec_ok<S: AsRef<OsStr>>(&self, cmd: &str, args: &[S]) -> Result<String> {
        command::checked("ip", &self.exec_args(cmd, args), None)
    }

    /// Runs `cmd args…` inside the namespace with `stdin` as its standard input; fails unless it
    /// succeeds; returns its stdout.
    pub fn exec_with_stdin<S: AsRef<OsStr>>(&self, cmd: &str, args: &[S], stdin: &str) -> Result<String> {
        command::checked("ip", &self.exec_args(cmd, args), Some(stdin))
    }

    /// `ip -n <name> args…`; fails unless it succeeds; returns stdout.
    pub fn ip<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut all: Vec<std::ffi::OsString> = vec!["-n".into(), self.name.clone().into()];
        all.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        command::checked("ip", &all, None)
    }

    /// Runs several `ip` commands (one per line, without the leading `ip`) in this namespace
    /// with one process (`ip -n <name> -batch -`); stops at the first failing line.
    pub fn ip_batch<S: AsRef<str>>(&self, commands: &[S]) -> Result<()> {
        let script: String = commands.iter().map(|c| format!("{}\n", c.as_ref())).collect();
        command::checked("ip", &["-n", self.name.as_str(), "-batch", "-"], Some(&script)).map(drop)
    }

    /// Waits until every interface in `ifaces` is operationally up *and* has its queueing
    /// discipline attached. The kernel activates a link asynchronously ("linkwatch", which is
    /// rate-limited to about once a second when many links change, as when tests run in
    /// parallel); until then the link silently drops what is sent — typically the first ARP
    /// request of a probe, which then looks like a drop.
    pub fn wait_links_up(&self, ifaces: &[&str], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let listing = self.ip(["-o", "link", "show"])?;
            let pending: Vec<&str> = ifaces.iter().copied().filter(|iface| !link_is_active(&listing, iface)).collect();
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestbedError::Invalid(format!(
                    "links {pending:?} in {} not up after {timeout:?}: {listing}",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Loads an nftables script into this namespace (`nft -f -`).
    pub fn nft(&self, script: &str) -> Result<()> {
        self.exec_with_stdin("nft", &["-f", "-"], script).map(drop)
    }

    /// Sets a sysctl inside the namespace. `key` is dotted (`net.ipv4.ip_forward`) or a path
    /// relative to `/proc/sys` (`net/ipv4/conf/eth0.1/rp_filter`, for names containing dots).
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = sysctl_path(key);
        let value = format!("{value}\n");
        self.run_in(move || std::fs::write(&path, value.as_bytes()))?
            .map_err(|e| TestbedError::io(format!("sysctl {key} in {}", self.name), e))
    }

    /// Sets several sysctls inside the namespace, in order, entering it once.
    pub fn sysctls(&self, settings: &[(&str, &str)]) -> Result<()> {
        let writes: Vec<(String, PathBuf, String)> =
            settings.iter().map(|(k, v)| ((*k).to_owned(), sysctl_path(k), format!("{v}\n"))).collect();
        self.run_in(move || {
            writes.into_iter().try_for_each(|(key, path, value)| {
                std::fs::write(&path, value.as_bytes()).map_err(|e| TestbedError::io(format!("sysctl {key}"), e))
            })
        })?
        .map_err(|e| match e {
            TestbedError::Io { what, source } => TestbedError::Io { what: format!("{what} in {}", self.name), source },
            other => other,
        })
    }

    /// Reads a sysctl inside the namespace (trimmed).
    pub fn read_sysctl(&self, key: &str) -> Result<String> {
        let path = sysctl_path(key);
        self.run_in(move || std::fs::read_to_string(&path))?
            .map(|v| v.trim().to_owned())
            .map_err(|e| TestbedError::io(format!("reading sysctl {key} in {}", self.name), e))
    }

    /// Runs `f` on a fresh thread that has entered this namespace and returns its result.
    /// Sockets `f` creates belong to the namespace. A panic in `f` is propagated to the caller.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let handle = self.open()?;
        let netns = self.name.as_str();
        std::thread::scope(|scope| {
            let thread = scope.spawn(move || -> Result<T> {
                enter(&handle, netns)?;
                drop(handle);
                Ok(f())
            });
            match thread.join() {
                Ok(result) => result,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Starts a long-lived named thread inside this namespace (servers, client sessions).
    /// The namespace is entered before `f` runs; if that fails the error is returned here.
    pub fn spawn_in<T, F>(&self, thread_name: &str, f: F) -> Result<NsThread<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let handle = self.open()?;
        let netns = self.name.clone();
        let (entered_tx, entered_rx) = std::sync::mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name(thread_name.to_owned())
            .spawn(move || {
                let entered = enter(&handle, &netns);
                drop(handle);
                let ok = entered.is_ok();
                let _ = entered_tx.send(entered);
                if !ok {
                    // The spawner gets the error; this thread has nothing to run.
                    return None;
                }
                Some(f())
            })
            .map_err(|e| TestbedError::io(format!("spawning thread {thread_name}"), e))?;
        match entered_rx.recv() {
            Ok(Ok(())) => Ok(NsThread { name: thread_name.to_owned(), thread }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(TestbedError::ThreadPanicked(thread_name.to_owned())),
        }
    }

    /// Deletes namespaces left behind by test processes that no longer exist (killed before
    /// their destructors ran). Returns how many were removed. Namespaces of live processes,
    /// including this one, are never touched.
    pub fn remove_stale() -> usize {
        let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name.strip_prefix(NETNS_PREFIX).and_then(|rest| rest.split('-').next()) else {
                continue;
            };
            let Ok(pid) = pid.parse::<u32>() else { continue };
            if pid == std::process::id() || PathBuf::from(format!("/proc/{pid}")).exists() {
                continue;
            }
            match command::checked("ip", &["netns", "del", &name], None) {
                Ok(_) => removed += 1,
                Err(e) => tracing::warn!(netns = %name, error = %e, "could not remove stale namespace"),
            }
        }
        removed
    }

    fn open(&self) -> Result<File> {
        File::open(self.path()).map_err(|source| TestbedError::Setns { netns: self.name.clone(), source })
    }

    fn exec_args<S: AsRef<OsStr>>(&self, cmd: &str, args: &[S]) -> Vec<std::ffi::OsString> {
        let mut all: Vec<std::ffi::OsString> =
            vec!["netns".into(), "exec".into(), self.name.clone().into(), cmd.into()];
        all.extend(args.iter().map(|a| a.as_ref().to_owned()));
        all
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = command::checked("ip", &["netns", "del", &self.name], None) {
            tracing::warn!(netns = %self.name, error = %e, "could not delete network namespace");
        } else {
            tracing::debug!(netns = %self.name, "deleted network namespace");
        }
    }
}

/// Switches the calling thread into the namespace `handle` refers to.
fn enter(handle: &File, netns: &str) -> Result<()> {
    setns(handle, CloneFlags::CLONE_NEWNET)
        .map_err(|errno| TestbedError::Setns { netns: netns.to_owned(), source: errno.into() })
}

/// Whether `iface` appears in `ip -o link show` output as up with a real qdisc.
fn link_is_active(listing: &str, iface: &str) -> bool {
    listing.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let name = fields.nth(1).unwrap_or("").trim_end_matches(':');
        let name = name.split('@').next().unwrap_or(name);
        name == iface
            && (line.contains(" state UP ") || line.contains(" state UNKNOWN "))
            && !line.contains(" qdisc noop ")
    })
}

fn sysctl_path(key: &str) -> PathBuf {
    let relative = if key.contains('/') { key.to_owned() } else { key.replace('.', "/") };
    PathBuf::from("/proc/sys").join(relative)
}

/// A thread started by [`Netns::spawn_in`].
#[derive(Debug)]
pub struct NsThread<T> {
    name: String,
    // `None` only when the thread never entered the namespace, which `spawn_in` already
    // reported; a handed-out `NsThread` always yields `Some`.
    thread: JoinHandle<Option<T>>,
}

impl<T> NsThread<T> {
    /// Waits for the thread and returns what it returned.
    pub fn join(self) -> Result<T> {
        match self.thread.join() {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(TestbedError::ThreadPanicked(format!("{} never entered its namespace", self.name))),
            Err(panic) => Err(TestbedError::ThreadPanicked(format!("{}: {}", self.name, panic_message(&*panic)))),
        }
    }

    /// Whether the thread has finished.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

/// Best-effort text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_activity_needs_state_up_and_a_qdisc() {
        let listing = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT\n\
                       2: eth0@if3: <BROADCAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT\n\
                       4: veth10@if2: <BROADCAST,UP,LOWER_UP> mtu 1500 qdisc noop state DOWN mode DEFAULT\n\
                       5: cbr0: <NO-CARRIER,BROADCAST,UP> mtu 1500 qdisc noqueue state DOWN mode DEFAULT\n";
        assert!(link_is_active(listing, "lo"));
        assert!(link_is_active(listing, "eth0"));
        assert!(!link_is_active(listing, "veth10"));
        assert!(!link_is_active(listing, "cbr0"));
        assert!(!link_is_active(listing, "eth1"));
        assert!(!link_is_active(listing, "eth"));
    }
}
