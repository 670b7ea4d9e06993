//! Ctrl-C (SIGINT) and SIGTERM during a fleet run. A run owns up to a few hundred processes
//! (the proxies, etcd, kube-apiserver) and as many network namespaces, and none may outlive it.
//! On the normal path and on an error, their owners' destructors stop and remove them. A signal
//! runs no destructor, so everything is also written down here while it exists, and the signal's
//! thread kills the recorded process groups, deletes the recorded namespaces and directories,
//! and exits. (Every process is also started to die with the benchmark's main thread,
//! `PR_SET_PDEATHSIG`: a SIGKILL of the benchmark still leaves no process behind; its namespaces
//! are then removed by the next run, `Netns::remove_stale`.)

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// What a signal must clean up.
struct Owned {
    /// Process groups (each proxy's; the API server's and etcd's under `plane`).
    groups: Vec<u32>,
    /// The control plane's process groups (replaced at every API server restart).
    plane: Vec<u32>,
    netns: Vec<String>,
    dirs: Vec<PathBuf>,
}

static OWNED: Mutex<Owned> =
    Mutex::new(Owned { groups: Vec::new(), plane: Vec::new(), netns: Vec::new(), dirs: Vec::new() });

fn owned() -> MutexGuard<'static, Owned> {
    OWNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts the thread that answers SIGINT and SIGTERM (from then on they no longer end the
/// process by themselves).
pub fn install() -> anyhow::Result<()> {
    let (installed, result) = std::sync::mpsc::channel::<std::io::Result<()>>();
    std::thread::Builder::new().name("fleet-signals".into()).spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => {
                let _ = installed.send(Err(e));
                return;
            }
        };
        let signal = runtime.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let streams = signal(SignalKind::interrupt()).and_then(|i| Ok((i, signal(SignalKind::terminate())?)));
            let (mut interrupt, mut terminate) = match streams {
                Ok(streams) => streams,
                Err(e) => {
                    let _ = installed.send(Err(e));
                    return None;
                }
            };
            let _ = installed.send(Ok(()));
            tokio::select! {
                _ = interrupt.recv() => Some("SIGINT"),
                _ = terminate.recv() => Some("SIGTERM"),
            }
        });
        let Some(signal) = signal else { return };
        eprintln!("kproxy-bench fleet: {signal}: killing every process and removing every namespace the run made");
        clean_up();
        std::process::exit(130);
    })?;
    result.recv()?.map_err(|e| anyhow::anyhow!("installing the SIGINT/SIGTERM handler: {e}"))
}

fn clean_up() {
    let owned = owned();
    for &group in owned.groups.iter().chain(&owned.plane) {
        let _ = killpg(Pid::from_raw(group as i32), Signal::SIGKILL);
    }
    for name in &owned.netns {
        let _ = std::process::Command::new("ip").args(["netns", "del", name]).status();
    }
    for dir in &owned.dirs {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A process group now running (its leader's pid).
pub fn process_group(pid: u32) {
    owned().groups.push(pid);
}

/// A process group stopped by its owner (before it is reaped, so the pid is never another's).
pub fn forget_process_group(pid: u32) {
    owned().groups.retain(|g| *g != pid);
}

/// The control plane's process groups as they are now.
pub fn plane(pids: &[u32]) {
    owned().plane = pids.to_vec();
}

pub fn netns(name: &str) {
    owned().netns.push(name.to_owned());
}

pub fn forget_netns(name: &str) {
    owned().netns.retain(|n| n != name);
}

pub fn dir(path: &Path) {
    owned().dirs.push(path.to_owned());
}

pub fn forget_dir(path: &Path) {
    owned().dirs.retain(|d| d != path);
}
