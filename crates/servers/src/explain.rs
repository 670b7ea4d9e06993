//! `GET /debug/explain?from=IP&to=IP:PORT&protocol=tcp` on the metrics listener: what the node
//! does with that packet, answered by the daemon from the plan now in the kernel.
//!
//! This module only speaks HTTP: it parses the query and hands it to an [`Explainer`] the
//! daemon provides, which owns the plan and the semantics.
//!
//! An answer tells which endpoints sit behind any address of the node, and the metrics listener
//! is often bound to every address for Prometheus: so by default only the node itself may ask
//! ([`ExplainAccess::Local`]), and at most [`EXPLAIN_RATE`] questions a second are answered
//! (429 beyond), so that a flood costs the sync loop, which answers them, next to nothing.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use kproxy_state::Protocol;

/// The question: one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExplainQuery {
    /// Source address.
    pub from: IpAddr,
    /// Destination address and port.
    pub to: SocketAddr,
    /// Protocol (`tcp` when not given).
    pub protocol: Protocol,
}

/// Why the daemon could not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExplainUnavailable {
    /// No plan is known to be in the kernel: no sync so far, or the last one failed.
    NotSynced,
    /// The sync loop did not answer in time (a long sync, or it stopped).
    Busy,
}

/// The answer's JSON, or why there is none.
pub type ExplainResult = Result<serde_json::Value, ExplainUnavailable>;

type ExplainFn = dyn Fn(ExplainQuery) -> Pin<Box<dyn Future<Output = ExplainResult> + Send>> + Send + Sync;

/// Who may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExplainAccess {
    /// The node itself (see [`crate::ConnInfo::from_this_node`]); anyone else gets 403.
    Local,
    /// Anyone who reaches the listener.
    Any,
}

/// Questions answered per second at most, and the burst allowed.
pub const EXPLAIN_RATE: u32 = 20;

/// A token bucket of [`EXPLAIN_RATE`] per second.
#[derive(Debug)]
struct RateLimit {
    /// Tokens left, and when they were counted.
    state: std::sync::Mutex<(f64, std::time::Instant)>,
}

impl RateLimit {
    fn new() -> Self {
        RateLimit { state: std::sync::Mutex::new((f64::from(EXPLAIN_RATE), std::time::Instant::now())) }
    }

    /// Takes a token if there is one.
    fn take(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        let refill = now.saturating_duration_since(state.1).as_secs_f64() * f64::from(EXPLAIN_RATE);
        *state = ((state.0 + refill).min(f64::from(EXPLAIN_RATE)), now);
        if state.0 >= 1.0 {
            state.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Answers explain queries (provided by the daemon, which owns the plan), to whom it may.
#[derive(Clone)]
pub struct Explainer {
    answer: Arc<ExplainFn>,
    access: ExplainAccess,
    limit: Arc<RateLimit>,
}

impl Explainer {
    /// An explainer calling `f`, for the node itself only.
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(ExplainQuery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ExplainResult> + Send + 'static,
    {
        Explainer {
            answer: Arc::new(move |q| Box::pin(f(q))),
            access: ExplainAccess::Local,
            limit: Arc::new(RateLimit::new()),
        }
    }

    /// Who may ask.
    pub fn with_access(mut self, access: ExplainAccess) -> Self {
        self.access = access;
        self
    }
}

impl fmt::Debug for Explainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Explainer")
    }
}

/// How long a query may wait for the sync loop before `503`.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// The longest query string read.
const MAX_QUERY_BYTES: usize = 512;

/// Answers one request from the client at `conn`: `403` to a client the access does not allow,
/// `429` beyond the rate, `400` for a malformed query, `503` when the daemon cannot answer yet.
pub async fn answer(
    explainer: &Explainer,
    conn: Option<crate::ConnInfo>,
    raw_query: Option<&str>,
) -> (StatusCode, String) {
    if explainer.access == ExplainAccess::Local && !conn.is_some_and(|c| c.from_this_node()) {
        let why = "/debug/explain answers the node itself only (kproxy --explain-access=any opens it to others)";
        return (StatusCode::FORBIDDEN, error_body(why));
    }
    if !explainer.limit.take() {
        return (StatusCode::TOO_MANY_REQUESTS, error_body(&format!("at most {EXPLAIN_RATE} questions a second")));
    }
    let raw_query = raw_query.unwrap_or("");
    if raw_query.len() > MAX_QUERY_BYTES {
        return (StatusCode::BAD_REQUEST, error_body(&format!("the query is longer than {MAX_QUERY_BYTES} bytes")));
    }
    let query = match parse_query(raw_query) {
        Ok(q) => q,
        Err(e) => return (StatusCode::BAD_REQUEST, error_body(&e)),
    };
    match tokio::time::timeout(ANSWER_WITHIN, (explainer.answer)(query)).await {
        Ok(Ok(value)) => (StatusCode::OK, value.to_string()),
        Ok(Err(ExplainUnavailable::NotSynced)) => {
            let why = "no plan is known to be in the kernel: the first sync has not run, or the last one failed";
            (StatusCode::SERVICE_UNAVAILABLE, error_body(why))
        }
        Ok(Err(ExplainUnavailable::Busy)) | Err(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, error_body("the sync loop did not answer in time; try again"))
        }
    }
}

fn error_body(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

/// Parses `from=IP&to=IP:PORT[&protocol=tcp|udp|sctp]` (percent-encoded or not; IPv6
/// destinations as `[addr]:port`).
pub fn parse_query(raw: &str) -> Result<ExplainQuery, String> {
    let (mut from, mut to, mut protocol) = (None, None, Protocol::Tcp);
    for pair in raw.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = percent_decode(value)?;
        match key {
            "from" => from = Some(value.parse::<IpAddr>().map_err(|e| format!("from={value}: {e}"))?),
            "to" => to = Some(value.parse::<SocketAddr>().map_err(|e| format!("to={value}: {e} (want IP:PORT)"))?),
            "protocol" => protocol = parse_protocol(&value)?,
            other => return Err(format!("unknown parameter {other:?} (want from, to, protocol)")),
        }
    }
    match (from, to) {
        (Some(from), Some(to)) => Ok(ExplainQuery { from, to, protocol }),
        _ => Err("from=IP and to=IP:PORT are required".to_owned()),
    }
}

/// `tcp`, `udp` or `sctp`, in any case.
pub fn parse_protocol(value: &str) -> Result<Protocol, String> {
    Protocol::from_k8s(Some(&value.to_ascii_uppercase()))
}

fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3).ok_or_else(|| format!("bad percent-encoding in {s:?}"))?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad percent-encoding in {s:?}"))?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parses_plain_and_percent_encoded_addresses_with_tcp_by_default() {
        let q = parse_query("from=203.0.113.7&to=198.18.128.10:80").unwrap();
        assert_eq!(q.from, "203.0.113.7".parse::<IpAddr>().unwrap());
        assert_eq!(q.to, "198.18.128.10:80".parse::<SocketAddr>().unwrap());
        assert_eq!(q.protocol, Protocol::Tcp);
        let q = parse_query("from=fd00%3A%3A7&to=%5Bfd00%3A96%3A%3A10%5D%3A53&protocol=UDP").unwrap();
        assert_eq!(q.to, "[fd00:96::10]:53".parse::<SocketAddr>().unwrap());
        assert_eq!(q.protocol, Protocol::Udp);
    }

    #[test]
    fn query_without_destination_or_with_unknown_parameters_is_refused() {
        assert!(parse_query("from=203.0.113.7").is_err());
        assert!(parse_query("from=203.0.113.7&to=198.18.128.10").is_err(), "a port is required");
        assert!(parse_query("from=203.0.113.7&to=198.18.128.10:80&proto=tcp").is_err());
        assert!(parse_query("from=203.0.113.7&to=198.18.128.10:80&protocol=icmp").is_err());
    }
}
