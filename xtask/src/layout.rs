//! Where the harness keeps things: everything it builds or downloads lives under `target/`.

use std::path::{Path, PathBuf};

/// Paths of the workspace and of the harness caches.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The workspace root (the directory holding the root `Cargo.toml`).
    pub workspace: PathBuf,
    /// Cargo's target directory (`CARGO_TARGET_DIR` or `<workspace>/target`).
    pub target: PathBuf,
}

impl Layout {
    /// The layout of the workspace this xtask was built from.
    pub fn discover() -> Layout {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let workspace = manifest.parent().unwrap_or(manifest).to_path_buf();
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => workspace.join(dir),
            None => workspace.join("target"),
        };
        Layout { workspace, target }
    }

    /// The kernel and initramfs cache for one kernel package version.
    pub fn kernel_cache(&self, package: &str, version: &str) -> PathBuf {
        self.target.join("guest-kernel").join(format!("{package}_{version}"))
    }

    /// Per-invocation exchange directories shared with the guest.
    pub fn runs(&self) -> PathBuf {
        self.target.join("guest-kernel").join("runs")
    }
}
