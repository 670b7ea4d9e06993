//! The cluster DNS stand-in (no CoreDNS image exists offline): a small authoritative server for
//! `cluster.local`, fed by polling the API server's Services and EndpointSlices once a second,
//! answering what Kubernetes' DNS specification and the e2e network tests ask:
//!
//! - `SVC.NS.svc.cluster.local` A and AAAA: the ClusterIPs of each family; for a headless
//!   Service, its ready endpoints (IPv4 and IPv6 EndpointSlices alike); ExternalName: a CNAME;
//! - `HOST.SVC.NS.svc.cluster.local` A/AAAA for a headless Service's endpoints with a hostname;
//! - `_PORT._PROTO.SVC.NS.svc.cluster.local` SRV for named ports;
//! - `A-B-C-D.NS.pod.cluster.local` A and `FD00-19--5.NS.pod.cluster.local` AAAA (any address,
//!   as CoreDNS's `pods insecure`, which reads IPv6 with `-` for `:`);
//! - `D.C.B.A.in-addr.arpa` and nibble-format `….ip6.arpa` PTR for ClusterIPs and headless
//!   endpoints with a hostname.
//!
//! Every other name under `cluster.local` is NXDOMAIN, a known name asked for another type is an
//! empty NOERROR, and nothing is forwarded (there is nowhere to forward to). It binds the node's
//! addresses (one of each family), not the wildcard: bound to it, its UDP replies to pods would
//! leave with the bridge's address and be dropped by the client.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result};
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, PTR, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use serde_json::Value;

/// TTL of every answer: short, the records change under the tests.
const TTL: u32 = 5;

/// How to reach the API server.
#[derive(Debug, Clone)]
pub struct DnsOptions {
    /// The node's addresses (one socket pair each).
    pub bind: Vec<IpAddr>,
    pub server: String,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub domain: String,
}

/// (namespace, name) of a Service.
type ServiceKey = (String, String);
/// A ready endpoint's address and hostname.
type Endpoint = (IpAddr, Option<String>);
/// (port name, lower-case protocol, port).
type NamedPort = (String, String, u16);

/// The records, keyed by lower-case FQDN with the trailing dot.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Zone {
    names: BTreeMap<String, Vec<RData>>,
    srv: BTreeMap<String, Vec<RData>>,
}

impl Zone {
    fn add(&mut self, name: String, data: RData) {
        let list = self.names.entry(name).or_default();
        if !list.contains(&data) {
            list.push(data);
        }
    }

    /// Builds the zone from the API's Service and EndpointSlice lists.
    pub fn build(services: &Value, slices: &Value, domain: &str) -> Zone {
        let mut zone = Zone::default();
        // Ready endpoints of each Service: (ns, svc) -> [(ip, hostname)]; ports (ns, svc) -> [(name, proto, port)].
        let mut endpoints: BTreeMap<ServiceKey, BTreeSet<Endpoint>> = BTreeMap::new();
        let mut slice_ports: BTreeMap<ServiceKey, BTreeSet<NamedPort>> = BTreeMap::new();
        for slice in items(slices) {
            if slice["addressType"] != "IPv4" && slice["addressType"] != "IPv6" {
                continue;
            }
            let ns = slice["metadata"]["namespace"].as_str().unwrap_or_default().to_owned();
            let Some(svc) = slice["metadata"]["labels"]["kubernetes.io/service-name"].as_str() else { continue };
            let key = (ns, svc.to_owned());
            for ep in slice["endpoints"].as_array().into_iter().flatten() {
                // Unset `ready` means ready; publishNotReadyAddresses makes the controller say ready.
                if ep["conditions"]["ready"] == Value::Bool(false) {
                    continue;
                }
                let hostname = ep["hostname"].as_str().map(str::to_owned);
                for addr in ep["addresses"].as_array().into_iter().flatten() {
                    if let Some(ip) = addr.as_str().and_then(|s| s.parse::<IpAddr>().ok()) {
                        endpoints.entry(key.clone()).or_default().insert((ip, hostname.clone()));
                    }
                }
            }
            for port in slice["ports"].as_array().into_iter().flatten() {
                if let (Some(name), Some(number)) = (port["name"].as_str(), port["port"].as_u64()) {
                    let proto = port["protocol"].as_str().unwrap_or("TCP").to_ascii_lowercase();
                    if !name.is_empty() {
                        slice_ports.entry(key.clone()).or_default().insert((name.to_owned(), proto, number as u16));
                    }
                }
            }
        }
        for svc in items(services) {
            let ns = svc["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = svc["metadata"]["name"].as_str().unwrap_or_default();
            let fqdn = format!("{name}.{ns}.svc.{domain}.").to_ascii_lowercase();
            let Some(target) = Name::from_ascii(&fqdn).ok() else { continue };
            let key = (ns.to_owned(), name.to_owned());
            let spec = &svc["spec"];
            if spec["type"] == "ExternalName" {
                if let Some(ext) = spec["externalName"].as_str()
                    && let Ok(ext) = Name::from_ascii(format!("{}.", ext.trim_end_matches('.')))
                {
                    zone.add(fqdn.clone(), RData::CNAME(CNAME(ext)));
                }
                continue;
            }
            let headless = spec["clusterIP"] == "None";
            let eps = endpoints.get(&key).cloned().unwrap_or_default();
            if headless {
                // The name exists even with no ready endpoint (NOERROR, no answer).
                zone.names.entry(fqdn.clone()).or_default();
                for (ip, hostname) in &eps {
                    zone.add(fqdn.clone(), address_record(*ip));
                    if let Some(host) = hostname {
                        let host_fqdn = format!("{host}.{fqdn}").to_ascii_lowercase();
                        zone.add(host_fqdn.clone(), address_record(*ip));
                        if let Ok(host_name) = Name::from_ascii(&host_fqdn) {
                            zone.add(reverse(*ip), RData::PTR(PTR(host_name)));
                        }
                    }
                }
                for (port_name, proto, port) in slice_ports.get(&key).into_iter().flatten() {
                    let srv_name = format!("_{port_name}._{proto}.{fqdn}").to_ascii_lowercase();
                    zone.names.entry(srv_name.clone()).or_default();
                    for (ip, hostname) in &eps {
                        let host = hostname.clone().unwrap_or_else(|| ip.to_string().replace(['.', ':'], "-"));
                        if let Ok(t) = Name::from_ascii(format!("{host}.{fqdn}")) {
                            zone.srv.entry(srv_name.clone()).or_default().push(RData::SRV(SRV::new(0, 100, *port, t)));
                        }
                    }
                }
                continue;
            }
            let ips: BTreeSet<IpAddr> = spec["clusterIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(std::iter::once(&spec["clusterIP"]))
                .filter_map(|v| v.as_str()?.parse().ok())
                .collect();
            if ips.is_empty() {
                continue;
            }
            for ip in &ips {
                zone.add(fqdn.clone(), address_record(*ip));
                zone.add(reverse(*ip), RData::PTR(PTR(target.clone())));
            }
            for port in spec["ports"].as_array().into_iter().flatten() {
                if let (Some(port_name), Some(number)) = (port["name"].as_str(), port["port"].as_u64()) {
                    if port_name.is_empty() {
                        continue;
                    }
                    let proto = port["protocol"].as_str().unwrap_or("TCP").to_ascii_lowercase();
                    let srv_name = format!("_{port_name}._{proto}.{fqdn}").to_ascii_lowercase();
                    zone.names.entry(srv_name.clone()).or_default();
                    zone.srv.entry(srv_name).or_default().push(RData::SRV(SRV::new(
                        0,
                        100,
                        number as u16,
                        target.clone(),
                    )));
                }
            }
        }
        zone
    }

    /// The answer to one question: (response code, records).
    pub fn answer(&self, name: &Name, kind: RecordType, domain: &str) -> (ResponseCode, Vec<Record>) {
        let key = name.to_ascii().to_ascii_lowercase();
        let key = if key.ends_with('.') { key } else { format!("{key}.") };
        let suffix = format!(".{domain}.");
        // A-B-C-D.NS.pod.cluster.local, or an IPv6 address with `-` for `:`.
        if let Some(rest) = key.strip_suffix(&format!(".pod{suffix}")) {
            let first = rest.split('.').next().unwrap_or_default();
            let ip = first
                .replace('-', ".")
                .parse::<Ipv4Addr>()
                .map(IpAddr::V4)
                .or_else(|_| first.replace('-', ":").parse::<Ipv6Addr>().map(IpAddr::V6));
            if let Ok(ip) = ip {
                let data = address_record(ip);
                let records =
                    if data.record_type() == kind { vec![Record::from_rdata(name.clone(), TTL, data)] } else { vec![] };
                return (ResponseCode::NoError, records);
            }
            return (ResponseCode::NXDomain, vec![]);
        }
        let data = self.names.get(&key);
        let Some(data) = data else {
            return (ResponseCode::NXDomain, vec![]);
        };
        let mut records = Vec::new();
        for d in data {
            let matches = d.record_type() == kind || (d.record_type() == RecordType::CNAME && kind != RecordType::PTR);
            if matches {
                records.push(Record::from_rdata(name.clone(), TTL, d.clone()));
            }
        }
        if kind == RecordType::SRV {
            for d in self.srv.get(&key).into_iter().flatten() {
                records.push(Record::from_rdata(name.clone(), TTL, d.clone()));
            }
        }
        (ResponseCode::NoError, records)
    }

    /// Whether a name is ours to answer (cluster domain or reverse zone).
    fn authoritative_for(name: &str, domain: &str) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        name == domain
            || name.ends_with(&format!(".{domain}"))
            || name.ends_with(".in-addr.arpa")
            || name.ends_with(".ip6.arpa")
    }
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list["items"].as_array().into_iter().flatten()
}

/// An A or AAAA record of `ip`.
fn address_record(ip: IpAddr) -> RData {
    match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    }
}

/// The PTR name of `ip`: `D.C.B.A.in-addr.arpa.`, or the 32 nibbles of an IPv6 address
/// reversed under `ip6.arpa.`.
fn reverse(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0])
        }
        IpAddr::V6(v6) => {
            let mut name = String::with_capacity(72);
            for byte in v6.octets().iter().rev() {
                name.push_str(&format!("{:x}.{:x}.", byte & 0xf, byte >> 4));
            }
            name + "ip6.arpa."
        }
    }
}

/// Answers one wire-format query.
pub fn respond(zone: &Zone, query: &[u8], domain: &str) -> Option<Vec<u8>> {
    let request = Message::from_vec(query).ok()?;
    let mut response = Message::new();
    response
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(request.recursion_desired())
        .set_recursion_available(false);
    response.add_queries(request.queries().iter().cloned());
    let Some(question) = request.queries().first() else {
        response.set_response_code(ResponseCode::FormErr);
        return response.to_vec().ok();
    };
    if request.op_code() != OpCode::Query {
        response.set_response_code(ResponseCode::NotImp);
        return response.to_vec().ok();
    }
    if !Zone::authoritative_for(&question.name().to_ascii(), domain) {
        // Nothing outside the cluster can be resolved here (no upstream to forward to).
        response.set_response_code(ResponseCode::Refused);
        return response.to_vec().ok();
    }
    response.set_authoritative(true);
    let (code, records) = zone.answer(question.name(), question.query_type(), domain);
    response.set_response_code(code);
    response.add_answers(records);
    response.to_vec().ok()
}

/// Serves until the process is killed: one thread polls the API server; for each address, one
/// thread answers UDP and one accepts TCP.
pub fn serve(options: DnsOptions) -> Result<()> {
    let zone = Arc::new(RwLock::new(Zone::default()));
    let mut sockets = Vec::new();
    for ip in &options.bind {
        let addr = SocketAddr::new(*ip, 53);
        let udp = UdpSocket::bind(addr).with_context(|| format!("binding {addr}/udp"))?;
        let tcp = TcpListener::bind(addr).with_context(|| format!("binding {addr}/tcp"))?;
        sockets.push((udp, tcp));
    }
    let agent = agent(&options)?;
    {
        let zone = Arc::clone(&zone);
        let options = options.clone();
        std::thread::spawn(move || poll(&agent, &options, &zone));
    }
    let mut udp_threads = Vec::new();
    for (udp, tcp) in sockets {
        let (tcp_zone, domain) = (Arc::clone(&zone), options.domain.clone());
        std::thread::spawn(move || {
            for stream in tcp.incoming().flatten() {
                let zone = Arc::clone(&tcp_zone);
                let domain = domain.clone();
                std::thread::spawn(move || serve_tcp(stream, &zone, &domain));
            }
        });
        let (zone, domain) = (Arc::clone(&zone), options.domain.clone());
        udp_threads.push(std::thread::spawn(move || serve_udp(&udp, &zone, &domain)));
    }
    tracing::info!("cluster DNS on {:?} port 53 (udp, tcp) for {}", options.bind, options.domain);
    for thread in udp_threads {
        match thread.join() {
            Ok(result) => result?,
            Err(_) => anyhow::bail!("a UDP thread of the DNS stand-in panicked"),
        }
    }
    Ok(())
}

fn serve_udp(udp: &UdpSocket, zone: &RwLock<Zone>, domain: &str) -> Result<()> {
    let mut buf = [0u8; 4096];
    loop {
        let (n, peer) = udp.recv_from(&mut buf)?;
        let reply = {
            let zone = zone.read().unwrap_or_else(|e| e.into_inner());
            respond(&zone, &buf[..n], domain)
        };
        if let Some(mut reply) = reply {
            if reply.len() > 512 {
                // Truncated: the client asks again over TCP.
                if let Ok(mut m) = Message::from_vec(&reply) {
                    m.take_answers();
                    m.set_truncated(true);
                    reply = m.to_vec().unwrap_or(reply);
                }
            }
            let _ = udp.send_to(&reply, peer);
        }
    }
}

fn serve_tcp(mut stream: TcpStream, zone: &RwLock<Zone>, domain: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    loop {
        let mut len = [0u8; 2];
        if stream.read_exact(&mut len).is_err() {
            return;
        }
        let mut query = vec![0u8; u16::from_be_bytes(len) as usize];
        if stream.read_exact(&mut query).is_err() {
            return;
        }
        let reply = {
            let zone = zone.read().unwrap_or_else(|e| e.into_inner());
            respond(&zone, &query, domain)
        };
        let Some(reply) = reply else { return };
        let Ok(n) = u16::try_from(reply.len()) else { return };
        if stream.write_all(&n.to_be_bytes()).and_then(|()| stream.write_all(&reply)).is_err() {
            return;
        }
    }
}

fn poll(agent: &ureq::Agent, options: &DnsOptions, zone: &RwLock<Zone>) {
    let mut failures = 0u32;
    loop {
        let fetched = get(agent, &options.server, "/api/v1/services")
            .and_then(|s| Ok((s, get(agent, &options.server, "/apis/discovery.k8s.io/v1/endpointslices")?)));
        match fetched {
            Ok((services, slices)) => {
                let fresh = Zone::build(&services, &slices, &options.domain);
                let mut current = zone.write().unwrap_or_else(|e| e.into_inner());
                if *current != fresh {
                    tracing::debug!(names = fresh.names.len(), "zone updated");
                    *current = fresh;
                }
                failures = 0;
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(60) {
                    tracing::warn!("listing from the API server failed ({failures} in a row): {e:#}");
                }
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn get(agent: &ureq::Agent, server: &str, path: &str) -> Result<Value> {
    let mut response = agent.get(format!("{server}{path}")).call().with_context(|| format!("GET {path}"))?;
    if response.status() != 200 {
        anyhow::bail!("GET {path}: {}", response.status());
    }
    let body = response.body_mut().with_config().limit(256 << 20).read_to_string()?;
    Ok(serde_json::from_str(&body)?)
}

fn agent(options: &DnsOptions) -> Result<ureq::Agent> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
    let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
    let ca = Certificate::from_pem(&read(&options.ca)?)?.to_owned();
    let cert = Certificate::from_pem(&read(&options.cert)?)?.to_owned();
    let key = PrivateKey::from_pem(&read(&options.key)?)?.to_owned();
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::Specific(Arc::new(vec![ca])))
        .client_cert(Some(ClientCert::new_with_certs(&[cert], key)))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn zone() -> Zone {
        let services = json!({"items": [
            {"metadata": {"namespace": "ns1", "name": "web"},
             "spec": {"type": "ClusterIP", "clusterIP": "198.18.128.20", "clusterIPs": ["198.18.128.20"],
                      "ports": [{"name": "http", "protocol": "TCP", "port": 80}]}},
            {"metadata": {"namespace": "ns1", "name": "db"},
             "spec": {"type": "ClusterIP", "clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}},
            {"metadata": {"namespace": "ns1", "name": "ext"},
             "spec": {"type": "ExternalName", "externalName": "example.invalid"}}
        ]});
        let slices = json!({"items": [
            {"metadata": {"namespace": "ns1", "labels": {"kubernetes.io/service-name": "db"}},
             "addressType": "IPv4", "ports": [{"name": "pg", "protocol": "TCP", "port": 5432}],
             "endpoints": [
                {"addresses": ["198.19.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
                {"addresses": ["198.19.1.6"], "conditions": {"ready": false}}
             ]}
        ]});
        Zone::build(&services, &slices, "cluster.local")
    }

    fn ask(zone: &Zone, name: &str, kind: RecordType) -> (ResponseCode, Vec<RData>) {
        let (code, records) = zone.answer(&Name::from_ascii(name).unwrap(), kind, "cluster.local");
        (code, records.into_iter().filter_map(|r| r.into_data().into()).collect())
    }

    #[test]
    fn cluster_ip_service_answers_a_srv_and_ptr() {
        let z = zone();
        let (code, a) = ask(&z, "web.ns1.svc.cluster.local.", RecordType::A);
        assert_eq!(code, ResponseCode::NoError);
        assert_eq!(a, vec![RData::A(A(Ipv4Addr::new(198, 18, 128, 20)))]);
        let (_, srv) = ask(&z, "_http._tcp.web.ns1.svc.cluster.local.", RecordType::SRV);
        assert_eq!(srv.len(), 1);
        let (_, ptr) = ask(&z, "20.128.18.198.in-addr.arpa.", RecordType::PTR);
        assert_eq!(ptr, vec![RData::PTR(PTR(Name::from_ascii("web.ns1.svc.cluster.local.").unwrap()))]);
    }

    #[test]
    fn headless_service_answers_only_ready_endpoints_and_their_hostnames() {
        let z = zone();
        let (_, a) = ask(&z, "db.ns1.svc.cluster.local.", RecordType::A);
        assert_eq!(a, vec![RData::A(A(Ipv4Addr::new(198, 19, 1, 5)))]);
        let (_, a) = ask(&z, "db-0.db.ns1.svc.cluster.local.", RecordType::A);
        assert_eq!(a, vec![RData::A(A(Ipv4Addr::new(198, 19, 1, 5)))]);
        let (_, srv) = ask(&z, "_pg._tcp.db.ns1.svc.cluster.local.", RecordType::SRV);
        assert_eq!(srv.len(), 1);
    }

    #[test]
    fn unknown_names_are_nxdomain_and_other_types_of_known_names_are_empty() {
        let z = zone();
        assert_eq!(ask(&z, "nope.ns1.svc.cluster.local.", RecordType::A).0, ResponseCode::NXDomain);
        let (code, aaaa) = ask(&z, "web.ns1.svc.cluster.local.", RecordType::AAAA);
        assert_eq!((code, aaaa.len()), (ResponseCode::NoError, 0));
        let (_, cname) = ask(&z, "ext.ns1.svc.cluster.local.", RecordType::A);
        assert_eq!(cname, vec![RData::CNAME(CNAME(Name::from_ascii("example.invalid.").unwrap()))]);
        let (_, pod) = ask(&z, "198-19-1-9.ns1.pod.cluster.local.", RecordType::A);
        assert_eq!(pod, vec![RData::A(A(Ipv4Addr::new(198, 19, 1, 9)))]);
    }

    #[test]
    fn dual_stack_services_answer_a_and_aaaa_headless_ipv6_slices_ipv6_pods_and_ip6_arpa() {
        let services = json!({"items": [
            {"metadata": {"namespace": "ns1", "name": "web"},
             "spec": {"type": "ClusterIP", "clusterIP": "198.18.128.20",
                      "clusterIPs": ["198.18.128.20", "fd00:18:128::20"], "ports": []}},
            {"metadata": {"namespace": "ns1", "name": "db"},
             "spec": {"type": "ClusterIP", "clusterIP": "None", "ports": []}}
        ]});
        let slices = json!({"items": [
            {"metadata": {"namespace": "ns1", "labels": {"kubernetes.io/service-name": "db"}},
             "addressType": "IPv6", "ports": [],
             "endpoints": [{"addresses": ["fd00:19:0:1::5"], "hostname": "db-0", "conditions": {"ready": true}}]},
            {"metadata": {"namespace": "ns1", "labels": {"kubernetes.io/service-name": "db"}},
             "addressType": "IPv4", "ports": [],
             "endpoints": [{"addresses": ["198.19.1.5"], "hostname": "db-0", "conditions": {"ready": true}}]}
        ]});
        let z = Zone::build(&services, &slices, "cluster.local");
        let v6: Ipv6Addr = "fd00:18:128::20".parse().unwrap();
        assert_eq!(ask(&z, "web.ns1.svc.cluster.local.", RecordType::AAAA).1, vec![RData::AAAA(AAAA(v6))]);
        assert_eq!(
            ask(&z, "web.ns1.svc.cluster.local.", RecordType::A).1,
            vec![RData::A(A(Ipv4Addr::new(198, 18, 128, 20)))],
            "the IPv4 ClusterIP too"
        );
        let pod6: Ipv6Addr = "fd00:19:0:1::5".parse().unwrap();
        assert_eq!(ask(&z, "db-0.db.ns1.svc.cluster.local.", RecordType::AAAA).1, vec![RData::AAAA(AAAA(pod6))]);
        assert_eq!(ask(&z, "db.ns1.svc.cluster.local.", RecordType::A).1.len(), 1, "the IPv4 slice's endpoint");
        let ptr = ask(&z, "0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.2.1.0.8.1.0.0.0.0.d.f.ip6.arpa.", RecordType::PTR);
        assert_eq!(ptr.1, vec![RData::PTR(PTR(Name::from_ascii("web.ns1.svc.cluster.local.").unwrap()))]);
        assert_eq!(ask(&z, "fd00-19-0-1--5.ns1.pod.cluster.local.", RecordType::AAAA).1, vec![RData::AAAA(AAAA(pod6))]);
        assert_eq!(ask(&z, "fd00-19-0-1--5.ns1.pod.cluster.local.", RecordType::A).1, vec![], "no A for an IPv6 pod");
        assert!(Zone::authoritative_for("5.0.0.0.ip6.arpa.", "cluster.local"));
    }
}
