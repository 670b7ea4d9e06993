//! `cargo xtask image`: kproxy's container image as an OCI archive, with no docker daemon and no
//! registry pulls. `deploy/Containerfile` stays the one definition of the image:
//!
//! 1. the release binary is built on the host (`cargo build --release --locked -p kproxy`);
//! 2. the base, a `debian:bookworm-slim` equivalent, is made from Debian's packages by mmdebstrap
//!    (minbase, merged /usr, no docs/man/locales, like the official slim image) and cached as a
//!    tarball under `target/image/base/`, keyed by everything that shapes it;
//! 3. buildah builds the Containerfile's `prebuilt` stage with `BASE` set to that base, with its
//!    storage (vfs driver: no mounts to leak) under `target/image/`, and `--layers`, so a rebuild
//!    only redoes the layer of the binary;
//! 4. `buildah push` writes the OCI archive, which is then checked for real (unless
//!    `--no-verify`): imported into a throwaway containerd (own root, state and socket in a
//!    temporary directory under `target/image/`) with `ctr images import`, and run with runc:
//!    `kproxy --version` must print what the host binary prints, the iptables tools of both
//!    backends must answer, and `/bin/sh` must not exist. Everything the check made is
//!    removed, on failure too.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::packages;
use crate::process;

/// The name the image is built, archived and imported under.
pub const IMAGE_NAME: &str = "localhost/kproxy:dev";
/// The archive, relative to the target directory.
pub const ARCHIVE: &str = "image/kproxy.oci.tar";

pub const USAGE: &str = "cargo xtask image [--rebuild-base] [--no-verify] [--binary PATH]
    builds deploy/Containerfile (stage `prebuilt`) on a Debian bookworm-slim base made by mmdebstrap,
    writes target/image/kproxy.oci.tar (image localhost/kproxy:dev) and checks it in a throwaway
    containerd; import it with `ctr -n k8s.io images import target/image/kproxy.oci.tar`.
    --rebuild-base  make the base again (it is cached in target/image/base)
    --no-verify     skip the containerd check
    --binary PATH   put this kproxy in the image instead of a release build";

/// Debian packages the build and the check call.
const PACKAGES: &[&str] = &["mmdebstrap", "buildah", "containerd", "runc"];

/// Where the base's packages come from (the machine's apt reaches deb.debian.org).
const MIRRORS: &[&str] = &[
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];

/// What the official slim images leave out (debuerreotype's slimify list), kept in the base's
/// dpkg configuration so the Containerfile's `apt-get install` leaves them out too.
const DPKG_EXCLUDES: &[&str] = &[
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/groff/*",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
];

pub(crate) const BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(15 * 60);
pub(crate) const QUICK_TIMEOUT: Duration = Duration::from_secs(120);
/// The containerd namespace of the check (and its cgroup directory name).
const CHECK_NAMESPACE: &str = "kproxy-image-check";

#[derive(Debug, Default)]
struct Options {
    rebuild_base: bool,
    verify: bool,
    /// A kproxy binary built beforehand (`cargo build --release` is skipped).
    binary: Option<PathBuf>,
}

fn parse(args: &[std::ffi::OsString]) -> Result<Options> {
    let mut options = Options { verify: true, ..Options::default() };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--rebuild-base") => options.rebuild_base = true,
            Some("--no-verify") => options.verify = false,
            Some("--binary") => {
                let path = args.next().ok_or_else(|| Error::Usage(USAGE.into()))?;
                options.binary = Some(std::path::absolute(path).map_err(Error::io("resolving", path))?);
            }
            _ => return Err(Error::Usage(USAGE.into())),
        }
    }
    Ok(options)
}

/// Runs `cargo xtask image ARGS`.
pub fn run(layout: &Layout, args: &[std::ffi::OsString]) -> Result<i32> {
    let options = parse(args)?;
    let started = Instant::now();
    ensure_packages()?;
    let dirs = Dirs::new(layout);
    fs::create_dir_all(&dirs.root).map_err(Error::io("creating", &dirs.root))?;

    let binary = match options.binary {
        Some(binary) => binary,
        None => build_binary(layout)?,
    };
    let built = started.elapsed();
    let base = Base::new(&dirs);
    base.ensure(&dirs, options.rebuild_base)?;
    let based = started.elapsed();
    build_image(layout, &dirs, &base, &binary)?;
    let archive = layout.target.join(ARCHIVE);
    push(&dirs, IMAGE_NAME, &archive)?;
    let imaged = started.elapsed();
    let summary = Summary::read(&archive)?;
    let unpacked =
        process::output(dirs.buildah().args(["images", "--format", "{{.Size}}", IMAGE_NAME]), QUICK_TIMEOUT)?;
    let unpacked = String::from_utf8_lossy(&unpacked).trim().to_owned();
    let checked = if summary.entrypoint != ["/usr/local/bin/kproxy"] {
        Err(Error::Setup(format!("the image's entrypoint is {:?}", summary.entrypoint)))
    } else if options.verify {
        process::output(Command::new(&binary).arg("--version"), QUICK_TIMEOUT)
            .and_then(|expected| verify(&dirs, &archive, &String::from_utf8_lossy(&expected)))
    } else {
        Ok(())
    };
    if let Err(error) = checked {
        // Nothing may import an archive that failed its check.
        let _ = fs::remove_file(&archive);
        return Err(Error::Setup(format!("the image failed its check ({} removed): {error}", archive.display())));
    }
    tracing::info!(
        "image {IMAGE_NAME}: {} ({:.1} MiB archive, {} layers of {:.1} MiB compressed, {} unpacked); {:.1} s in all \
         (binary {:.1} s, base {:.1} s, image {:.1} s, check {:.1} s)",
        archive.display(),
        mib(summary.archive_bytes),
        summary.layers,
        mib(summary.layer_bytes),
        unpacked,
        started.elapsed().as_secs_f64(),
        built.as_secs_f64(),
        (based - built).as_secs_f64(),
        (imaged - based).as_secs_f64(),
        (started.elapsed() - imaged).as_secs_f64(),
    );
    Ok(0)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The image's working directories, all under `target/image/`.
pub(crate) struct Dirs {
    pub(crate) root: PathBuf,
    storage: PathBuf,
    runroot: PathBuf,
    base: PathBuf,
}

impl Dirs {
    pub(crate) fn new(layout: &Layout) -> Dirs {
        let root = layout.target.join("image");
        Dirs { storage: root.join("storage"), runroot: root.join("run"), base: root.join("base"), root }
    }

    /// buildah on this storage (vfs: plain directories, nothing mounted between commands).
    pub(crate) fn buildah(&self) -> Command {
        let mut command = Command::new("buildah");
        command
            .arg("--root")
            .arg(&self.storage)
            .arg("--runroot")
            .arg(&self.runroot)
            .args(["--storage-driver", "vfs"])
            .env("BUILDAH_ISOLATION", "chroot");
        command
    }
}

pub(crate) fn ensure_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|name| !is_installed(name)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    tracing::info!("installing Debian packages: {}", missing.join(" "));
    process::run(packages::apt_get().args(["update", "-qq"]), STEP_TIMEOUT)?;
    process::run(
        packages::apt_get()
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .stdout(Stdio::null()),
        STEP_TIMEOUT,
    )
}

fn is_installed(package: &str) -> bool {
    let output = process::output(
        Command::new("dpkg-query").args(["-W", "-f=${Status}", package]).stderr(Stdio::null()),
        QUICK_TIMEOUT,
    );
    matches!(output, Ok(bytes) if String::from_utf8_lossy(&bytes).contains("install ok installed"))
}

/// `cargo build --release --locked -p kproxy`; returns the binary's path.
fn build_binary(layout: &Layout) -> Result<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    process::run(
        Command::new(cargo).current_dir(&layout.workspace).args(["build", "--release", "--locked", "-p", "kproxy"]),
        BUILD_TIMEOUT,
    )?;
    Ok(layout.target.join("release").join("kproxy"))
}

/// The cached base: a tarball made by mmdebstrap and the image imported from it.
pub(crate) struct Base {
    args: Vec<String>,
    tarball: PathBuf,
    pub(crate) tag: String,
}

impl Base {
    pub(crate) fn new(dirs: &Dirs) -> Base {
        let mut args: Vec<String> = [
            "--variant=minbase",
            "--mode=root",
            "--format=tar",
            // Merged /usr without the usrmerge package (which pulls perl in: +45 MiB).
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            "--aptopt=Acquire::Languages \"none\"",
        ]
        .map(String::from)
        .to_vec();
        args.extend(DPKG_EXCLUDES.iter().map(|rule| format!("--dpkgopt={rule}")));
        let key = format!("{:016x}", fnv1a(args.iter().map(String::as_str).chain(MIRRORS.iter().copied())));
        Base {
            args,
            tarball: dirs.base.join(format!("bookworm-slim-{key}.tar")),
            tag: format!("localhost/kproxy-base:bookworm-slim-{key}"),
        }
    }

    /// Makes the tarball and the base image unless both are cached (or `rebuild` is asked).
    pub(crate) fn ensure(&self, dirs: &Dirs, rebuild: bool) -> Result<()> {
        if rebuild || !self.tarball.exists() {
            self.bootstrap(dirs)?;
            self.import(dirs)?;
        } else if !image_exists(dirs, &self.tag)? {
            self.import(dirs)?;
        } else {
            tracing::info!("base {} (cached: {})", self.tag, self.tarball.display());
        }
        Ok(())
    }

    fn bootstrap(&self, dirs: &Dirs) -> Result<()> {
        fs::create_dir_all(&dirs.base).map_err(Error::io("creating", &dirs.base))?;
        let partial = self.tarball.with_extension("tar.partial");
        tracing::info!("base: mmdebstrap bookworm from {}", MIRRORS[0]);
        let started = Instant::now();
        let log_path = dirs.base.join("mmdebstrap.log");
        let log = fs::File::create(&log_path).map_err(Error::io("creating", &log_path))?;
        process::run(
            Command::new("mmdebstrap")
                .args(&self.args)
                .arg("bookworm")
                .arg(&partial)
                .args(MIRRORS)
                .stdout(log.try_clone().map_err(Error::io("opening", &log_path))?)
                .stderr(log),
            STEP_TIMEOUT,
        )
        .map_err(|error| Error::Setup(format!("{error} (its log: {})", log_path.display())))?;
        fs::rename(&partial, &self.tarball).map_err(Error::io("renaming", &partial))?;
        tracing::info!("base: {} in {:.1} s", self.tarball.display(), started.elapsed().as_secs_f64());
        Ok(())
    }

    fn import(&self, dirs: &Dirs) -> Result<()> {
        let name = String::from_utf8_lossy(&process::output(dirs.buildah().args(["from", "scratch"]), QUICK_TIMEOUT)?)
            .trim()
            .to_owned();
        let result =
            process::run(dirs.buildah().arg("add").arg("--quiet").arg(&name).arg(&self.tarball).arg("/"), STEP_TIMEOUT)
                .and_then(|()| {
                    process::run(
                        dirs.buildah()
                            .args([
                                "config",
                                "--env",
                                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                            ])
                            .args(["--cmd", "bash", &name]),
                        QUICK_TIMEOUT,
                    )
                })
                .and_then(|()| {
                    process::run(
                        dirs.buildah().args(["commit", "--quiet", "--rm", &name, &self.tag]).stdout(Stdio::null()),
                        STEP_TIMEOUT,
                    )
                });
        if result.is_err() {
            let _ = process::run(dirs.buildah().args(["rm", &name]).stdout(Stdio::null()), QUICK_TIMEOUT);
        }
        result
    }
}

/// 64-bit FNV-1a over the strings (each followed by a NUL): a cache key stable across builds.
pub(crate) fn fnv1a<'a>(parts: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &byte in part.as_bytes().iter().chain(&[0]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

fn image_exists(dirs: &Dirs, name: &str) -> Result<bool> {
    let mut child = process::spawn(
        dirs.buildah().args(["inspect", "--type", "image", name]).stdout(Stdio::null()).stderr(Stdio::null()),
    )?;
    Ok(process::wait_with_deadline(&mut child, QUICK_TIMEOUT, "buildah inspect")?.success())
}

/// `buildah bud` of deploy/Containerfile's `prebuilt` stage, the binary given as the build context
/// `binary` (a directory holding only a copy of it named `kproxy`).
fn build_image(layout: &Layout, dirs: &Dirs, base: &Base, binary: &Path) -> Result<()> {
    let context = dirs.root.join("binary");
    let _ = fs::remove_dir_all(&context);
    fs::create_dir_all(&context).map_err(Error::io("creating", &context))?;
    fs::copy(binary, context.join("kproxy")).map_err(Error::io("copying", binary))?;
    let started = Instant::now();
    process::run(
        dirs.buildah()
            .current_dir(&layout.workspace)
            .args(["bud", "--quiet", "--pull=never", "--layers", "--isolation", "chroot", "--network", "host"])
            .args(["--ignorefile", "deploy/Containerfile.dockerignore", "-f", "deploy/Containerfile"])
            .arg("--build-arg")
            .arg(format!("BASE={}", base.tag))
            .arg("--build-context")
            .arg(format!("binary={}", context.display()))
            .args(["--target", "prebuilt", "-t", IMAGE_NAME, "."])
            .stdout(Stdio::null()),
        BUILD_TIMEOUT,
    )?;
    tracing::info!("image: buildah bud in {:.1} s", started.elapsed().as_secs_f64());
    // Images no name points to any more (earlier builds' binaries): vfs keeps a full copy of each.
    process::run(dirs.buildah().args(["rmi", "--prune"]).stdout(Stdio::null()), STEP_TIMEOUT)
}

/// `buildah push` of image `name` to an OCI archive, written beside and renamed into place.
pub(crate) fn push(dirs: &Dirs, name: &str, archive: &Path) -> Result<()> {
    // Per process: two clusters starting at once may both write it; the rename is atomic.
    let partial = archive.with_extension(format!("tar.partial.{}", std::process::id()));
    let _ = fs::remove_file(&partial);
    process::run(
        dirs.buildah().args(["push", "--quiet", name]).arg(format!("oci-archive:{}:{name}", partial.display())),
        STEP_TIMEOUT,
    )?;
    fs::rename(&partial, archive).map_err(Error::io("renaming", &partial))
}

/// What the archive holds, read from its index, manifest and config.
struct Summary {
    archive_bytes: u64,
    layers: usize,
    layer_bytes: u64,
    entrypoint: Vec<String>,
}

impl Summary {
    fn read(archive: &Path) -> Result<Summary> {
        let archive_bytes = fs::metadata(archive).map_err(Error::io("reading", archive))?.len();
        let index = archive_json(archive, "index.json")?;
        let manifest = archive_json(archive, &blob_path(&index["manifests"][0]["digest"])?)?;
        let config = archive_json(archive, &blob_path(&manifest["config"]["digest"])?)?;
        let layers = manifest["layers"].as_array().map(Vec::as_slice).unwrap_or_default();
        let entrypoint = config["config"]["Entrypoint"]
            .as_array()
            .map(|items| items.iter().filter_map(|item| item.as_str().map(String::from)).collect())
            .unwrap_or_default();
        Ok(Summary {
            archive_bytes,
            layers: layers.len(),
            layer_bytes: layers.iter().filter_map(|layer| layer["size"].as_u64()).sum(),
            entrypoint,
        })
    }
}

fn blob_path(digest: &serde_json::Value) -> Result<String> {
    let digest = digest.as_str().ok_or_else(|| Error::Setup("the archive's index names no digest".into()))?;
    let (algorithm, hex) =
        digest.split_once(':').ok_or_else(|| Error::Setup(format!("malformed digest {digest:?} in the archive")))?;
    Ok(format!("blobs/{algorithm}/{hex}"))
}

/// One JSON member of the archive, read with tar.
fn archive_json(archive: &Path, member: &str) -> Result<serde_json::Value> {
    let bytes = process::output(Command::new("tar").arg("-xOf").arg(archive).arg(member), QUICK_TIMEOUT)?;
    serde_json::from_slice(&bytes).map_err(|error| Error::Setup(format!("{member} in {}: {error}", archive.display())))
}

/// Imports the archive into a throwaway containerd and runs the image's tools with runc.
fn verify(dirs: &Dirs, archive: &Path, expected_version: &str) -> Result<()> {
    let started = Instant::now();
    let containerd = Containerd::start(&dirs.root.join(format!("check-{}", std::process::id())))?;
    let imported = containerd.ctr(&["images", "import", "--all-platforms"], &[archive.as_os_str()])?;
    tracing::info!("check: ctr images import: {}", String::from_utf8_lossy(&imported).trim());
    let listed = String::from_utf8_lossy(&containerd.ctr(&["images", "ls", "-q"], &[])?).into_owned();
    if !listed.lines().any(|name| name == IMAGE_NAME) {
        return Err(Error::Setup(format!("ctr images import named the image {:?}, not {IMAGE_NAME}", listed.trim())));
    }
    // The image has no shell: each tool runs as its own container. The iptables tools of both
    // backends are all kproxy runs besides itself (deploy/rootfs.sh).
    // Each prints a prefix and, for the iptables tools, the backend it speaks (the legacy
    // multi-call binary names itself `iptables-save`/`ip6tables-restore`, without "-legacy").
    let runs: [(&[&str], &str, &str); 5] = [
        (&["/usr/local/bin/kproxy", "--version"], expected_version.trim(), ""),
        (&["/usr/sbin/iptables-nft-restore", "--version"], "iptables-nft-restore v", "(nf_tables)"),
        (&["/usr/sbin/ip6tables-nft-save", "--version"], "ip6tables-nft-save v", "(nf_tables)"),
        (&["/usr/sbin/iptables-legacy-save", "--version"], "iptables-save v", "(legacy)"),
        (&["/usr/sbin/ip6tables-legacy-restore", "--version"], "ip6tables-restore v", "(legacy)"),
    ];
    let mut output = String::new();
    for (i, (command, prefix, suffix)) in runs.iter().enumerate() {
        let container = format!("{CHECK_NAMESPACE}-{}-{i}", std::process::id());
        let printed = containerd.ctr(&[&["run", "--rm", IMAGE_NAME, &container][..], command].concat(), &[])?;
        let printed = String::from_utf8_lossy(&printed).trim().to_owned();
        if !printed.starts_with(prefix) || !printed.ends_with(suffix) {
            return Err(Error::Setup(format!(
                "{} in the image printed {printed:?}, expected {prefix:?}...{suffix:?}",
                command.join(" ")
            )));
        }
        output.push_str(&printed);
        output.push('\n');
    }
    // And nothing else can run: there is no shell to exec into.
    let container = format!("{CHECK_NAMESPACE}-{}-sh", std::process::id());
    if containerd.ctr(&["run", "--rm", IMAGE_NAME, &container, "/bin/sh", "-c", "true"], &[]).is_ok() {
        return Err(Error::Setup("the image has a shell (/bin/sh ran)".to_owned()));
    }
    tracing::info!(
        "check: in containerd + runc, the image ran: {} ({:.1} s)",
        output.lines().collect::<Vec<_>>().join("; "),
        started.elapsed().as_secs_f64()
    );
    drop(containerd);
    Ok(())
}

/// A containerd of the check's own (config, root, state, socket under `dir`), torn down on drop:
/// the process, its shims, its mounts, the check's cgroups and `dir` itself.
struct Containerd {
    child: Option<Child>,
    dir: PathBuf,
    socket: PathBuf,
    /// Whether /run/containerd (where shims keep sockets and runc its state) predates the check.
    shared_run_existed: bool,
}

/// Where containerd 1.6's shims and runc keep state whatever the config says.
const SHARED_RUN: &str = "/run/containerd";

impl Containerd {
    fn start(dir: &Path) -> Result<Containerd> {
        let _ = fs::remove_dir_all(dir);
        fs::create_dir_all(dir).map_err(Error::io("creating", dir))?;
        let mut containerd = Containerd {
            child: None,
            dir: dir.to_path_buf(),
            socket: dir.join("containerd.sock"),
            shared_run_existed: Path::new(SHARED_RUN).exists(),
        };
        let config = dir.join("config.toml");
        let text = format!(
            "version = 2\nroot = \"{root}/root\"\nstate = \"{root}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{root}/containerd.sock\"\n\
             [ttrpc]\n  address = \"{root}/containerd.sock.ttrpc\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{root}/opt\"\n",
            root = dir.display()
        );
        fs::write(&config, text).map_err(Error::io("writing", &config))?;
        let log = fs::File::create(dir.join("containerd.log")).map_err(Error::io("creating", dir))?;
        let stderr = log.try_clone().map_err(Error::io("opening", dir))?;
        containerd.child = Some(process::spawn(
            Command::new("containerd").arg("--config").arg(&config).stdin(Stdio::null()).stdout(log).stderr(stderr),
        )?);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !containerd.answers() {
            if Instant::now() >= deadline {
                let log = fs::read_to_string(dir.join("containerd.log")).unwrap_or_default();
                return Err(Error::Setup(format!("the check's containerd did not answer within 30 s:\n{log}")));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(containerd)
    }

    /// `ctr` against this containerd in the check's namespace; returns stdout.
    fn ctr(&self, args: &[&str], paths: &[&std::ffi::OsStr]) -> Result<Vec<u8>> {
        process::output(self.ctr_command().args(args).args(paths), STEP_TIMEOUT)
    }

    fn ctr_command(&self) -> Command {
        let mut command = Command::new("ctr");
        command.arg("--address").arg(&self.socket).args(["--namespace", CHECK_NAMESPACE]);
        command
    }

    /// Whether containerd answers on its socket yet (quietly: it is polled while it starts).
    fn answers(&self) -> bool {
        let mut command = self.ctr_command();
        let command = command.arg("version").stdout(Stdio::null()).stderr(Stdio::null());
        match process::spawn(command) {
            Ok(mut child) => process::wait_with_deadline(&mut child, QUICK_TIMEOUT, "ctr version")
                .is_ok_and(|status| status.success()),
            Err(_) => false,
        }
    }

    /// Processes whose command line names the check's directory (containerd, its shims).
    fn processes(&self) -> Vec<u32> {
        let needle = self.dir.to_string_lossy().into_owned();
        let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
        entries
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let mut cmdline = Vec::new();
                fs::File::open(format!("/proc/{pid}/cmdline"))
                    .and_then(|mut file| file.read_to_end(&mut cmdline))
                    .is_ok()
                    && String::from_utf8_lossy(&cmdline).contains(&needle)
            })
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            if process::wait_with_deadline(child, Duration::from_secs(10), "containerd").is_err() {
                tracing::warn!("check: containerd ignored SIGTERM for 10 s; killed");
            }
        }
        for pid in self.processes() {
            tracing::warn!("check: killing leftover process {pid} of the check's containerd");
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        // Mounts under the check's directory (snapshots, task rootfs), deepest first.
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let needle = self.dir.to_string_lossy().into_owned();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|line| line.split(' ').nth(1))
            .filter(|point| point.starts_with(&needle))
            .collect();
        points.sort_by_key(|point| std::cmp::Reverse(point.len()));
        for point in points {
            let _ = Command::new("umount").args(["-l", point]).status();
        }
        // ctr's default cgroup parent is /<namespace>; runc removes the container's own cgroup.
        if let Ok(controllers) = fs::read_dir("/sys/fs/cgroup") {
            for controller in controllers.flatten() {
                let _ = fs::remove_dir(controller.path().join(CHECK_NAMESPACE));
            }
        }
        let _ = fs::remove_dir(Path::new("/sys/fs/cgroup").join(CHECK_NAMESPACE));
        // runc's state directory of the check's namespace (empty once the container is deleted),
        // and what the check created of /run/containerd when nothing else had (only if empty).
        let shared = Path::new(SHARED_RUN);
        let _ = fs::remove_dir(shared.join("runc").join(CHECK_NAMESPACE));
        if !self.shared_run_existed {
            for sub in ["runc", "fifo", "s", ""] {
                let _ = fs::remove_dir(shared.join(sub));
            }
        }
        if let Err(error) = fs::remove_dir_all(&self.dir) {
            tracing::warn!("check: cannot remove {}: {error}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_default_to_verifying_and_refuse_unknown_flags() {
        let options = parse(&[]).unwrap();
        assert!(options.verify && !options.rebuild_base && options.binary.is_none());
        let options = parse(&["--no-verify".into(), "--rebuild-base".into(), "--binary".into(), "/k".into()]).unwrap();
        assert!(!options.verify && options.rebuild_base);
        assert_eq!(options.binary.as_deref(), Some(Path::new("/k")));
        assert!(matches!(parse(&["--verify".into()]), Err(Error::Usage(_))));
        assert!(matches!(parse(&["--binary".into()]), Err(Error::Usage(_))));
    }

    #[test]
    fn blob_paths_follow_the_oci_layout() {
        assert_eq!(blob_path(&serde_json::json!("sha256:abc")).unwrap(), "blobs/sha256/abc");
        assert!(blob_path(&serde_json::json!("abc")).is_err());
        assert!(blob_path(&serde_json::json!(1)).is_err());
    }

    #[test]
    fn the_base_key_changes_with_what_shapes_the_base() {
        assert_ne!(fnv1a(["a", "b"]), fnv1a(["ab"]));
        assert_eq!(fnv1a(["a", "b"]), fnv1a(["a", "b"]));
        assert_ne!(fnv1a(["a", "b"]), fnv1a(["a", "c"]));
    }
}
