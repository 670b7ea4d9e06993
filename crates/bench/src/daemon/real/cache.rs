//! A size's cluster kept between runs: etcd's data as it stood right after the cluster was
//! written through the API server, and what writing it took.
//!
//! Writing 100k Services through kube-apiserver v1.36.2 takes over an hour here, and not because
//! of etcd: for every ClusterIP it allocates, the API server's IPAddress allocator counts the
//! allocated addresses for its metrics by listing every IPAddress in its informer (`Used()`,
//! twice per allocation), so each Service costs O(Services already there) and the whole cluster
//! O(n²) — 110 Services/s at the start, ~40/s at 30k. The objects are written once, through
//! the API server like any other run, and later runs of the same size start etcd from a copy.
//! The key names everything the written objects depend on, so a change to the benchmark's
//! objects, ranges or binaries writes the cluster again.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use sha2::{Digest as _, Sha256};

use super::super::objects::{self, Layout};
use super::{Created, NODE_PORTS, SERVICE_CIDRS};

/// One size's saved cluster in `root`.
pub struct SavedCluster {
    dir: PathBuf,
}

impl SavedCluster {
    /// The saved cluster of `n` Services laid out as `layout` says, written by `apiserver` (the
    /// binary's path carries its sum, `kproxy-k8s-harness`'s cache) with etcd `etcd` (its name).
    pub fn new(root: &Path, n: usize, layout: Layout, apiserver: &Path, etcd: &str) -> SavedCluster {
        SavedCluster { dir: root.join(format!("{n}-{}", key(n, layout, apiserver, etcd))) }
    }

    /// etcd's data directory, when a complete earlier run saved it.
    pub fn etcd(&self) -> Option<PathBuf> {
        let etcd = self.dir.join("etcd");
        (etcd.is_dir() && self.dir.join(CREATED).is_file()).then_some(etcd)
    }

    /// What writing the saved cluster took, marked as reused from this directory.
    pub fn created(&self) -> anyhow::Result<Created> {
        let path = self.dir.join(CREATED);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let mut created: Created =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        created.reused_from = Some(self.dir.display().to_string());
        Ok(created)
    }

    /// Where [`kproxy_k8s_harness::ControlPlane::save_etcd`] writes; then [`SavedCluster::finish`].
    pub fn etcd_dest(&self) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
        // A save that died half way has no `created.json`: start over.
        let _ = std::fs::remove_file(self.dir.join(CREATED));
        Ok(self.dir.join("etcd"))
    }

    /// Records what writing took; the saved cluster is complete from here on.
    pub fn finish(&self, created: &Created) -> anyhow::Result<()> {
        let path = self.dir.join(CREATED);
        std::fs::write(&path, serde_json::to_vec_pretty(created)?)
            .with_context(|| format!("writing {}", path.display()))
    }
}

const CREATED: &str = "created.json";

/// What the saved objects depend on: the binaries, the API server's ranges, and the objects
/// themselves (a sample of every shape, first and last included, and the big Service's).
fn key(n: usize, layout: Layout, apiserver: &Path, etcd: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(apiserver.to_string_lossy().as_bytes());
    hash.update(etcd.as_bytes());
    hash.update(SERVICE_CIDRS.as_bytes());
    hash.update(format!("{NODE_PORTS:?}").as_bytes());
    let web = (super::WEB_POD.into(), super::super::api::NODE_NAME);
    for i in [0, 1, 3, 7, 10, 50, 100, n / 2, n - 1] {
        hash.update(objects::service(i).to_string().as_bytes());
        let endpoints = objects::initial_endpoints(i, false, web, layout.endpoints);
        hash.update(objects::slice(i, false, &endpoints, "").to_string().as_bytes());
    }
    // The default layout hashes as it did before there were others: clusters saved then stay.
    if !layout.is_default() {
        hash.update(format!("{layout:?}").as_bytes());
        hash.update(objects::big_service(n).to_string().as_bytes());
    }
    let digest = hash.finalize();
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}
