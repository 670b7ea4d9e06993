//! The guest's initramfs: static busybox, the kernel modules the tests need (with their dependency
//! closure and a `modules.dep`), and `/init` (init.sh). It is rebuilt only when its inputs change:
//! the file name carries a hash of the init script, the module lists and busybox.
//!
//! Host tools (nft, ipvsadm, python3, test binaries, …) are not copied in: the guest runs them
//! from the host's own root filesystem shared over 9p, so they need no separate packaging.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cpio::Archive;
use crate::error::{Error, Result};
use crate::kernel_image::{self, KernelTree};
use crate::process;

/// Whole module directories (relative to the module tree): everything netfilter, IPVS, bridge,
/// SCTP, plus the 9p and overlay filesystems the guest mounts the host with.
const MODULE_DIRS: &[&str] = &[
    "kernel/net/netfilter",
    "kernel/net/ipv4/netfilter",
    "kernel/net/ipv6/netfilter",
    "kernel/net/bridge",
    "kernel/net/sctp",
    "kernel/net/9p",
    "kernel/fs/9p",
    "kernel/fs/overlayfs",
];

/// Single modules outside those directories (dependencies are added automatically).
const MODULES: &[&str] = &["veth", "dummy", "macvlan", "ipvlan", "crc32c_generic", "virtio_pci", "virtio_rng"];

/// Loaded at boot, in this order. Everything else in the initramfs loads on demand through the
/// kernel's autoloader (nft expressions, xt matches, ipset types, link kinds).
/// crc32c_generic comes first: libcrc32c needs it (a soft dependency busybox does not follow).
///
/// Every IPVS scheduler kproxy offers is preloaded too. Some (lblc, lblcr) register per-namespace
/// state, and loading them takes the kernel's lock on per-namespace operations for writing, which
/// waits for every namespace being torn down. Under TCG, with the namespaces of the test binaries
/// before still going away, a scheduler autoloaded in the middle of the IPVS tests stalled them
/// past the guest's timeout (seen twice in a full `guest-test`, never in a binary run alone).
const PRELOAD: &[&str] = &[
    "crc32c_generic",
    "virtio_pci",
    "virtio_rng",
    "9pnet_virtio",
    "9p",
    "overlay",
    "veth",
    "dummy",
    "bridge",
    "br_netfilter",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_tables",
    "nft_ct",
    "nft_chain_nat",
    "nft_compat",
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_lc",
    "ip_vs_wlc",
    "ip_vs_lblc",
    "ip_vs_lblcr",
    "ip_vs_sh",
    "ip_vs_dh",
    "ip_vs_sed",
    "ip_vs_nq",
    "ip_vs_mh",
    "nf_flow_table_inet",
    "nft_flow_offload",
    "sctp",
];

const INIT_SCRIPT: &str = include_str!("init.sh");
const BUSYBOX: &str = "/bin/busybox";
const BUILD_TIMEOUT: Duration = Duration::from_secs(300);

/// Builds the initramfs for `kernel` unless an identical one is cached; returns its path.
pub fn ensure(kernel: &KernelTree) -> Result<PathBuf> {
    let init = INIT_SCRIPT.replace("@PRELOAD@", &PRELOAD.join(" ")).replace("@RELEASE@", &kernel.release);
    let busybox = fs::read(BUSYBOX).map_err(Error::io("read", BUSYBOX))?;
    let key = fnv1a(&[init.as_bytes(), MODULE_DIRS.join(",").as_bytes(), MODULES.join(",").as_bytes(), &busybox]);
    let image = kernel.cache.join(format!("initramfs-{key:016x}.cpio"));
    if image.is_file() {
        return Ok(image);
    }
    tracing::info!("building the initramfs for {}", kernel.release);
    let stage = kernel.cache.join("initramfs-stage");
    if stage.exists() {
        fs::remove_dir_all(&stage).map_err(Error::io("remove", &stage))?;
    }
    stage_busybox(&stage, &busybox)?;
    stage_modules(kernel, &stage)?;
    write(&stage.join("init"), init.as_bytes(), 0o755)?;
    let mut archive = Archive::default();
    archive.add_tree(&stage)?;
    let partial = image.with_extension("partial");
    fs::write(&partial, archive.finish()).map_err(Error::io("write", &partial))?;
    fs::rename(&partial, &image).map_err(Error::io("rename", &partial))?;
    fs::remove_dir_all(&stage).map_err(Error::io("remove", &stage))?;
    Ok(image)
}

/// busybox plus a symlink per applet; `/sbin/modprobe` is the path the kernel's autoloader runs.
fn stage_busybox(stage: &Path, busybox: &[u8]) -> Result<()> {
    for dir in ["bin", "sbin", "dev", "proc", "sys", "tmp", "lib/modules"] {
        let path = stage.join(dir);
        fs::create_dir_all(&path).map_err(Error::io("create", &path))?;
    }
    write(&stage.join("bin/busybox"), busybox, 0o755)?;
    let list = process::output(Command::new(BUSYBOX).arg("--list-full"), BUILD_TIMEOUT)?;
    for applet in String::from_utf8_lossy(&list).lines() {
        let applet = applet.trim().trim_start_matches("usr/");
        let link = stage.join(applet);
        if applet.is_empty() || applet.ends_with("/busybox") || link.exists() {
            continue;
        }
        let depth = applet.matches('/').count();
        let target = format!("{}bin/busybox", "../".repeat(depth));
        if let Some(parent) = link.parent() {
            fs::create_dir_all(parent).map_err(Error::io("create", parent))?;
        }
        std::os::unix::fs::symlink(&target, &link).map_err(Error::io("symlink", &link))?;
    }
    Ok(())
}

/// Copies the wanted modules and their dependency closure, then runs depmod on the copy.
fn stage_modules(kernel: &KernelTree, stage: &Path) -> Result<()> {
    let source = kernel.modules_dir();
    let dep_path = source.join("modules.dep");
    let dep_text = fs::read_to_string(&dep_path).map_err(Error::io("read", &dep_path))?;
    let deps = parse_modules_dep(&dep_text);
    let by_name: HashMap<String, &str> = deps.keys().map(|path| (module_name(path), path.as_str())).collect();

    let mut wanted: Vec<&str> = deps
        .keys()
        .filter(|path| MODULE_DIRS.iter().any(|dir| path.starts_with(&format!("{dir}/"))))
        .map(String::as_str)
        .collect();
    for name in MODULES.iter().chain(PRELOAD) {
        match by_name.get(&name.replace('-', "_")) {
            Some(path) => wanted.push(path),
            None => tracing::warn!("kernel {} has no module {name} (built in or absent)", kernel.release),
        }
    }
    let closure = dependency_closure(&wanted, &deps);
    let target = stage.join("lib/modules").join(&kernel.release);
    for relative in &closure {
        let to = target.join(relative);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).map_err(Error::io("create", parent))?;
        }
        let from = source.join(relative);
        fs::copy(&from, &to).map_err(Error::io("copy", &from))?;
    }
    for index in ["modules.builtin", "modules.builtin.modinfo", "modules.order"] {
        let from = source.join(index);
        if from.is_file() {
            fs::copy(&from, target.join(index)).map_err(Error::io("copy", &from))?;
        }
    }
    process::run(kernel_image::depmod(stage, &kernel.release).stdout(std::process::Stdio::null()), BUILD_TIMEOUT)
}

/// `modules.dep` as module path → direct (or full, depending on the writer) dependency paths.
fn parse_modules_dep(text: &str) -> HashMap<String, Vec<String>> {
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(module, deps)| (module.trim().to_owned(), deps.split_whitespace().map(str::to_owned).collect()))
        .collect()
}

/// Every module in `wanted` plus everything they depend on, transitively.
fn dependency_closure(wanted: &[&str], deps: &HashMap<String, Vec<String>>) -> BTreeSet<String> {
    let mut closure = BTreeSet::new();
    let mut todo: Vec<String> = wanted.iter().map(|path| (*path).to_owned()).collect();
    while let Some(path) = todo.pop() {
        if closure.insert(path.clone()) {
            todo.extend(deps.get(&path).into_iter().flatten().cloned());
        }
    }
    closure
}

/// `kernel/net/netfilter/nf_nat.ko` → `nf_nat` (dashes normalised to underscores like modprobe).
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

fn write(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, bytes).map_err(Error::io("write", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(Error::io("chmod", path))
}

/// FNV-1a over several byte strings: a stable cache key that needs no dependency.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.iter().chain(&[0xff]) {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closure_follows_dependencies_transitively() {
        let deps =
            parse_modules_dep("kernel/a.ko: kernel/b.ko\nkernel/b.ko: kernel/c.ko.xz\nkernel/c.ko.xz:\nkernel/d.ko:\n");
        let closure = dependency_closure(&["kernel/a.ko"], &deps);
        let expected: BTreeSet<String> = ["kernel/a.ko", "kernel/b.ko", "kernel/c.ko.xz"].map(String::from).into();
        assert_eq!(closure, expected);
    }

    #[test]
    fn module_names_are_normalised_like_modprobe() {
        assert_eq!(module_name("kernel/arch/x86/crypto/crc32c-intel.ko"), "crc32c_intel");
        assert_eq!(module_name("kernel/net/netfilter/nf_nat.ko.xz"), "nf_nat");
    }

    #[test]
    fn cache_key_depends_on_every_part() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"ab"]), fnv1a(&[b"ab"]));
    }
}
