//! What the API server itself takes to serve the cluster: the lists a proxy starts with, read
//! by a bare client that decodes nothing. The daemon's start is judged against it.

use std::time::Instant;

use anyhow::Context as _;
use futures::AsyncBufReadExt as _;
use futures::AsyncReadExt as _;

/// The collections a proxy lists: Services and EndpointSlices (the node and ServiceCIDRs are a
/// handful of objects).
const COLLECTIONS: [&str; 2] = ["/api/v1/services", "/apis/discovery.k8s.io/v1/endpointslices"];

/// The two ways of reading every Service and EndpointSlice, each kind on its own connection,
/// both kinds at once; seconds until both ended.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BareLists {
    /// One plain LIST per kind (no `limit`, served from the watch cache), body read to the end.
    pub list_s: f64,
    /// One streaming list per kind (a watch with `sendInitialEvents=true`, what kproxy opens),
    /// read until the `k8s.io/initial-events-end` bookmark.
    pub streaming_s: f64,
    /// Bytes of the plain lists' bodies.
    pub list_bytes: usize,
}

impl BareLists {
    /// The faster of the two: the bound the daemon's start is compared with.
    pub fn best_s(&self) -> f64 {
        self.list_s.min(self.streaming_s)
    }
}

pub async fn measure(client: &kube::Client) -> anyhow::Result<BareLists> {
    // Untimed: the first lists after the API server started wait for its watch cache to fill
    // (a plane started from a saved cluster has just started); a proxy meets a warm server.
    futures::future::try_join_all(COLLECTIONS.map(|path| list(client, path))).await?;
    let started = Instant::now();
    let sizes = futures::future::try_join_all(COLLECTIONS.map(|path| list(client, path))).await?;
    let list_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    futures::future::try_join_all(COLLECTIONS.map(|path| streaming(client, path))).await?;
    let streaming_s = started.elapsed().as_secs_f64();
    Ok(BareLists { list_s, streaming_s, list_bytes: sizes.iter().sum() })
}

fn get(uri: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    http::Request::get(uri).body(Vec::new()).context("building a request")
}

/// A plain LIST; returns the body's length.
async fn list(client: &kube::Client, path: &str) -> anyhow::Result<usize> {
    let mut body = client.request_stream(get(&format!("{path}?resourceVersion=0"))?).await?;
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let read = body.read(&mut buf).await.context("reading a list")?;
        if read == 0 {
            return Ok(total);
        }
        total += read;
    }
}

/// A streaming list, until its end bookmark.
async fn streaming(client: &kube::Client, path: &str) -> anyhow::Result<()> {
    let uri = format!(
        "{path}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=600"
    );
    let mut body = client.request_stream(get(&uri)?).await?;
    let mut line = Vec::with_capacity(1 << 16);
    loop {
        line.clear();
        let read = body.read_until(b'\n', &mut line).await.context("reading a streaming list")?;
        anyhow::ensure!(read > 0, "{path}: the streaming list ended before its end bookmark");
        if line.starts_with(br#"{"type":"BOOKMARK""#) && contains(&line, b"k8s.io/initial-events-end") {
            return Ok(());
        }
        if line.starts_with(br#"{"type":"ERROR""#) {
            anyhow::bail!("{path}: {}", String::from_utf8_lossy(&line));
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
