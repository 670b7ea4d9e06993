//! The control plane seen from outside: kube-apiserver's and etcd's CPU and memory from
//! `/proc/<pid>`, and the requests the fleet made, from the API server's audit log.
//!
//! Requests are counted from the audit log rather than `apiserver_request_total`: the metric
//! has no client label, so the API server's own loopback informers (its Service IP repair
//! loop, its ServiceCIDR and IPAddress informers) would be counted with the fleet's, and it
//! cannot say how many lists *each* proxy made. The audit policy records every request of the
//! proxies' user (`system:kube-proxy`) at `Metadata` level and nothing else; each event carries
//! the node's address (`sourceIPs`), verb, resource and query.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead as _, Seek as _};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::daemon::kproxy::{cpu_seconds as parse_cpu, memory_mib};

/// CPU (user + system, waited-for children included) of `pid` so far, s, in `/proc/<pid>/stat`'s
/// 10 ms ticks: for the proxies, whose `nft` children count.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("/proc/{pid}/stat"))?;
    parse_cpu(&stat).with_context(|| format!("parsing /proc/{pid}/stat"))
}

/// CPU of kube-apiserver or etcd so far, s, to the nanosecond: the sum of its threads' time on
/// a CPU (the first field of `/proc/<pid>/task/<tid>/schedstat`). A change costs the API server
/// a few milliseconds, less than one of `/proc/<pid>/stat`'s ticks, so ticks summed over a few
/// changes could not tell two fleets apart. A thread that ended takes its time with it (these
/// Go servers keep theirs); neither has children. Ticks where schedstat is missing.
pub fn plane_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let tasks = format!("/proc/{pid}/task");
    let Ok(entries) = std::fs::read_dir(&tasks) else { return cpu_seconds(pid) };
    let mut ns = 0u64;
    for entry in entries.flatten() {
        // A thread may end between the listing and the read.
        let Ok(schedstat) = std::fs::read_to_string(entry.path().join("schedstat")) else { continue };
        let on_cpu = schedstat.split_whitespace().next().and_then(|f| f.parse::<u64>().ok());
        ns += on_cpu.with_context(|| format!("parsing {}/schedstat", entry.path().display()))?;
    }
    Ok(ns as f64 / 1e9)
}

/// `VmRSS` of `pid`, MiB.
pub fn rss_mib(pid: u32) -> anyhow::Result<f64> {
    Ok(memory_mib(pid)?.rss)
}

/// The highest `VmRSS` of some processes, sampled every 50 ms until stopped (the peak of a
/// window; `VmHWM` is the process's whole life).
pub struct PeakWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

/// How often [`PeakWatch`] samples.
const PEAK_SAMPLE: Duration = Duration::from_millis(50);

impl PeakWatch {
    pub fn start(pids: Vec<u32>) -> PeakWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peaks = vec![0.0f64; pids.len()];
            loop {
                for (peak, pid) in peaks.iter_mut().zip(&pids) {
                    if let Ok(rss) = rss_mib(*pid) {
                        *peak = peak.max(rss);
                    }
                }
                if flag.load(Ordering::Relaxed) {
                    return peaks;
                }
                std::thread::sleep(PEAK_SAMPLE);
            }
        });
        PeakWatch { stop, thread }
    }

    /// The peak of each process, MiB, in the order given.
    pub fn stop(self) -> Vec<f64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// The proxies' user, as the fleet's kubeconfig names it.
const PROXY_USER: &str = "system:kube-proxy";

/// The API server's audit log of the proxies' requests.
pub struct Audit {
    policy: PathBuf,
    log: PathBuf,
}

impl Audit {
    /// Writes the policy into `dir`; the log will be `dir/audit.log`.
    pub fn new(dir: &Path) -> anyhow::Result<Audit> {
        let policy = dir.join("audit-policy.yaml");
        let text = format!(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n\
             - level: Metadata\n  users: [\"{PROXY_USER}\"]\n- level: None\n"
        );
        std::fs::write(&policy, text).with_context(|| format!("{}", policy.display()))?;
        Ok(Audit { policy, log: dir.join("audit.log") })
    }

    /// kube-apiserver's flags for it (the log written as each request is done: `blocking`).
    pub fn apiserver_args(&self) -> Vec<String> {
        vec![
            format!("--audit-policy-file={}", self.policy.display()),
            format!("--audit-log-path={}", self.log.display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
        ]
    }

    /// Where the log ends now (requests after this are read by [`Audit::since`]).
    pub fn offset(&self) -> u64 {
        std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0)
    }

    /// The proxies' requests logged after `offset`, by the node they came from (`nodes[k]`:
    /// node k's address).
    pub fn since(&self, offset: u64, nodes: &[Ipv4Addr]) -> anyhow::Result<Requests> {
        let mut file = match std::fs::File::open(&self.log) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Requests::default()),
            Err(e) => return Err(e).with_context(|| format!("{}", self.log.display())),
        };
        file.seek(std::io::SeekFrom::Start(offset))?;
        let mut events: Vec<Event> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            // A line being written as we read is incomplete: skip it (the window has ended).
            let Ok(event) = serde_json::from_str::<AuditEvent>(&line) else { continue };
            let code = event.response_status.as_ref().and_then(|s| s.code);
            match index.get(&event.audit_id) {
                // A long-running request logs twice (response started, complete): keep one, the
                // later stage's code.
                Some(&i) => events[i].code = code.or(events[i].code),
                None => {
                    index.insert(event.audit_id.clone(), events.len());
                    events.push(Event::from(event, code));
                }
            }
        }
        Ok(Requests::tally(&events, nodes))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    // camelCase would make these `requestUri` and `sourceIps`: the audit API spells them so.
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    #[serde(default, rename = "sourceIPs")]
    source_ips: Vec<String>,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<Status>,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: Option<String>,
}

#[derive(Deserialize)]
struct Status {
    code: Option<u16>,
}

struct Event {
    verb: String,
    streaming: bool,
    source: String,
    resource: String,
    code: Option<u16>,
}

impl Event {
    fn from(e: AuditEvent, code: Option<u16>) -> Event {
        Event {
            streaming: e.request_uri.contains("sendInitialEvents=true"),
            verb: e.verb,
            source: e.source_ips.first().cloned().unwrap_or_default(),
            resource: e.object_ref.and_then(|o| o.resource).unwrap_or_default(),
            code,
        }
    }
}

/// One kind's requests from the fleet in a window.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct KindRequests {
    /// Lists served (2xx): plain LISTs plus streaming lists.
    pub lists: usize,
    /// Of those, streaming lists (a WATCH with `sendInitialEvents=true`).
    pub streaming_lists: usize,
    /// Watches served (2xx), streaming lists not included.
    pub watches: usize,
    /// GETs served.
    pub gets: usize,
    /// Lists, watches and GETs answered with an error (403 before RBAC's caches are filled,
    /// 429, 5xx): they cost the API server little.
    pub refused: usize,
    /// The most lists (served) of this kind one proxy made.
    pub max_lists_per_proxy: usize,
}

/// The fleet's requests in a window, by resource (`services`, `endpointslices`, ...).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Requests {
    pub kinds: BTreeMap<String, KindRequests>,
    /// Other verbs (creates of Events, ...).
    pub other: usize,
    /// Requests from an address that is no node's (none expected).
    pub unknown_source: usize,
}

impl Requests {
    fn tally(events: &[Event], nodes: &[Ipv4Addr]) -> Requests {
        let node_of: HashMap<String, usize> = nodes.iter().enumerate().map(|(k, ip)| (ip.to_string(), k)).collect();
        let mut requests = Requests::default();
        let mut lists_by_proxy: HashMap<(String, usize), usize> = HashMap::new();
        for event in events {
            let Some(&node) = node_of.get(&event.source) else {
                requests.unknown_source += 1;
                continue;
            };
            if !matches!(event.verb.as_str(), "list" | "watch" | "get") {
                requests.other += 1;
                continue;
            }
            let kind = requests.kinds.entry(event.resource.clone()).or_default();
            if !event.code.is_some_and(|c| (200..300).contains(&c)) {
                kind.refused += 1;
                continue;
            }
            match (event.verb.as_str(), event.streaming) {
                ("list", _) | ("watch", true) => {
                    kind.lists += 1;
                    kind.streaming_lists += usize::from(event.streaming);
                    *lists_by_proxy.entry((event.resource.clone(), node)).or_default() += 1;
                }
                ("watch", false) => kind.watches += 1,
                _ => kind.gets += 1,
            }
        }
        for ((resource, _), count) in lists_by_proxy {
            if let Some(kind) = requests.kinds.get_mut(&resource) {
                kind.max_lists_per_proxy = kind.max_lists_per_proxy.max(count);
            }
        }
        requests
    }

    /// Lists served, all kinds.
    pub fn lists(&self) -> usize {
        self.kinds.values().map(|k| k.lists).sum()
    }

    /// The most lists one proxy made of any one kind.
    pub fn max_lists_per_proxy(&self) -> usize {
        self.kinds.values().map(|k| k.max_lists_per_proxy).max().unwrap_or(0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests: a panic is a failure
mod tests {
    use super::*;

    #[test]
    fn a_watch_logged_at_start_and_end_counts_once_and_streaming_lists_count_as_lists() {
        let dir = tempfile::tempdir().unwrap();
        let audit = Audit::new(dir.path()).unwrap();
        let line = |id: &str, verb: &str, uri: &str, ip: &str, resource: &str, code: u16| {
            format!(
                "{{\"auditID\":\"{id}\",\"stage\":\"x\",\"verb\":\"{verb}\",\"requestURI\":\"{uri}\",\
                 \"sourceIPs\":[\"{ip}\"],\"objectRef\":{{\"resource\":\"{resource}\"}},\
                 \"responseStatus\":{{\"code\":{code}}}}}\n"
            )
        };
        let n0 = "198.51.100.10";
        let n1 = "198.51.100.11";
        let text = [
            line("a", "watch", "/apis/x?watch=true&sendInitialEvents=true", n0, "endpointslices", 200),
            line("a", "watch", "/apis/x?watch=true&sendInitialEvents=true", n0, "endpointslices", 200),
            line("b", "list", "/api/v1/services?limit=500", n1, "services", 200),
            line("c", "list", "/api/v1/services?limit=500", n1, "services", 200),
            line("d", "watch", "/api/v1/services?watch=true", n1, "services", 200),
            line("e", "list", "/api/v1/services", n0, "services", 403),
            line("f", "create", "/api/v1/events", n0, "events", 201),
            line("g", "list", "/api/v1/nodes", "10.0.0.1", "nodes", 200),
        ]
        .concat();
        std::fs::write(dir.path().join("audit.log"), text + "{\"auditID\":\"trunc").unwrap();
        let nodes = [n0.parse().unwrap(), n1.parse().unwrap()];
        let got = audit.since(0, &nodes).unwrap();
        let slices = &got.kinds["endpointslices"];
        assert_eq!((slices.lists, slices.streaming_lists, slices.watches), (1, 1, 0));
        let services = &got.kinds["services"];
        assert_eq!((services.lists, services.watches, services.refused), (2, 1, 1));
        assert_eq!(services.max_lists_per_proxy, 2);
        assert_eq!((got.other, got.unknown_source, got.lists(), got.max_lists_per_proxy()), (1, 1, 3, 2));
    }
}
