//! A containerd of the node's own: its config, root, state, socket, runc root and CNI conf dir
//! live in the run's work dir (never `/etc/containerd` or `/var/lib/containerd`), so two nodes
//! and the machine's own containerd (if any) never share anything.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::node::run;

/// The pause image the sandboxes use (from `../shared/k8s/images`).
pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10.2";
/// Where Debian's containernetworking-plugins are.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// One node's containerd paths.
#[derive(Debug, Clone)]
pub struct Containerd {
    pub dir: PathBuf,
}

impl Containerd {
    pub fn new(dir: PathBuf) -> Containerd {
        Containerd { dir }
    }
    pub fn config(&self) -> PathBuf {
        self.dir.join("config.toml")
    }
    pub fn root(&self) -> PathBuf {
        self.dir.join("root")
    }
    pub fn state(&self) -> PathBuf {
        self.dir.join("state")
    }
    /// The CRI/gRPC socket (also what its shims are started with, `-address`).
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.dir.join("net.d")
    }

    /// Writes the config. `restrict_oom_score_adj`: root here lacks CAP_SYS_RESOURCE and runc
    /// fails every sandbox writing a negative oom_score_adj otherwise ("can't get final child's
    /// PID from pipe: EOF"). cgroupfs (runc's default): the kubelet runs with `cgroupDriver: cgroupfs`.
    pub fn write_config(&self) -> Result<()> {
        fs::create_dir_all(&self.dir)?;
        fs::create_dir_all(self.cni_conf_dir())?;
        let config = format!(
            r#"# Written by the kproxy cluster harness: a containerd of this node only.
version = 2
root = "{root}"
state = "{state}"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = ""

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{SANDBOX_IMAGE}"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{runc_root}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"#,
            root = self.root().display(),
            state = self.state().display(),
            socket = self.socket().display(),
            opt = self.dir.join("opt").display(),
            runc_root = self.dir.join("runc").display(),
            cni_conf = self.cni_conf_dir().display(),
        );
        fs::write(self.config(), config)?;
        Ok(())
    }

    /// Waits until containerd answers on its socket.
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.ctr(&["version"]).output();
            if let Ok(out) = &out
                && out.status.success()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("containerd on {} did not answer within {timeout:?}", self.socket().display());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `ctr --address <socket> -n k8s.io ARGS`.
    pub fn ctr(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address").arg(self.socket()).args(["-n", "k8s.io"]).args(args);
        cmd
    }

    /// Imports an OCI/docker archive (xz-compressed archives are unpacked to `cache` first).
    pub fn import(&self, archive: &Path) -> Result<()> {
        let mut cmd = self.ctr(&["images", "import", "--all-platforms"]);
        cmd.arg(archive);
        run(&mut cmd).map(drop)
    }

    pub fn tag(&self, from: &str, to: &str) -> Result<()> {
        run(&mut self.ctr(&["images", "tag", "--force", from, to])).map(drop)
    }

    /// The image references containerd has (names only).
    pub fn images(&self) -> Result<Vec<String>> {
        let out = self.ctr(&["images", "ls", "-q"]).output().context("ctr images ls")?;
        if !out.status.success() {
            bail!("ctr images ls: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
    }
}

/// Unpacks `archive` (`NAME.tar.xz`) into `cache/NAME.tar` unless it is there already, and
/// returns the `.tar`'s path. Archives not ending in `.xz` are used as they are.
pub fn unpacked(archive: &Path, cache: &Path) -> Result<PathBuf> {
    let Some(name) = archive.file_name().and_then(|n| n.to_str()) else { bail!("bad archive {}", archive.display()) };
    let Some(stem) = name.strip_suffix(".xz") else { return Ok(archive.to_owned()) };
    let out = cache.join(stem);
    let stamp = out.with_extension("tar.ok");
    if stamp.exists() && out.exists() {
        return Ok(out);
    }
    fs::create_dir_all(cache)?;
    let tmp = out.with_extension("tar.part");
    let file = fs::File::create(&tmp)?;
    let status = Command::new("xz")
        .args(["-d", "-c", "-T0"])
        .arg(archive)
        .stdout(file)
        .status()
        .context("running xz (apt-get install xz-utils)")?;
    if !status.success() {
        bail!("xz -d {} failed: {status}", archive.display());
    }
    fs::rename(&tmp, &out)?;
    fs::write(&stamp, b"")?;
    Ok(out)
}
