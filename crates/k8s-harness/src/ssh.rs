//! SSH into the nodes, as e2e expects of a cluster whose provider has it (`--provider=local`):
//! the spec `Networking should recreate its iptables rules if they are deleted [Disruptive]`
//! runs `sudo iptables-save`, deletes every `KUBE-*` chain and reads the mangle table again on a
//! node, over SSH to the node's address (`KUBE_SSH_USER`, `KUBE_SSH_KEY_PATH`).
//!
//! Each node runs Debian's `sshd` in its network and UTS namespaces, listening on the node's
//! addresses only (never the machine's), public-key authentication only, for root, with one
//! ed25519 key pair of the cluster's (`<work>/ssh/`). A session runs in the node's namespaces,
//! so `iptables-save` there reads the node's rules. The privilege-separation directory
//! `/run/sshd` that `sshd` insists on is made when missing (and left: it is the package's).

use std::fs;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Debian's sshd (package `openssh-server`, installed by `scripts/install-deps`).
pub const SSHD: &str = "/usr/sbin/sshd";
/// The user e2e logs in as (`KUBE_SSH_USER`).
pub const USER: &str = "root";

/// The cluster's SSH keys.
#[derive(Debug, Clone)]
pub struct SshKeys {
    /// The client's private key (`KUBE_SSH_KEY_PATH`).
    pub client_key: PathBuf,
    pub authorized_keys: PathBuf,
    pub host_key: PathBuf,
}

impl SshKeys {
    /// Makes the client and host key pairs under `dir` (which must not hold them yet).
    pub fn generate(dir: &Path) -> Result<SshKeys> {
        if !Path::new(SSHD).is_file() {
            bail!("{SSHD} is missing: apt-get install openssh-server (scripts/install-deps does)");
        }
        fs::create_dir_all(dir)?;
        let keys = SshKeys {
            client_key: dir.join("id_ed25519"),
            authorized_keys: dir.join("authorized_keys"),
            host_key: dir.join("ssh_host_ed25519_key"),
        };
        for (key, comment) in [(&keys.client_key, "kproxy-cluster-e2e"), (&keys.host_key, "kproxy-cluster-node")] {
            crate::node::run(
                Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"]).arg(key),
            )
            .context("ssh-keygen (apt-get install openssh-client)")?;
        }
        fs::copy(keys.client_key.with_extension("pub"), &keys.authorized_keys)?;
        Ok(keys)
    }

    /// The `sshd_config` of a node listening on `addresses` (port 22).
    pub fn sshd_config(&self, addresses: &[IpAddr]) -> String {
        let mut config = String::from("# Written by the kproxy cluster harness: one node's sshd.\nPort 22\n");
        for ip in addresses {
            config.push_str(&format!("ListenAddress {}\n", crate::wire::host_port(*ip, 22)));
        }
        config.push_str(&format!(
            "HostKey {host}\nAuthorizedKeysFile {authorized}\nPidFile none\nPermitRootLogin prohibit-password\n\
             PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nStrictModes no\nPrintMotd no\nX11Forwarding no\nAllowTcpForwarding no\n\
             AllowAgentForwarding no\nPermitTunnel no\n",
            host = self.host_key.display(),
            authorized = self.authorized_keys.display(),
        ));
        config
    }
}

/// `/run/sshd`, which sshd checks for before it starts (its package makes it at boot).
pub fn ensure_privsep_dir() -> Result<()> {
    let dir = Path::new("/run/sshd");
    if !dir.is_dir() {
        fs::create_dir_all(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// Runs `true` over SSH from `netns` (the wire) until it succeeds: the node answers with the
/// cluster's key.
pub fn wait_ready(netns: &str, keys: &SshKeys, ip: IpAddr, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", netns, "ssh", "-i"])
            .arg(&keys.client_key)
            .args([
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "ConnectTimeout=3",
                "-o",
                "LogLevel=ERROR",
                &format!("{USER}@{ip}"),
                "true",
            ])
            .output()
            .context("running ssh")?;
        if out.status.success() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("ssh {USER}@{ip}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
