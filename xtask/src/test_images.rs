//! The images a cluster needs that exist nowhere offline, built here from Debian's packages the
//! way `cargo xtask image` builds kproxy's (buildah on the mmdebstrap bookworm-slim base, its
//! layers cached under `target/image/`):
//!
//! - [`DISTROLESS_IPTABLES`]: what e2e's `KubeProxy should set TCP CLOSE_WAIT timeout` runs on a
//!   node to read conntrack (`xtask/images/distroless-iptables.Containerfile` says what it holds);
//! - [`KUBE_PROXY`]: upstream kube-proxy v1.36.2 (the binary of `KPROXY_K8S_DIR`) on that image,
//!   as upstream's image is made, so that kube-proxy runs as a DaemonSet like kproxy does.
//!
//! Each archive is rebuilt only when what shapes it changed (its Containerfile, the base, the
//! binary): the key of what it was built from is written beside it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::image::{self, Base, Dirs};
use crate::layout::Layout;
use crate::process;

/// The name e2e v1.36.2 asks for (`imageutils.DistrolessIptables`).
pub const DISTROLESS_IPTABLES: &str = "registry.k8s.io/build-image/distroless-iptables:v0.9.3";
/// Upstream kube-proxy's image as this harness builds it (named `localhost/`: built here, never
/// pulled).
pub const KUBE_PROXY: &str = "localhost/kube-proxy:v1.36.2";

/// The archives (OCI, under `target/image/`) of the images asked for.
#[derive(Debug, Clone, Default)]
pub struct TestImages {
    pub distroless_iptables: Option<PathBuf>,
    pub kube_proxy: Option<PathBuf>,
}

/// Builds whichever of the images asked for is missing or stale: the distroless one when
/// `distroless` (e2e), upstream's when `kube_proxy` names the binary (the distroless image is its
/// base, so it is built then too, but only returned when asked for).
pub fn ensure(layout: &Layout, distroless: bool, kube_proxy: Option<&Path>) -> Result<TestImages> {
    let dirs = Dirs::new(layout);
    let distroless_archive = dirs.root.join("distroless-iptables.oci.tar");
    let kube_proxy_archive = dirs.root.join("kube-proxy.oci.tar");
    let wanted = TestImages {
        distroless_iptables: distroless.then(|| distroless_archive.clone()),
        kube_proxy: kube_proxy.map(|_| kube_proxy_archive.clone()),
    };
    if !distroless && kube_proxy.is_none() {
        return Ok(wanted);
    }
    let distroless_file = containerfile(layout, "distroless-iptables");
    let kube_proxy_file = containerfile(layout, "kube-proxy");
    let distroless_text = read(&distroless_file)?;
    let kube_proxy_text = read(&kube_proxy_file)?;
    let base = Base::new(&dirs);
    // What shapes each archive: the distroless one its Containerfile and the base; kube-proxy's
    // those, its own Containerfile and the binary (its cache name carries its checksum).
    let distroless_key = format!("{:016x}", image::fnv1a([distroless_text.as_str(), base.tag.as_str()]));
    let binary_name =
        kube_proxy.and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let kube_proxy_key =
        format!("{:016x}", image::fnv1a([distroless_key.as_str(), kube_proxy_text.as_str(), binary_name.as_str()]));
    let stale = |archive: &Path, key: &str| {
        !archive.is_file() || fs::read_to_string(key_path(archive)).map(|k| k.trim() != key).unwrap_or(true)
    };
    let build_distroless = distroless && stale(&distroless_archive, &distroless_key);
    let build_kube_proxy = kube_proxy.is_some() && stale(&kube_proxy_archive, &kube_proxy_key);
    if !build_distroless && !build_kube_proxy {
        return Ok(wanted);
    }
    image::ensure_packages()?;
    fs::create_dir_all(&dirs.root).map_err(Error::io("creating", &dirs.root))?;
    base.ensure(&dirs, false)?;
    let context = dirs.root.join(format!("test-image-context.{}", std::process::id()));
    let _ = fs::remove_dir_all(&context);
    let binary_context = context.join("binary");
    fs::create_dir_all(&binary_context).map_err(Error::io("creating", &binary_context))?;
    // The distroless image is the kube-proxy image's base: built (from cache) whenever either is.
    build(layout, &dirs, &distroless_file, &base.tag, &context, None, DISTROLESS_IPTABLES)?;
    if build_distroless {
        write_archive(&dirs, DISTROLESS_IPTABLES, &distroless_archive, &distroless_key)?;
    }
    if let Some(binary) = kube_proxy.filter(|_| build_kube_proxy) {
        fs::copy(binary, binary_context.join("kube-proxy")).map_err(Error::io("copying", binary))?;
        build(layout, &dirs, &kube_proxy_file, DISTROLESS_IPTABLES, &context, Some(&binary_context), KUBE_PROXY)?;
        write_archive(&dirs, KUBE_PROXY, &kube_proxy_archive, &kube_proxy_key)?;
    }
    let _ = fs::remove_dir_all(&context);
    Ok(wanted)
}

fn containerfile(layout: &Layout, name: &str) -> PathBuf {
    layout.workspace.join("xtask").join("images").join(format!("{name}.Containerfile"))
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(Error::io("reading", path))
}

fn key_path(archive: &Path) -> PathBuf {
    archive.with_extension("tar.key")
}

/// `buildah bud` of `file` on `base` into image `name` (an empty context; `binary` as the build
/// context of that name when given).
fn build(
    layout: &Layout,
    dirs: &Dirs,
    file: &Path,
    base: &str,
    context: &Path,
    binary: Option<&Path>,
    name: &str,
) -> Result<()> {
    let started = Instant::now();
    let mut command = dirs.buildah();
    command
        .current_dir(&layout.workspace)
        .args(["bud", "--quiet", "--pull=never", "--layers", "--isolation", "chroot", "--network", "host"])
        .arg("-f")
        .arg(file)
        .arg("--build-arg")
        .arg(format!("BASE={base}"));
    if let Some(binary) = binary {
        command.arg("--build-context").arg(format!("binary={}", binary.display()));
    }
    command.args(["-t", name]).arg(context).stdout(Stdio::null());
    process::run(&mut command, image::BUILD_TIMEOUT)?;
    tracing::info!("image {name}: buildah bud in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn write_archive(dirs: &Dirs, name: &str, archive: &Path, key: &str) -> Result<()> {
    image::push(dirs, name, archive)?;
    let key_file = key_path(archive);
    fs::write(&key_file, key).map_err(Error::io("writing", &key_file))?;
    tracing::info!("image {name}: {}", archive.display());
    Ok(())
}
