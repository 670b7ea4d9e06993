//! What the API server itself takes to serve the cluster: the lists a proxy starts with, read
//! by a bare client that decodes nothing, in JSON and in protobuf (what kproxy and kube-proxy
//! ask for by default), and a change's trip from a PATCH to a watch (a small change's, and with
//! `--big-service` the big Service's own changes and rollout). The daemon's start is judged
//! against the first; the second is the part of a change's latency no proxy can shorten.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::AsyncBufReadExt as _;
use futures::AsyncReadExt as _;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::super::DaemonArgs;
use super::super::big::{BigResult, BigState, Change, Rollout};
use super::super::objects;

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
    /// The same in protobuf (`Accept: application/vnd.kubernetes.protobuf, */*`): the plain
    /// lists, the streaming lists (length-delimited frames), the plain lists' bytes.
    #[serde(default)]
    pub protobuf: Option<ProtobufLists>,
    /// A change through the API server alone, ms, sorted: a PATCH of one EndpointSlice's
    /// annotation, from before the request to its `MODIFIED` event on a watch of every
    /// EndpointSlice (what a proxy holds open), whether or not the PATCH's answer came first; as
    /// many and at the same cadence as the proxies' timed changes.
    #[serde(default)]
    pub watch_ms: Vec<f64>,
}

/// [`BareLists`] in protobuf.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ProtobufLists {
    pub list_s: f64,
    pub streaming_s: f64,
    pub list_bytes: usize,
}

impl BareLists {
    /// The fastest way: the bound the daemon's start is compared with.
    pub fn best_s(&self) -> f64 {
        let protobuf = self.protobuf.as_ref().map_or(f64::INFINITY, |p| p.list_s.min(p.streaming_s));
        self.list_s.min(self.streaming_s).min(protobuf)
    }
}

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf, */*";

pub async fn measure(client: &kube::Client, samples: usize, interval: Duration) -> anyhow::Result<BareLists> {
    // Untimed: the first lists after the API server started wait for its watch cache to fill
    // (a plane started from a saved cluster has just started); a proxy meets a warm server.
    futures::future::try_join_all(COLLECTIONS.map(|path| list(client, path, None))).await?;
    let started = Instant::now();
    let sizes = futures::future::try_join_all(COLLECTIONS.map(|path| list(client, path, None))).await?;
    let list_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    futures::future::try_join_all(COLLECTIONS.map(|path| streaming(client, path))).await?;
    let streaming_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let protobuf_sizes =
        futures::future::try_join_all(COLLECTIONS.map(|path| list(client, path, Some(PROTOBUF)))).await?;
    let protobuf_list_s = started.elapsed().as_secs_f64();
    let started = Instant::now();
    futures::future::try_join_all(COLLECTIONS.map(|path| streaming_protobuf(client, path))).await?;
    let protobuf = ProtobufLists {
        list_s: protobuf_list_s,
        streaming_s: started.elapsed().as_secs_f64(),
        list_bytes: protobuf_sizes.iter().sum(),
    };
    let watch_ms = watch_latency(client, samples, interval).await?;
    Ok(BareLists { list_s, streaming_s, list_bytes: sizes.iter().sum(), protobuf: Some(protobuf), watch_ms })
}

/// `samples` PATCHes of an annotation of Service 1's IPv4 slice, one per `interval` (the cadence
/// of the proxies' changes: an idle API server and machine wake up slower than busy ones, so
/// back to back the same trip measured less), each timed to its event on a watch of all
/// EndpointSlices opened at the current resource version.
async fn watch_latency(client: &kube::Client, samples: usize, interval: Duration) -> anyhow::Result<Vec<f64>> {
    let path = COLLECTIONS[1];
    let list: serde_json::Value = client.request(get(&format!("{path}?limit=1"))?).await?;
    let version = list["metadata"]["resourceVersion"].as_str().context("a list's resourceVersion")?.to_owned();
    let uri = format!("{path}?watch=true&resourceVersion={version}&timeoutSeconds=600");
    let mut events = client.request_stream(get(&uri)?).await?;
    let (namespace, _) = objects::name(1);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let slice = objects::slice_name(1, false);
    let mut timings = Vec::with_capacity(samples);
    for sample in 0..samples {
        tokio::time::sleep(interval).await;
        let marker = format!("probe-{sample}");
        let patch = Patch::Merge(json!({"metadata": {"annotations": {PROBE_ANNOTATION: marker}}}));
        let params = PatchParams::default();
        let needle = format!("\"{PROBE_ANNOTATION}\":\"{marker}\"");
        let started = Instant::now();
        let send = slices.patch(&slice, &params, &patch);
        // Timed to the event, whether or not the PATCH's answer came first.
        let seen = async {
            next_events_with(&mut events, vec![needle.into_bytes()]).await?;
            anyhow::Ok(started.elapsed().as_secs_f64() * 1e3)
        };
        let (sent, seen) = futures::join!(send, seen);
        sent.context("patching a slice's annotation")?;
        timings.push(seen?);
    }
    timings.sort_by(f64::total_cmp);
    Ok(timings)
}

/// The big Service's changes through the API server alone, before any proxy runs: as many
/// single changes and the same rollout as each proxy gets, written the same way and paced the
/// same, each timed from its PATCH leaving to the watch event (of the big Service's namespace,
/// read without decoding) that carries every new address. What no proxy can shorten of the
/// big Service's figures, measured on the machine and API server of the run.
pub async fn big_service_trips(
    client: &kube::Client,
    state: &mut BigState,
    args: &DaemonArgs,
) -> anyhow::Result<BigResult> {
    let path = format!("/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices", objects::BIG.0);
    let list: serde_json::Value = client.request(get(&format!("{path}?limit=1"))?).await?;
    let version = list["metadata"]["resourceVersion"].as_str().context("a list's resourceVersion")?.to_owned();
    let uri = format!("{path}?watch=true&resourceVersion={version}&timeoutSeconds=3600");
    let mut events = client.request_stream(get(&uri)?).await?;
    let m = state.endpoint_count();
    let mut result = BigResult { endpoints: m, changes: Vec::new(), rollout: None, api_server_alone: true };
    for k in 0..args.big_changes {
        tokio::time::sleep(args.change_interval()).await;
        let j = (k * 7919 + 13) % m;
        result.changes.push(trip(client, state, &mut events, j..j + 1).await?);
    }
    if args.rollout_step == 0 {
        return Ok(result);
    }
    let step = args.rollout_step;
    let steps = m.div_ceil(step);
    let deadline = Instant::now() + Duration::from_secs(args.rollout_timeout);
    let started = Instant::now();
    let mut done = Vec::with_capacity(steps);
    for r in 0..steps {
        let next_write = Instant::now() + args.rollout_interval();
        if Instant::now() >= deadline {
            break;
        }
        done.push(trip(client, state, &mut events, r * step..((r + 1) * step).min(m)).await?);
        tokio::time::sleep_until(next_write.into()).await;
    }
    let finished = done.len() == steps;
    result.rollout = Some(Rollout {
        step,
        interval_ms: args.rollout_interval_ms,
        steps,
        done,
        finished,
        total_s: started.elapsed().as_secs_f64(),
        timeout_s: args.rollout_timeout,
        cpu_s: 0.0,
        rss_mib: f64::NAN,
    });
    Ok(result)
}

/// Endpoints `range` of the big Service replaced: the PATCHes' answer and the watch event with
/// every new address, ms after the first PATCH left.
async fn trip(
    client: &kube::Client,
    state: &mut BigState,
    events: &mut (impl futures::AsyncBufRead + Unpin),
    range: std::ops::Range<usize>,
) -> anyhow::Result<Change> {
    let (slices, fresh) = state.replace(range);
    let wanted: Vec<Vec<u8>> = fresh.iter().map(|ip| format!("\"{ip}\"").into_bytes()).collect();
    let (service, written): (usize, Vec<_>) = (state.service, slices.iter().map(|&s| (s, state.slice(s))).collect());
    let started = Instant::now();
    let writes = futures::future::try_join_all(written.into_iter().map(|(s, endpoints)| async move {
        super::create::set_big_slice(client, service, s, &endpoints).await?;
        anyhow::Ok(started.elapsed().as_secs_f64() * 1e3)
    }));
    let seen = async {
        next_events_with(events, wanted).await?;
        anyhow::Ok(started.elapsed().as_secs_f64() * 1e3)
    };
    let (answered, seen) = futures::join!(writes, seen);
    let answered = answered?.into_iter().fold(0.0, f64::max);
    Ok(Change { ms: Some(seen?), cost: Default::default(), answered_ms: Some(answered) })
}

const PROBE_ANNOTATION: &str = "kproxy-bench/probe";

/// Reads watch events until every one of `needles` has been in one of them.
async fn next_events_with(
    events: &mut (impl futures::AsyncBufRead + Unpin),
    mut needles: Vec<Vec<u8>>,
) -> anyhow::Result<()> {
    let mut line = Vec::with_capacity(1 << 14);
    while !needles.is_empty() {
        line.clear();
        let read = events.read_until(b'\n', &mut line).await.context("reading the watch")?;
        anyhow::ensure!(read > 0, "the watch ended before the change's event");
        needles.retain(|needle| !contains(&line, needle));
    }
    Ok(())
}

fn get(uri: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    http::Request::get(uri).body(Vec::new()).context("building a request")
}

/// A GET asking for `accept`.
fn get_as(uri: &str, accept: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    http::Request::get(uri).header(http::header::ACCEPT, accept).body(Vec::new()).context("building a request")
}

/// A plain LIST (in `accept`, JSON when none); returns the body's length.
async fn list(client: &kube::Client, path: &str, accept: Option<&str>) -> anyhow::Result<usize> {
    let uri = format!("{path}?resourceVersion=0");
    let request = match accept {
        Some(accept) => get_as(&uri, accept)?,
        None => get(&uri)?,
    };
    let mut body = client.request_stream(request).await?;
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

/// A streaming list in protobuf, until its end bookmark: frames of a 4-byte length and a
/// `WatchEvent` (field 1, its type, comes first), read without decoding the objects.
async fn streaming_protobuf(client: &kube::Client, path: &str) -> anyhow::Result<()> {
    let uri = format!(
        "{path}?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=600"
    );
    let mut body = client.request_stream(get_as(&uri, PROTOBUF)?).await?;
    let mut frame = Vec::with_capacity(1 << 16);
    loop {
        let mut len = [0u8; 4];
        body.read_exact(&mut len)
            .await
            .with_context(|| format!("{path}: the streaming list ended before its end bookmark"))?;
        frame.resize(u32::from_be_bytes(len) as usize, 0);
        body.read_exact(&mut frame).await.context("reading a streaming list")?;
        // Field 1 (key 0x0a), a short string: the event's type.
        let type_ = match frame.as_slice() {
            [0x0a, n, rest @ ..] if rest.len() >= usize::from(*n) => &rest[..usize::from(*n)],
            _ => anyhow::bail!("{path}: a frame that is not a watch event"),
        };
        if type_ == b"BOOKMARK" && contains(&frame, b"k8s.io/initial-events-end") {
            return Ok(());
        }
        anyhow::ensure!(type_ != b"ERROR", "{path}: an ERROR event in a protobuf streaming list");
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
