//! The record of everything a cluster run made on this machine, written before each thing is
//! made, so that `down` can undo a run that crashed (or was killed) from the file alone.
//!
//! Cleanup goes by kind in a fixed order, not in creation order: processes first (nothing may
//! hold a mount, a cgroup or a namespace any more), then pod namespaces (found through the node
//! namespaces' veths), mounts, files other programs left in global places, cgroups, the node
//! namespaces, and the global sysctls last (a kubelet started late could rewrite them).

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// One thing a run made that must not outlive it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Resource {
    /// A process we started (pid + kernel start time, so a reused pid is never signalled).
    Process { name: String, pid: i32, start_time: u64 },
    /// A network namespace pinned at `/run/netns/<name>`.
    Netns { name: String },
    /// A containerd of ours: its shims (and their sockets in `/run/containerd/s`, which
    /// containerd 1.6 puts there whatever its state dir) and the pod namespaces its CNI made.
    Containerd { address: PathBuf, state: PathBuf, node_netns: String },
    /// A cgroup folder `/<name>` in every v1 hierarchy (and the unified one): the kubelet's
    /// cgroupRoot. Everything below is killed, then removed.
    CgroupRoot { name: String },
    /// Every mount point below this directory is unmounted.
    MountsUnder { dir: PathBuf },
    /// Symlinks the kubelet writes in `/var/log/containers` that point into this pod log dir.
    ContainerLogLinks { pods_log_dir: PathBuf },
    /// libcni's cache in `/var/lib/cni/results` for a network name of ours.
    CniCache { network: String },
    /// A global sysctl and the value it had before the run.
    Sysctl { key: String, original: String },
    /// A machine-global limit the run raised (inotify instances: every kubelet takes several):
    /// put back only by the last cluster down, since lowering it under a running cluster would
    /// fail that cluster's next kubelet or container.
    RaisedLimit { key: String, original: String },
    /// A directory removed at the end.
    Dir { path: PathBuf },
}

/// The ledger file and its contents.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    resources: BTreeSet<Resource>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    resources: Vec<Resource>,
}

impl Ledger {
    /// Opens the ledger at `path`, empty if the file does not exist.
    pub fn open(path: &Path) -> Result<Ledger> {
        let resources = match fs::read(path) {
            Ok(bytes) => serde_json::from_slice::<File>(&bytes)
                .with_context(|| format!("reading the cluster ledger {}", path.display()))?
                .resources
                .into_iter()
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        Ok(Ledger { path: path.to_owned(), resources })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    pub fn resources(&self) -> impl Iterator<Item = &Resource> {
        self.resources.iter()
    }

    /// Records `resource` and writes the file (atomically) before returning.
    pub fn add(&mut self, resource: Resource) -> Result<()> {
        if self.resources.insert(resource) {
            self.save()?;
        }
        Ok(())
    }

    /// Records a process started by us.
    pub fn add_process(&mut self, name: &str, pid: u32) -> Result<()> {
        let pid = i32::try_from(pid).context("pid out of range")?;
        let start_time = start_time(pid).with_context(|| format!("{name} (pid {pid}) exited at once"))?;
        self.add(Resource::Process { name: name.to_owned(), pid, start_time })
    }

    /// Records a global sysctl's current value, unless it is already recorded (the first value
    /// seen is the machine's own; later ones may be a kubelet's).
    pub fn add_sysctl(&mut self, key: &str) -> Result<()> {
        if self.resources.iter().any(|r| matches!(r, Resource::Sysctl { key: k, .. } if k == key)) {
            return Ok(());
        }
        // While another cluster of this harness is up, its kubelet has already rewritten the
        // value: the machine's own value is the one that cluster recorded.
        let original = match original_recorded_by_another_cluster(&self.path, key) {
            Some(original) => original,
            None => read_sysctl(key)?,
        };
        self.add(Resource::Sysctl { key: key.to_owned(), original })
    }

    /// Raises the machine-global limit `key` to at least `minimum`, recording the machine's own
    /// value first (another cluster of this harness that is up may have raised it already: its
    /// record holds the machine's value).
    pub fn raise_limit(&mut self, key: &str, minimum: u64) -> Result<()> {
        if !self.resources.iter().any(|r| matches!(r, Resource::RaisedLimit { key: k, .. } if k == key)) {
            let original = match limit_recorded_by_another_cluster(&self.path, key) {
                Some(original) => original,
                None => read_sysctl(key)?,
            };
            self.add(Resource::RaisedLimit { key: key.to_owned(), original })?;
        }
        let now: u64 = read_sysctl(key)?.parse().with_context(|| format!("sysctl {key} is not a number"))?;
        if now < minimum {
            tracing::info!("raising global sysctl {key}: {now} -> {minimum}");
            fs::write(sysctl_path(key), minimum.to_string()).with_context(|| format!("writing sysctl {key}"))?;
        }
        Ok(())
    }

    /// Puts back the limits this run raised, unless another cluster still records them.
    fn restore_limits(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for resource in &self.resources {
            if let Resource::RaisedLimit { key, original } = resource {
                if limit_recorded_by_another_cluster(&self.path, key).is_some() {
                    tracing::info!("global sysctl {key} stays raised: another cluster is up");
                    continue;
                }
                if read_sysctl(key).is_ok_and(|now| now != *original) {
                    tracing::info!("restoring global sysctl {key} to {original}");
                    if let Err(e) = fs::write(sysctl_path(key), original) {
                        problems.push(format!("sysctl {key}: {e}"));
                    }
                }
            }
        }
        problems
    }

    fn save(&self) -> Result<()> {
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension("tmp");
        let file = File { resources: self.resources.iter().cloned().collect() };
        let mut out = fs::File::create(&tmp)?;
        out.write_all(&serde_json::to_vec_pretty(&file)?)?;
        out.sync_all()?;
        fs::rename(&tmp, &self.path)?;
        Ok(())
    }

    /// Puts the global sysctls back as they were before the run (kubelet rewrites some at start).
    pub fn restore_sysctls(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for resource in &self.resources {
            if let Resource::Sysctl { key, original } = resource {
                match read_sysctl(key) {
                    Ok(now) if now == *original => {}
                    Ok(now) => {
                        tracing::info!("restoring global sysctl {key}: {now} -> {original}");
                        if let Err(e) = fs::write(sysctl_path(key), original) {
                            problems.push(format!("sysctl {key}: {e}"));
                        }
                    }
                    Err(e) => problems.push(format!("sysctl {key}: {e}")),
                }
            }
        }
        problems
    }

    /// Undoes everything recorded; what could not be undone is reported, the rest still done.
    /// The file is removed only when everything went.
    pub fn cleanup(mut self) -> Result<()> {
        let mut problems = Vec::new();
        let all: Vec<Resource> = self.resources.iter().cloned().collect();
        // 1. Processes: ours, then containerd's shims, then whatever runs in our cgroups.
        let ours: Vec<(String, i32, u64)> = all
            .iter()
            .filter_map(|r| match r {
                Resource::Process { name, pid, start_time } => Some((name.clone(), *pid, *start_time)),
                _ => None,
            })
            .collect();
        stop_processes(&ours);
        for r in &all {
            if let Resource::Containerd { address, .. } = r {
                let shims = processes_with_arg(&address.to_string_lossy());
                stop_processes(&shims);
            }
        }
        for r in &all {
            if let Resource::CgroupRoot { name } = r {
                kill_cgroup_tree(name);
            }
        }
        // 2. Pod network namespaces, found through the veths in the node namespace.
        for r in &all {
            if let Resource::Containerd { node_netns, .. } = r {
                for pod_ns in pod_namespaces(node_netns) {
                    if let Err(e) = run("ip", &["netns", "del", &pod_ns]) {
                        problems.push(format!("pod netns {pod_ns}: {e}"));
                    }
                }
            }
        }
        // 3. Mounts (deepest first).
        for r in &all {
            if let Resource::MountsUnder { dir } = r {
                problems.extend(unmount_under(dir));
            }
        }
        // 4. Files other programs left in global places.
        for r in &all {
            match r {
                Resource::Containerd { address, state, .. } => {
                    remove_shim_sockets(address, state);
                    remove_loopback_cache(state);
                }
                Resource::ContainerLogLinks { pods_log_dir } => remove_log_links(pods_log_dir),
                Resource::CniCache { network } => remove_cni_cache(network),
                _ => {}
            }
        }
        // 5. Cgroups.
        for r in &all {
            if let Resource::CgroupRoot { name } = r {
                problems.extend(remove_cgroup_tree(name));
            }
        }
        // 6. Node namespaces (their veths go with them).
        for r in &all {
            if let Resource::Netns { name } = r
                && Path::new("/run/netns").join(name).exists()
                && let Err(e) = run("ip", &["netns", "del", name])
            {
                problems.push(format!("netns {name}: {e}"));
            }
        }
        // 7. Sysctls.
        problems.extend(self.restore_sysctls());
        problems.extend(self.restore_limits());
        // 8. Directories.
        for r in &all {
            if let Resource::Dir { path } = r
                && path.exists()
                && let Err(e) = fs::remove_dir_all(path)
            {
                problems.push(format!("dir {}: {e}", path.display()));
            }
        }
        if problems.is_empty() {
            self.resources.clear();
            let _ = fs::remove_file(&self.path);
            Ok(())
        } else {
            anyhow::bail!("cleanup left {} problem(s): {}", problems.len(), problems.join("; "))
        }
    }
}

/// `/proc/<pid>/stat` field 22 (start time in clock ticks since boot).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Running (not a zombie) and still the process we started.
fn alive(pid: i32, start: u64) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let zombie = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3)).is_some_and(|state| state == "Z");
    !zombie && start_time(pid) == Some(start)
}

/// SIGTERM, up to 5 s, then SIGKILL; only processes whose start time still matches.
fn stop_processes(procs: &[(String, i32, u64)]) {
    let live: Vec<&(String, i32, u64)> = procs.iter().filter(|(_, pid, st)| alive(*pid, *st)).collect();
    for (name, pid, _) in &live {
        tracing::debug!("stopping {name} (pid {pid})");
        let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && live.iter().any(|(_, pid, st)| alive(*pid, *st)) {
        thread::sleep(Duration::from_millis(100));
    }
    for (name, pid, st) in &live {
        if alive(*pid, *st) {
            tracing::info!("{name} (pid {pid}) still runs 5 s after SIGTERM: SIGKILL");
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline && live.iter().any(|(_, pid, st)| alive(*pid, *st)) {
        thread::sleep(Duration::from_millis(50));
    }
}

/// Processes whose command line has `arg` as one of its arguments (containerd's shims name
/// their containerd's socket with `-address`).
fn processes_with_arg(arg: &str) -> Vec<(String, i32, u64)> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        if args.iter().skip(1).any(|a| *a == arg.as_bytes())
            && let Some(st) = start_time(pid)
        {
            let name = String::from_utf8_lossy(args[0]).into_owned();
            found.push((name, pid, st));
        }
    }
    found
}

/// The cgroup hierarchies mounted under /sys/fs/cgroup (v1 controllers and the unified one).
fn hierarchies() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else { return dirs };
    for line in mounts.lines() {
        let mut f = line.split_whitespace();
        let (_, Some(point), Some(fstype)) = (f.next(), f.next(), f.next()) else { continue };
        if (fstype == "cgroup" || fstype == "cgroup2") && point.starts_with("/sys/fs/cgroup") {
            dirs.push(PathBuf::from(point));
        }
    }
    dirs
}

/// Every cgroup directory at or below `/<name>` in every hierarchy, deepest first.
fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    walk(&entry.path(), out);
                }
            }
        }
        out.push(dir.to_owned());
    }
    let mut out = Vec::new();
    for h in hierarchies() {
        let root = h.join(name.trim_start_matches('/'));
        if root.is_dir() {
            walk(&root, &mut out);
        }
    }
    out
}

/// SIGKILLs every process in the cgroup tree (containers: their shims are gone by now).
fn kill_cgroup_tree(name: &str) {
    for _ in 0..50 {
        let mut any = false;
        for dir in cgroup_dirs(name) {
            if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    any = true;
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
        if !any {
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Creates `/<name>` in every v1 hierarchy (cpuset needs its cpus and mems copied from the root,
/// or no task can join it) and returns the folders made.
pub fn make_cgroup_root(name: &str) -> Result<()> {
    for h in hierarchies() {
        let dir = h.join(name.trim_start_matches('/'));
        fs::create_dir_all(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
        for knob in ["cpuset.cpus", "cpuset.mems"] {
            let parent = h.join(knob);
            if parent.exists() {
                let value = fs::read_to_string(&parent)?;
                fs::write(dir.join(knob), value.trim()).with_context(|| format!("{}", dir.join(knob).display()))?;
            }
        }
    }
    Ok(())
}

fn remove_cgroup_tree(name: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for dir in cgroup_dirs(name) {
        let mut last = None;
        for _ in 0..50 {
            match fs::remove_dir(&dir) {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
            thread::sleep(Duration::from_millis(100));
        }
        if let Some(e) = last {
            problems.push(format!("cgroup {}: {e}", dir.display()));
        }
    }
    problems
}

/// Pod network namespaces that the node namespace's veths lead to (`link-netns cni-…`).
fn pod_namespaces(node_netns: &str) -> Vec<String> {
    if !Path::new("/run/netns").join(node_netns).exists() {
        return Vec::new();
    }
    let Ok(out) = Command::new("ip").args(["-n", node_netns, "-o", "link", "show", "type", "veth"]).output() else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        while let Some(word) = words.next() {
            if word == "link-netns"
                && let Some(ns) = words.next()
                && ns.starts_with("cni-")
            {
                names.insert(ns.to_owned());
            }
        }
    }
    names.into_iter().collect()
}

/// Unmounts (lazily) every mount point at or below `dir`, deepest first.
fn unmount_under(dir: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for _ in 0..5 {
        let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else { break };
        let mut points: Vec<PathBuf> = info
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4))
            .map(unescape_mount_path)
            .filter(|p| p.starts_with(dir))
            .collect();
        if points.is_empty() {
            return problems;
        }
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        problems.clear();
        for point in points {
            if let Err(e) = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
                problems.push(format!("umount {}: {e}", point.display()));
            }
        }
    }
    problems
}

fn unescape_mount_path(field: &str) -> PathBuf {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 4]).ok().and_then(|s| u8::from_str_radix(s, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

/// containerd 1.6 puts each shim's socket at `/run/containerd/s/<sha256(address/ns/id)>`,
/// whatever its own state dir; a killed shim leaves it behind.
fn remove_shim_sockets(address: &Path, state: &Path) {
    use sha2::Digest;
    let tasks = state.join("io.containerd.runtime.v2.task");
    let Ok(namespaces) = fs::read_dir(&tasks) else { return };
    for ns in namespaces.flatten() {
        let Ok(ids) = fs::read_dir(ns.path()) else { continue };
        for id in ids.flatten() {
            let key = address.join(ns.file_name()).join(id.file_name());
            let digest = sha2::Sha256::digest(key.as_os_str().as_encoded_bytes());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            let socket = Path::new("/run/containerd/s").join(hex);
            if socket.exists() {
                let _ = fs::remove_file(&socket);
            }
        }
    }
}

/// containerd's CRI sets up each sandbox's loopback through libcni, whose cache
/// (`/var/lib/cni/results/cni-loopback-<sandbox id>-lo`) outlives a sandbox that was not removed.
fn remove_loopback_cache(state: &Path) {
    let Ok(sandboxes) = fs::read_dir(state.join("io.containerd.grpc.v1.cri").join("sandboxes")) else { return };
    for sandbox in sandboxes.flatten() {
        let cache = Path::new("/var/lib/cni/results")
            .join(format!("cni-loopback-{}-lo", sandbox.file_name().to_string_lossy()));
        let _ = fs::remove_file(cache);
    }
}

fn remove_log_links(pods_log_dir: &Path) {
    let Ok(entries) = fs::read_dir("/var/log/containers") else { return };
    for entry in entries.flatten() {
        if let Ok(target) = fs::read_link(entry.path())
            && target.starts_with(pods_log_dir)
        {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn remove_cni_cache(network: &str) {
    let Ok(entries) = fs::read_dir("/var/lib/cni/results") else { return };
    let prefix = format!("{network}-");
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

fn sysctl_path(key: &str) -> PathBuf {
    Path::new("/proc/sys").join(key.replace('.', "/"))
}

pub fn read_sysctl(key: &str) -> Result<String> {
    Ok(fs::read_to_string(sysctl_path(key)).with_context(|| format!("reading sysctl {key}"))?.trim().to_owned())
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        anyhow::bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The machine's own value of limit `key` as another cluster beside the one at `ledger` recorded
/// it when it raised it, if one that is still up did.
fn limit_recorded_by_another_cluster(ledger: &Path, key: &str) -> Option<String> {
    other_ledgers(ledger).find_map(|other| {
        other.resources().find_map(|resource| match resource {
            Resource::RaisedLimit { key: k, original } if k == key => Some(original.clone()),
            _ => None,
        })
    })
}

/// The ledgers of the other clusters beside the one at `ledger` (the directories next to its
/// own, each with a `ledger.json`).
fn other_ledgers(ledger: &Path) -> impl Iterator<Item = Ledger> {
    let own_dir = ledger.parent().map(Path::to_path_buf);
    let file = ledger.file_name().map(ToOwned::to_owned);
    let siblings = own_dir.as_deref().and_then(Path::parent).and_then(|parent| fs::read_dir(parent).ok());
    siblings.into_iter().flatten().flatten().filter_map(move |entry| {
        let dir = entry.path();
        if Some(&dir) == own_dir.as_ref() {
            return None;
        }
        Ledger::open(&dir.join(file.as_ref()?)).ok()
    })
}

/// The original value of sysctl `key` in the ledger of another cluster beside the one at
/// `ledger` (the directories next to its own, each with a `ledger.json`), if one recorded it.
/// Two clusters up at once otherwise leave the first one's kubelet values behind: the second
/// records them as the originals and puts them back last.
fn original_recorded_by_another_cluster(ledger: &Path, key: &str) -> Option<String> {
    other_ledgers(ledger).find_map(|other| {
        other.resources().find_map(|resource| match resource {
            Resource::Sysctl { key: k, original } if k == key => Some(original.clone()),
            _ => None,
        })
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_sysctl_another_cluster_recorded_keeps_that_clusters_original_and_only_while_it_is_recorded() {
        let root = std::env::temp_dir().join(format!("kproxy-ledger-test-{}", std::process::id()));
        let (first, second) = (root.join("kproxy-cluster-a/ledger.json"), root.join("kproxy-cluster-b/ledger.json"));
        let mut a = Ledger::open(&first).unwrap();
        a.add(Resource::Sysctl { key: "kernel.panic".into(), original: "1".into() }).unwrap();
        // The second cluster sees the first's record, not the machine's current value.
        assert_eq!(original_recorded_by_another_cluster(&second, "kernel.panic").as_deref(), Some("1"));
        assert_eq!(original_recorded_by_another_cluster(&second, "vm.overcommit_memory"), None, "not recorded");
        assert_eq!(original_recorded_by_another_cluster(&first, "kernel.panic"), None, "its own ledger does not count");
        fs::remove_file(&first).unwrap();
        assert_eq!(original_recorded_by_another_cluster(&second, "kernel.panic"), None, "the first is down");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_raised_limit_is_put_back_only_by_the_last_cluster_that_recorded_it() {
        let root = std::env::temp_dir().join(format!("kproxy-ledger-limit-test-{}", std::process::id()));
        let (first, second) = (root.join("kproxy-cluster-a/ledger.json"), root.join("kproxy-cluster-b/ledger.json"));
        let key = "fs.inotify.max_user_instances";
        let mut a = Ledger::open(&first).unwrap();
        a.add(Resource::RaisedLimit { key: key.into(), original: "128".into() }).unwrap();
        assert_eq!(limit_recorded_by_another_cluster(&second, key).as_deref(), Some("128"), "b sees a's original");
        assert_eq!(limit_recorded_by_another_cluster(&first, key), None, "its own ledger does not count");
        assert_eq!(original_recorded_by_another_cluster(&second, key), None, "a raised limit is not a kubelet sysctl");
        fs::remove_file(&first).unwrap();
        assert_eq!(limit_recorded_by_another_cluster(&second, key), None, "a is down: b puts it back");
        fs::remove_dir_all(&root).unwrap();
    }
}
