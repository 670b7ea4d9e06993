//! `kproxy explain`: what a node does with one packet, and why — computed from the same sources
//! and settings as the daemon (`--manifests DIR` or a kubeconfig), or asked of a running daemon
//! (`--server HOST:PORT`, its `/debug/explain`). The semantics are [`kproxy_plan::explain`]'s.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use kproxy_config::ProxyConfig;
use kproxy_plan::Planner;
use kproxy_plan::explain::{Explanation, Host, Packet, explain};
use kproxy_state::{Change, ClusterState, Kind, Protocol};

use crate::Output;

/// The `explain` subcommand's own arguments. The cluster comes from the daemon's flags, given
/// before or after `explain`: `--manifests DIR`, else the API server of `--kubeconfig` (which
/// wins over `--config`'s `clientConnection.kubeconfig` here, as it always did for explain).
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// Ask a running kproxy instead, on its metrics listener (e.g. 127.0.0.1:10249).
    #[arg(long, value_name = "HOST:PORT")]
    server: Option<String>,
    /// The node the packet arrives at (default: --hostname-override, else the hostname).
    #[arg(long)]
    node: Option<String>,
    /// Source address of the packet.
    #[arg(long, value_name = "IP")]
    from: IpAddr,
    /// Destination of the packet.
    #[arg(long, value_name = "IP:PORT")]
    to: SocketAddr,
    /// Protocol.
    #[arg(long, default_value = "tcp", value_parser = parse_protocol)]
    protocol: Protocol,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

fn parse_protocol(value: &str) -> Result<Protocol, String> {
    kproxy_servers::explain::parse_protocol(value)
}

/// Runs `kproxy explain`.
pub fn run(config: &ProxyConfig, flags: &kproxy_config::Flags, args: ExplainArgs) -> anyhow::Result<()> {
    let packet = Packet { from: args.from, to: args.to, protocol: args.protocol };
    let explanation = match &args.server {
        Some(server) => {
            if args.node.is_some() {
                bail!("--node does not go with --server: the daemon explains for its own node");
            }
            if flags.manifests.is_some() || flags.kubeconfig.is_some() {
                bail!("--manifests and --kubeconfig do not go with --server: the daemon explains from its own view");
            }
            ask_server(server, &packet)?
        }
        None => {
            let state = match (&flags.manifests, &flags.kubeconfig) {
                (Some(_), Some(_)) => bail!("--manifests and --kubeconfig: one source of the cluster, not both"),
                (Some(dir), None) => crate::load_manifests(dir)?,
                (None, kubeconfig) => load_from_api(config, kubeconfig.as_ref().map(PathBuf::from))?,
            };
            explain_offline(config, &state, args.node, &packet)
        }
    };
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&explanation)?),
        Output::Table => print!("{}", render(&packet, &explanation)),
    }
    Ok(())
}

/// Plans the node as the daemon would and explains `packet` on it. The interface addresses of
/// this machine stand for the node's only when it is the node asked about.
fn explain_offline(config: &ProxyConfig, state: &ClusterState, node: Option<String>, packet: &Packet) -> Explanation {
    let here = crate::node::node_name(config);
    let name = node.unwrap_or_else(|| here.clone());
    let mut context = crate::node::context(config, name.clone());
    if name != here {
        context.local_addresses.clear();
    }
    let host = Host::of_node(state, &name, context.local_addresses.clone());
    let plan = Planner::new(crate::policy::proxy_policy(config), context).build(state);
    explain(&plan, &host, packet)
}

/// Lists Services, EndpointSlices, the Node and ServiceCIDRs once, through the same watch
/// source as the daemon, until Services and EndpointSlices are complete.
fn load_from_api(config: &ProxyConfig, kubeconfig: Option<PathBuf>) -> anyhow::Result<ClusterState> {
    let mut connection = config.client_connection.clone();
    if kubeconfig.is_some() {
        connection.kubeconfig = kubeconfig;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let options = crate::api_client::source_options(&connection, crate::node::node_name(config))?;
        let client = crate::api_client::client(&connection).await.context("connecting to the Kubernetes API")?;
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Change>(1024);
        let stats = std::sync::Arc::new(kproxy_kube_source::SourceStats::new());
        let source = tokio::spawn(kproxy_kube_source::run(client, options, tx, stats));
        let mut state = ClusterState::new();
        let listed = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(change) = rx.recv().await {
                state.apply(change);
                if state.is_synced(Kind::Service) && state.is_synced(Kind::EndpointSlice) {
                    return true;
                }
            }
            false
        })
        .await;
        source.abort();
        match listed {
            Ok(true) => Ok(state),
            Ok(false) => bail!("the API source stopped before listing Services and EndpointSlices"),
            Err(_) => bail!("listing Services and EndpointSlices took over 60 s"),
        }
    })
}

/// `GET /debug/explain` of a running kproxy.
pub fn ask_server(server: &str, packet: &Packet) -> anyhow::Result<Explanation> {
    let addr = server
        .to_socket_addrs()
        .with_context(|| format!("--server {server}: want HOST:PORT"))?
        .next()
        .with_context(|| format!("--server {server} resolves to no address"))?;
    let path = format!(
        "/debug/explain?from={}&to={}&protocol={}",
        packet.from,
        percent_encode(&packet.to.to_string()),
        packet.protocol
    );
    let (status, body) = http_get(addr, &path).with_context(|| format!("asking {addr}"))?;
    if status != 200 {
        bail!("{addr} answered {status}: {}", body.trim());
    }
    serde_json::from_str(&body).with_context(|| format!("reading the answer of {addr}"))
}

fn percent_encode(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '[' => "%5B".to_owned(),
            ']' => "%5D".to_owned(),
            ':' => "%3A".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// A plain HTTP/1.1 GET with `Connection: close` (the metrics listener answers with a length).
fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let timeout = Duration::from_secs(15);
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
    stream.set_read_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("no HTTP status line")?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

/// A short paragraph, then the endpoints as a table.
pub fn render(packet: &Packet, e: &Explanation) -> String {
    let mut out = String::new();
    let what = match (&e.service, e.destination) {
        (Some(service), Some(kind)) => format!("{kind} of {service}"),
        _ => "no service port".to_owned(),
    };
    out.push_str(&format!(
        "{} {} ({}) -> {}, {what}: {}\n",
        packet.protocol,
        packet.from,
        e.source,
        packet.to,
        e.verdict.to_string().to_uppercase()
    ));
    out.push_str(&format!("{}\n", e.reason));
    if let Some(ranges) = &e.source_ranges {
        let allowed: Vec<String> = ranges.allowed.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "loadBalancerSourceRanges {}: source {}\n",
            allowed.join(","),
            if ranges.source_allowed { "allowed" } else { "not allowed" }
        ));
    }
    if let Some(t) = e.affinity_timeout_seconds {
        out.push_str(&format!("ClientIP affinity: later connections of this client stick to its endpoint for {t}s\n"));
    }
    if let Some(c) = &e.connections {
        out.push_str(&format!(
            "new connections so far: {} served, {} rejected (no endpoints), {} dropped (no local endpoint), {} dropped by source ranges\n",
            c.served, c.rejected_no_endpoints, c.dropped_no_local_endpoints, c.dropped_by_source_ranges
        ));
    }
    for (what, counts) in [("packets", &e.packets), ("bytes", &e.bytes)] {
        if let Some(c) = counts {
            out.push_str(&format!(
                "{what} so far: {} served (both directions), {} rejected (no endpoints), {} dropped (no local endpoint), {} dropped by source ranges\n",
                c.served, c.rejected_no_endpoints, c.dropped_no_local_endpoints, c.dropped_by_source_ranges
            ));
        }
    }
    if e.verdict == kproxy_plan::explain::Verdict::Dnat {
        out.push_str(&format!(
            "acceleration: {}\n",
            if e.acceleration_eligible {
                "eligible (established connections go to the flowtable where the kernel has one)"
            } else {
                "not eligible"
            }
        ));
    }
    if e.endpoints.is_empty() {
        return out;
    }
    let mut rows = vec![[
        "ENDPOINT".to_owned(),
        "PROBABILITY".into(),
        "WHERE".into(),
        "MASQUERADE".into(),
        "SOURCE SEEN".into(),
        "WHY".into(),
    ]];
    rows.extend(e.endpoints.iter().map(|ep| {
        [
            ep.address.to_string(),
            format!("{:.3}", ep.probability),
            format!("{}{}", if ep.local { "local" } else { "remote" }, if ep.ready { "" } else { ", terminating" }),
            if ep.masquerade { "yes".into() } else { "no".into() },
            match (ep.source_seen, ep.source_seen_certain) {
                (Some(ip), true) => ip.to_string(),
                (Some(ip), false) => format!("{ip} (egress address)"),
                (None, _) => "egress address".to_owned(),
            },
            ep.masquerade_reason.to_string(),
        ]
    }));
    out.push('\n');
    out.push_str(&crate::columns::render(&rows));
    if e.endpoints_omitted > 0 {
        out.push_str(&format!(
            "… and {} more endpoints (the daemon lists at most {})\n",
            e.endpoints_omitted,
            e.endpoints.len()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use kproxy_plan::explain::{ConnectionCounts, Host, explain};

    use super::*;

    #[test]
    fn counts_are_printed_next_to_each_other_and_only_when_counted() {
        let packet = Packet {
            from: "198.18.0.10".parse().unwrap(),
            to: "198.18.128.12:90".parse().unwrap(),
            protocol: Protocol::Tcp,
        };
        let mut e = explain(&kproxy_plan::Plan::default(), &Host::default(), &packet);
        assert!(!render(&packet, &e).contains("so far"));
        let counts =
            |served, rejected| ConnectionCounts { served, rejected_no_endpoints: rejected, ..Default::default() };
        (e.connections, e.packets, e.bytes) = (Some(counts(5, 4)), Some(counts(130, 4)), Some(counts(662200, 240)));
        let text = render(&packet, &e);
        let lines: Vec<&str> = text.lines().filter(|l| l.contains("so far")).collect();
        assert_eq!(
            lines,
            [
                "new connections so far: 5 served, 4 rejected (no endpoints), 0 dropped (no local endpoint), 0 dropped by source ranges",
                "packets so far: 130 served (both directions), 4 rejected (no endpoints), 0 dropped (no local endpoint), 0 dropped by source ranges",
                "bytes so far: 662200 served (both directions), 240 rejected (no endpoints), 0 dropped (no local endpoint), 0 dropped by source ranges",
            ]
        );
    }
}
