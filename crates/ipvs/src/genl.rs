//! IPVS over generic netlink: the kernel's objects as Rust values, and their messages.
//!
//! The layout follows `include/uapi/linux/ip_vs.h` and the attribute order of `ipvsadm`'s
//! libipvs, so a capture of `ipvsadm` and of kproxy can be compared byte for byte (see the
//! tests). Addresses travel as 16-byte `nf_inet_addr`, ports in network order, everything else
//! in host order.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kproxy_state::{IpFamily, Protocol};

use crate::netlink::{self, Message, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};

/// The generic netlink family name.
pub const FAMILY_NAME: &str = "IPVS";
const GENL_VERSION: u8 = 1;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

const CMD_NEW_SERVICE: u8 = 1;
const CMD_SET_SERVICE: u8 = 2;
const CMD_DEL_SERVICE: u8 = 3;
const CMD_GET_SERVICE: u8 = 4;
const CMD_NEW_DEST: u8 = 5;
const CMD_SET_DEST: u8 = 6;
const CMD_DEL_DEST: u8 = 7;
const CMD_GET_DEST: u8 = 8;
const CMD_SET_CONFIG: u8 = 12;

const CMD_ATTR_SERVICE: u16 = 1;
const CMD_ATTR_DEST: u16 = 2;
const CMD_ATTR_TIMEOUT_TCP: u16 = 4;
const CMD_ATTR_TIMEOUT_TCP_FIN: u16 = 5;
const CMD_ATTR_TIMEOUT_UDP: u16 = 6;

const SVC_ATTR_AF: u16 = 1;
const SVC_ATTR_PROTOCOL: u16 = 2;
const SVC_ATTR_ADDR: u16 = 3;
const SVC_ATTR_PORT: u16 = 4;
const SVC_ATTR_FWMARK: u16 = 5;
const SVC_ATTR_SCHED_NAME: u16 = 6;
const SVC_ATTR_FLAGS: u16 = 7;
const SVC_ATTR_TIMEOUT: u16 = 8;
const SVC_ATTR_NETMASK: u16 = 9;

const DEST_ATTR_ADDR: u16 = 1;
const DEST_ATTR_PORT: u16 = 2;
const DEST_ATTR_FWD_METHOD: u16 = 3;
const DEST_ATTR_WEIGHT: u16 = 4;
const DEST_ATTR_U_THRESH: u16 = 5;
const DEST_ATTR_L_THRESH: u16 = 6;
const DEST_ATTR_ACTIVE_CONNS: u16 = 7;
const DEST_ATTR_INACT_CONNS: u16 = 8;
const DEST_ATTR_ADDR_FAMILY: u16 = 11;
const DEST_ATTR_TUN_TYPE: u16 = 13;
const DEST_ATTR_TUN_PORT: u16 = 14;
const DEST_ATTR_TUN_FLAGS: u16 = 15;

/// `IP_VS_CONN_F_MASQ`: NAT forwarding (the only one that can remap ports).
const FWD_MASQ: u32 = 0;
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

/// `IP_VS_SVC_F_PERSISTENT`: session affinity.
pub const F_PERSISTENT: u32 = 0x1;
/// `IP_VS_SVC_F_HASHED`: set by the kernel, ignored when comparing.
pub const F_HASHED: u32 = 0x2;
/// `IP_VS_SVC_F_SCHED1` (`sh-fallback`, `mh-fallback`).
pub const F_SCHED1: u32 = 0x8;
/// `IP_VS_SVC_F_SCHED2` (`sh-port`, `mh-port`).
pub const F_SCHED2: u32 = 0x10;

/// Which virtual service: by address, protocol and port, or by firewall mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceKey {
    /// `-t/-u/--sctp-service addr:port`.
    Addr {
        /// Virtual address.
        addr: IpAddr,
        /// Protocol.
        protocol: Protocol,
        /// Port.
        port: u16,
    },
    /// `-f mark`, per family.
    Fwmark {
        /// Family.
        family: IpFamily,
        /// The packet mark that selects the service.
        mark: u32,
    },
}

impl ServiceKey {
    /// The family.
    pub fn family(&self) -> IpFamily {
        match self {
            ServiceKey::Addr { addr, .. } => IpFamily::of(addr),
            ServiceKey::Fwmark { family, .. } => *family,
        }
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServiceKey::Addr { addr, protocol, port } => {
                write!(f, "{} {}", protocol.as_str(), std::net::SocketAddr::new(*addr, *port))
            }
            ServiceKey::Fwmark { family, mark } => write!(f, "fwmark {mark:#x} ({family:?})"),
        }
    }
}

/// A virtual service as kproxy wants it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceSpec {
    /// Identity.
    pub key: ServiceKey,
    /// Scheduler name (`rr`, `mh`, ...).
    pub scheduler: String,
    /// `IP_VS_SVC_F_*` flags (without `HASHED`).
    pub flags: u32,
    /// Persistence timeout in seconds (meaningful with `F_PERSISTENT`).
    pub timeout: u32,
}

/// Which real server of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DestKey {
    /// Address.
    pub addr: IpAddr,
    /// Port.
    pub port: u16,
}

/// A real server: NAT forwarding, no thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DestSpec {
    /// Identity.
    pub key: DestKey,
    /// Weight; 0 stops new connections (graceful termination).
    pub weight: u32,
}

/// A real server as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestState {
    /// What it is.
    pub spec: DestSpec,
    /// Connections in ESTABLISHED (TCP) or equivalent.
    pub active_conns: u32,
    /// Other connections (TIME_WAIT, UDP, ...).
    pub inactive_conns: u32,
}

impl DestState {
    /// Every connection IPVS tracks through it: what keeps it (or its service) draining.
    pub fn connections(&self) -> u64 {
        u64::from(self.active_conns) + u64::from(self.inactive_conns)
    }
}

/// One change to the kernel's IPVS table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpvsOp {
    /// `ipvsadm -A`.
    AddService(ServiceSpec),
    /// `ipvsadm -E`.
    UpdateService(ServiceSpec),
    /// `ipvsadm -D`.
    DeleteService(ServiceKey),
    /// `ipvsadm -a`.
    AddDest(ServiceKey, DestSpec),
    /// `ipvsadm -e`.
    UpdateDest(ServiceKey, DestSpec),
    /// `ipvsadm -d`.
    DeleteDest(ServiceKey, DestKey),
    /// `ipvsadm --set tcp tcpfin udp` (0 leaves a value unchanged).
    SetTimeouts {
        /// TCP established.
        tcp: u32,
        /// TCP after FIN.
        tcp_fin: u32,
        /// UDP.
        udp: u32,
    },
}

fn protocol_number(p: Protocol) -> u16 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn protocol_from(n: u16) -> Option<Protocol> {
    match n {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

fn af(family: IpFamily) -> u16 {
    match family {
        IpFamily::V4 => AF_INET,
        IpFamily::V6 => AF_INET6,
    }
}

/// `union nf_inet_addr`: 16 bytes, IPv4 in the first four.
fn inet_addr(addr: &IpAddr) -> [u8; 16] {
    let mut out = [0u8; 16];
    match addr {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
    }
    out
}

fn parse_addr(family: u16, p: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::new(*p.first()?, *p.get(1)?, *p.get(2)?, *p.get(3)?))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(p.get(..16)?).ok()?))),
        _ => None,
    }
}

fn genl_header(msg: &mut Message, cmd: u8) {
    msg.raw(&[cmd, GENL_VERSION, 0, 0]);
}

/// The controller request that resolves the IPVS family id.
pub fn resolve_family_request() -> Message {
    let mut m = Message::new(GENL_ID_CTRL, NLM_F_REQUEST | NLM_F_ACK);
    genl_header(&mut m, CTRL_CMD_GETFAMILY);
    m.str(CTRL_ATTR_FAMILY_NAME, FAMILY_NAME);
    m
}

/// The family id from the controller's answer (a generic netlink payload).
pub fn parse_family_id(payload: &[u8]) -> Option<u16> {
    netlink::find(payload.get(4..)?, CTRL_ATTR_FAMILY_ID).and_then(netlink::get_u16)
}

/// The identity attributes of a service (`AF`, then `FWMARK` or `PROTOCOL`/`ADDR`/`PORT`).
fn service_identity(m: &mut Message, key: &ServiceKey) {
    m.u16(SVC_ATTR_AF, af(key.family()));
    match key {
        ServiceKey::Addr { addr, protocol, port } => {
            m.u16(SVC_ATTR_PROTOCOL, protocol_number(*protocol));
            m.attr(SVC_ATTR_ADDR, &inet_addr(addr));
            m.attr(SVC_ATTR_PORT, &port.to_be_bytes());
        }
        ServiceKey::Fwmark { mark, .. } => {
            m.u32(SVC_ATTR_FWMARK, *mark);
        }
    }
}

fn service_nest(m: &mut Message, key: &ServiceKey, full: Option<&ServiceSpec>) {
    let n = m.begin_nested(CMD_ATTR_SERVICE);
    service_identity(m, key);
    if let Some(spec) = full {
        m.str(SVC_ATTR_SCHED_NAME, &spec.scheduler);
        let mut flags = [0u8; 8];
        flags[..4].copy_from_slice(&spec.flags.to_ne_bytes());
        flags[4..].copy_from_slice(&u32::MAX.to_ne_bytes());
        m.attr(SVC_ATTR_FLAGS, &flags);
        m.u32(SVC_ATTR_TIMEOUT, spec.timeout);
        let netmask = match key.family() {
            IpFamily::V4 => u32::MAX,
            IpFamily::V6 => 128,
        };
        m.u32(SVC_ATTR_NETMASK, netmask);
    }
    m.end_nested(n);
}

fn dest_nest(m: &mut Message, family: IpFamily, dest: &DestKey, full: Option<u32>) {
    let n = m.begin_nested(CMD_ATTR_DEST);
    m.u16(DEST_ATTR_ADDR_FAMILY, af(family));
    m.attr(DEST_ATTR_ADDR, &inet_addr(&dest.addr));
    m.attr(DEST_ATTR_PORT, &dest.port.to_be_bytes());
    if let Some(weight) = full {
        m.u32(DEST_ATTR_FWD_METHOD, FWD_MASQ);
        m.u32(DEST_ATTR_WEIGHT, weight);
        // Tunnel settings, unused by NAT forwarding; sent like ipvsadm 1.31 does.
        m.u8(DEST_ATTR_TUN_TYPE, 0);
        m.attr(DEST_ATTR_TUN_PORT, &0u16.to_be_bytes());
        m.u16(DEST_ATTR_TUN_FLAGS, 0);
        m.u32(DEST_ATTR_U_THRESH, 0);
        m.u32(DEST_ATTR_L_THRESH, 0);
    }
    m.end_nested(n);
}

/// The request for one operation, for family id `family_id`.
pub fn request(family_id: u16, op: &IpvsOp) -> Message {
    let mut m = Message::new(family_id, NLM_F_REQUEST | NLM_F_ACK);
    match op {
        IpvsOp::AddService(spec) | IpvsOp::UpdateService(spec) => {
            let cmd = if matches!(op, IpvsOp::AddService(_)) { CMD_NEW_SERVICE } else { CMD_SET_SERVICE };
            genl_header(&mut m, cmd);
            service_nest(&mut m, &spec.key, Some(spec));
        }
        IpvsOp::DeleteService(key) => {
            genl_header(&mut m, CMD_DEL_SERVICE);
            service_nest(&mut m, key, None);
        }
        IpvsOp::AddDest(key, dest) | IpvsOp::UpdateDest(key, dest) => {
            let cmd = if matches!(op, IpvsOp::AddDest(..)) { CMD_NEW_DEST } else { CMD_SET_DEST };
            genl_header(&mut m, cmd);
            service_nest(&mut m, key, None);
            dest_nest(&mut m, IpFamily::of(&dest.key.addr), &dest.key, Some(dest.weight));
        }
        IpvsOp::DeleteDest(key, dest) => {
            genl_header(&mut m, CMD_DEL_DEST);
            service_nest(&mut m, key, None);
            dest_nest(&mut m, IpFamily::of(&dest.addr), dest, None);
        }
        IpvsOp::SetTimeouts { tcp, tcp_fin, udp } => {
            genl_header(&mut m, CMD_SET_CONFIG);
            m.u32(CMD_ATTR_TIMEOUT_TCP, *tcp);
            m.u32(CMD_ATTR_TIMEOUT_TCP_FIN, *tcp_fin);
            m.u32(CMD_ATTR_TIMEOUT_UDP, *udp);
        }
    }
    m
}

/// The dump request for every virtual service.
pub fn dump_services_request(family_id: u16) -> Message {
    let mut m = Message::new(family_id, NLM_F_REQUEST | NLM_F_DUMP);
    genl_header(&mut m, CMD_GET_SERVICE);
    m
}

/// The dump request for the real servers of `key`.
pub fn dump_dests_request(family_id: u16, key: &ServiceKey) -> Message {
    let mut m = Message::new(family_id, NLM_F_REQUEST | NLM_F_DUMP);
    genl_header(&mut m, CMD_GET_DEST);
    service_nest(&mut m, key, None);
    m
}

/// A service from one dump message (generic netlink payload).
pub fn parse_service(payload: &[u8]) -> Option<ServiceSpec> {
    let nest = netlink::find(payload.get(4..)?, CMD_ATTR_SERVICE)?;
    let family = netlink::find(nest, SVC_ATTR_AF).and_then(netlink::get_u16)?;
    let key = match netlink::find(nest, SVC_ATTR_FWMARK).and_then(netlink::get_u32).filter(|m| *m != 0) {
        Some(mark) => ServiceKey::Fwmark { family: if family == AF_INET6 { IpFamily::V6 } else { IpFamily::V4 }, mark },
        None => ServiceKey::Addr {
            addr: parse_addr(family, netlink::find(nest, SVC_ATTR_ADDR)?)?,
            protocol: protocol_from(netlink::find(nest, SVC_ATTR_PROTOCOL).and_then(netlink::get_u16)?)?,
            port: u16::from_be_bytes(netlink::find(nest, SVC_ATTR_PORT)?.get(..2)?.try_into().ok()?),
        },
    };
    Some(ServiceSpec {
        key,
        scheduler: netlink::find(nest, SVC_ATTR_SCHED_NAME).and_then(netlink::get_str).unwrap_or_default(),
        flags: netlink::find(nest, SVC_ATTR_FLAGS).and_then(netlink::get_u32).unwrap_or(0) & !F_HASHED,
        timeout: netlink::find(nest, SVC_ATTR_TIMEOUT).and_then(netlink::get_u32).unwrap_or(0),
    })
}

/// A real server from one dump message; `family` is its service's (older kernels omit the
/// destination's own family).
pub fn parse_dest(payload: &[u8], family: IpFamily) -> Option<DestState> {
    let nest = netlink::find(payload.get(4..)?, CMD_ATTR_DEST)?;
    let af_ = netlink::find(nest, DEST_ATTR_ADDR_FAMILY).and_then(netlink::get_u16).unwrap_or(af(family));
    let u32_of = |ty| netlink::find(nest, ty).and_then(netlink::get_u32).unwrap_or(0);
    Some(DestState {
        spec: DestSpec {
            key: DestKey {
                addr: parse_addr(af_, netlink::find(nest, DEST_ATTR_ADDR)?)?,
                port: u16::from_be_bytes(netlink::find(nest, DEST_ATTR_PORT)?.get(..2)?.try_into().ok()?),
            },
            weight: u32_of(DEST_ATTR_WEIGHT),
        },
        active_conns: u32_of(DEST_ATTR_ACTIVE_CONNS),
        inactive_conns: u32_of(DEST_ATTR_INACT_CONNS),
    })
}

#[cfg(test)]
mod tests;
