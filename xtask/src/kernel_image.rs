//! The guest kernel: Debian's packaged kernel, downloaded with apt and unpacked, never installed.
//!
//! The pin below is the one place that names the kernel. Debian drops superseded ABI packages
//! (`-57` → `-58`) from its mirrors, so when the pin can no longer be downloaded the harness falls
//! back to the current `linux-image-amd64` candidate with a warning; bump the pin then.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::packages;
use crate::process;

/// The pinned guest kernel: Debian 12's 6.1 LTS image package and its version.
pub const PINNED_KERNEL: (&str, &str) = ("linux-image-6.1.0-57-amd64", "6.1.192-3");

const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// Written last, so an interrupted fetch is redone.
const COMPLETE: &str = "complete";
const UNPACK_TIMEOUT: Duration = Duration::from_secs(300);

/// An unpacked kernel package: the module tree (with `modules.dep`) and a bootable image.
#[derive(Debug, Clone)]
pub struct KernelTree {
    /// The image package name, e.g. `linux-image-6.1.0-57-amd64`.
    pub package: String,
    /// The package version, e.g. `6.1.192-3`.
    pub version: String,
    /// The kernel release (`uname -r`), e.g. `6.1.0-57-amd64`.
    pub release: String,
    /// The cache directory for this kernel.
    pub cache: PathBuf,
    /// `<cache>/root`: where the .deb was unpacked.
    pub root: PathBuf,
}

impl KernelTree {
    fn is_complete(&self) -> bool {
        self.cache.join(COMPLETE).is_file()
    }

    /// `<root>/lib/modules/<release>`.
    pub fn modules_dir(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.release)
    }

    /// The image qemu boots: the uncompressed ELF `vmlinux` when it could be extracted (PVH
    /// direct boot skips SeaBIOS and the decompressor: ~2.5 s less per boot under TCG), else the
    /// bzImage.
    pub fn boot_image(&self) -> PathBuf {
        let vmlinux = self.cache.join("vmlinux");
        if vmlinux.is_file() { vmlinux } else { self.root.join("boot").join(format!("vmlinuz-{}", self.release)) }
    }
}

/// Downloads and unpacks the pinned kernel (or the fallback) unless it is already cached.
pub fn ensure(layout: &Layout) -> Result<KernelTree> {
    let (package, version) = PINNED_KERNEL;
    let cached = tree(layout, package, version);
    if cached.is_complete() {
        return Ok(cached);
    }
    match fetch(layout, package, version) {
        Ok(tree) => Ok(tree),
        Err(error) => {
            tracing::warn!("pinned kernel {package}={version} is not available ({error}); trying the current one");
            let (package, version) = current_candidate()?;
            let cached = tree(layout, &package, &version);
            if cached.is_complete() {
                return Ok(cached);
            }
            fetch(layout, &package, &version)
        }
    }
}

fn tree(layout: &Layout, package: &str, version: &str) -> KernelTree {
    let cache = layout.kernel_cache(package, version);
    KernelTree {
        package: package.to_owned(),
        version: version.to_owned(),
        release: package.trim_start_matches("linux-image-").to_owned(),
        root: cache.join("root"),
        cache,
    }
}

fn fetch(layout: &Layout, package: &str, version: &str) -> Result<KernelTree> {
    let tree = tree(layout, package, version);
    let download = tree.cache.join("download");
    fs::create_dir_all(&download).map_err(Error::io("create", &download))?;
    tracing::info!("downloading {package}={version}");
    process::run(
        packages::apt_get().current_dir(&download).args(["download", "-qq", &format!("{package}={version}")]),
        DOWNLOAD_TIMEOUT,
    )?;
    let deb = find_deb(&download, package)?;
    if tree.root.exists() {
        fs::remove_dir_all(&tree.root).map_err(Error::io("remove", &tree.root))?;
    }
    tracing::info!("unpacking {}", deb.display());
    process::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree.root), UNPACK_TIMEOUT)?;
    // The .deb ships no modules.dep (its postinst runs depmod); the closure needs one.
    process::run(&mut depmod(&tree.root, &tree.release), UNPACK_TIMEOUT)?;
    extract_vmlinux(&tree)?;
    fs::remove_file(&deb).map_err(Error::io("remove", &deb))?;
    let stamp = tree.cache.join(COMPLETE);
    fs::write(&stamp, b"").map_err(Error::io("write", &stamp))?;
    Ok(tree)
}

/// The image package `linux-image-amd64` currently depends on, with its candidate version.
fn current_candidate() -> Result<(String, String)> {
    let timeout = Duration::from_secs(60);
    let depends = process::output(Command::new("apt-cache").args(["depends", "linux-image-amd64"]), timeout)?;
    let depends = String::from_utf8_lossy(&depends);
    let package = depends
        .lines()
        .filter_map(|line| line.trim().strip_prefix("Depends: "))
        .find(|name| name.starts_with("linux-image-") && name.ends_with("-amd64"))
        .ok_or_else(|| Error::Setup("apt-cache depends linux-image-amd64 names no image package".into()))?
        .to_owned();
    let policy = process::output(Command::new("apt-cache").args(["policy", &package]), timeout)?;
    let version = String::from_utf8_lossy(&policy)
        .lines()
        .find_map(|line| line.trim().strip_prefix("Candidate: ").map(str::to_owned))
        .filter(|version| version != "(none)")
        .ok_or_else(|| Error::Setup(format!("apt has no candidate for {package}")))?;
    Ok((package, version))
}

fn find_deb(dir: &Path, package: &str) -> Result<PathBuf> {
    let entries = fs::read_dir(dir).map_err(Error::io("list", dir))?;
    entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(&format!("{package}_")) && name.ends_with(".deb"))
        })
        .ok_or_else(|| Error::Setup(format!("apt-get download left no {package} .deb in {}", dir.display())))
}

/// kmod's `depmod` on a module tree under `base` (writes text and binary indexes).
pub fn depmod(base: &Path, release: &str) -> Command {
    let mut command = Command::new("depmod");
    command.env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin").arg("-b").arg(base).arg(release);
    command
}

/// Extracts the ELF `vmlinux` from the bzImage's XZ payload (what scripts/extract-vmlinux does).
/// Failure is not fatal: the bzImage boots too, only slower.
fn extract_vmlinux(tree: &KernelTree) -> Result<()> {
    const XZ_MAGIC: &[u8] = b"\xfd7zXZ\x00";
    let bz_image = tree.root.join("boot").join(format!("vmlinuz-{}", tree.release));
    let bytes = fs::read(&bz_image).map_err(Error::io("read", &bz_image))?;
    let Some(offset) = bytes.windows(XZ_MAGIC.len()).position(|window| window == XZ_MAGIC) else {
        tracing::warn!("no XZ payload in {}; booting the bzImage", bz_image.display());
        return Ok(());
    };
    let target = tree.cache.join("vmlinux");
    let partial = tree.cache.join("vmlinux.partial");
    let file = fs::File::create(&partial).map_err(Error::io("create", &partial))?;
    let mut xz =
        process::spawn(Command::new("xz").args(["-dcq"]).stdin(Stdio::piped()).stdout(file).stderr(Stdio::null()))?;
    if let Some(mut stdin) = xz.stdin.take() {
        // The payload is followed by padding, so xz exits early and this write may fail.
        let _ = stdin.write_all(&bytes[offset..]);
    }
    let _ = process::wait_with_deadline(&mut xz, UNPACK_TIMEOUT, "xz -dc")?;
    let mut head = [0_u8; 4];
    let is_elf =
        fs::File::open(&partial).and_then(|mut file| file.read_exact(&mut head)).is_ok() && &head == b"\x7fELF";
    if is_elf {
        fs::rename(&partial, &target).map_err(Error::io("rename", &partial))?;
    } else {
        tracing::warn!("the XZ payload of {} is not an ELF image; booting the bzImage", bz_image.display());
        fs::remove_file(&partial).map_err(Error::io("remove", &partial))?;
    }
    Ok(())
}
