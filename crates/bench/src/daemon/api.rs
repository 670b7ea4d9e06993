//! The fake API server (`kproxy_kube_source::fake`), run inside the node namespace so kproxy
//! reaches it on 127.0.0.1, loaded with the benchmark's cluster, and sending bookmarks.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context as _;
use kproxy_kube_source::fake::FakeApiServer;
use kproxy_state::Kind;
use kproxy_testbed::{Netns, topology};

use super::objects::{self, Layout, Shape};

/// How often watches get a BOOKMARK (kube-apiserver sends one about every minute; more often
/// here so short runs see them too).
const BOOKMARK_EVERY: Duration = Duration::from_secs(10);

/// The node kproxy runs as.
pub const NODE_NAME: &str = "bench-node";

/// A running fake API server and the thread sending its bookmarks.
#[derive(Debug)]
pub struct Api {
    pub server: Arc<FakeApiServer>,
    // Dropped after the server (field order): its tasks need the runtime to stop.
    _runtime: tokio::runtime::Runtime,
    stop: Arc<AtomicBool>,
    bookmarks: Option<JoinHandle<()>>,
    /// Bytes of JSON the cluster's objects take (what a full list of every kind carries).
    pub object_bytes: usize,
}

impl Api {
    /// Starts the server in `ns` and stores the node and `n` Services with their slices, laid out
    /// as `layout` says.
    pub fn start(ns: &Netns, n: usize, web_pod: IpAddr, layout: Layout) -> anyhow::Result<Api> {
        let (server, runtime) = ns.run_in(|| -> anyhow::Result<_> {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            let server = runtime.block_on(FakeApiServer::start())?;
            Ok((Arc::new(server), runtime))
        })??;
        let mut object_bytes = 0;
        let mut apply = |kind: Kind, object: serde_json::Value| {
            object_bytes += object.to_string().len();
            server.apply(kind, object);
        };
        let pod_cidrs = [topology::NODE_POD_CIDR_V4.to_string(), topology::NODE_POD_CIDR_V6.to_string()];
        apply(
            Kind::Node,
            objects::node(NODE_NAME, topology::NODE_IP_V4, topology::NODE_IP_V6, [&pod_cidrs[0], &pod_cidrs[1]]),
        );
        let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
        for i in 0..n {
            apply(Kind::Service, objects::service(i));
            let v4 = objects::initial_endpoints(i, false, (web_pod, NODE_NAME), layout.endpoints);
            apply(Kind::EndpointSlice, objects::slice(i, false, &v4, &trigger));
            if Shape::of(i).dual_stack && i > 0 {
                let v6 = objects::initial_endpoints(i, true, (web_pod, NODE_NAME), layout.endpoints);
                apply(Kind::EndpointSlice, objects::slice(i, true, &v6, &trigger));
            }
        }
        if layout.big > 0 {
            apply(Kind::Service, objects::big_service(n));
            for (_, slice) in objects::big_slices(n, &objects::big_initial_endpoints(layout.big), &trigger) {
                apply(Kind::EndpointSlice, slice);
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let bookmarks = {
            let (server, stop) = (server.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bookmarks".into())
                .spawn(move || {
                    let mut waited = Duration::ZERO;
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                        waited += Duration::from_millis(100);
                        if waited >= BOOKMARK_EVERY {
                            server.bookmark();
                            waited = Duration::ZERO;
                        }
                    }
                })
                .context("starting the bookmark thread")?
        };
        Ok(Api { server, _runtime: runtime, stop, bookmarks: Some(bookmarks), object_bytes })
    }

    /// The runtime the server runs on, for its async controls (stop, restart, dropping
    /// connections).
    pub fn runtime(&self) -> &tokio::runtime::Runtime {
        &self._runtime
    }

    /// Writes a kubeconfig pointing at the server.
    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n    server: {}\ncontexts:\n\
             - name: bench\n  context:\n    cluster: bench\n    user: bench\ncurrent-context: bench\nusers:\n\
             - name: bench\n  user: {{}}\n",
            self.server.url()
        );
        std::fs::write(path, text).with_context(|| format!("{}", path.display()))
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.bookmarks.take() {
            let _ = thread.join();
        }
    }
}
