//! A ctnetlink client: dump the connection tracking table and delete single entries.
//!
//! Built on `netlink-sys` (the socket) and `netlink-packet-netfilter` (the message types), both
//! from the rust-netlink project. Version 0.4 of the latter encodes and decodes ctnetlink
//! messages with their original and reply tuples, which is all the reconciler needs; the three
//! attributes it does not model are added here as raw attributes:
//!
//! - `CTA_ID` on deletes, so a delete only removes the entry that was dumped and never a newer
//!   entry that reuses the same tuple;
//! - `CTA_ZONE` on deletes of entries outside zone 0, because the kernel looks tuples up per zone;
//! - `CTA_FILTER` on dumps (kernel 5.9 and later), so the kernel only returns entries of the
//!   protocol asked for. A busy node holds mostly TCP entries that the reconciler would decode
//!   and throw away. Older kernels ignore the filter; entries are checked again after decoding.
//!
//! The socket lives in the network namespace of the thread that opens it, so a reconciler opened
//! inside a namespace (a test's "node") only ever sees and changes that namespace's table.
//! Every call blocks; run it on a thread that may block.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;

use kproxy_state::{IpFamily, Protocol};
use netlink_packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol as NlProtocol, Tuple as NlTuple,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};
use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};
use tracing::debug;

use crate::error::Error;
use crate::flow::{Flow, Tuple, protocol_from_number, protocol_number};

/// `CTA_ID`: the kernel's id of an entry (big-endian u32).
const CTA_ID: u16 = 12;
/// `CTA_ZONE`: the conntrack zone (big-endian u16).
const CTA_ZONE: u16 = 18;
/// `CTA_FILTER`: a nested attribute that tells which tuple fields a dump filters on.
const CTA_FILTER: u16 = 25;
/// `CTA_FILTER_ORIG_FLAGS` inside `CTA_FILTER` (host-endian u32).
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
/// `CTA_FILTER_FLAG(CTA_PROTO_NUM)`: filter on the layer-4 protocol of the original tuple.
const CTA_FILTER_F_CTA_PROTO_NUM: u32 = 1 << 3;
/// Set on attribute types that hold nested attributes.
const NLA_F_NESTED: u16 = 0x8000;
/// `ENOENT`: the entry to delete is already gone.
const ENOENT: i32 = 2;
/// Deletes sent in one `sendmsg`. Each is acknowledged; this keeps the acknowledgements well
/// inside the socket's receive buffer.
const DELETE_BATCH: usize = 64;
/// Large enough for the biggest message batch the kernel sends in one datagram (32 KiB).
const RECEIVE_BUFFER: usize = 64 * 1024;

/// What one dump returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dump {
    /// The entries of the requested family and protocol.
    pub flows: Vec<Flow>,
    /// The table changed while it was dumped (`NLM_F_DUMP_INTR`): some entries may be missing.
    pub interrupted: bool,
    /// Entries that could not be decoded and were skipped.
    pub undecodable: usize,
    /// Entries of other families or protocols the kernel sent anyway (kernels before 5.9
    /// ignore the dump filter); they are dropped.
    pub ignored_by_kernel_filter: usize,
}

/// What a batch of deletes did.
#[derive(Debug, Default)]
pub struct DeleteOutcome {
    /// Entries the kernel removed.
    pub deleted: usize,
    /// Entries that were already gone (expired, or replaced by a newer entry with another id).
    pub not_found: usize,
    /// Entries the kernel refused to delete, with its error.
    pub failed: Vec<(Flow, io::Error)>,
}

/// One decoded message of a ctnetlink reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// A conntrack entry of a port-based protocol.
    Flow {
        /// The request's sequence number.
        seq: u32,
        /// The entry.
        flow: Flow,
        /// The dump was interrupted by a table change.
        interrupted: bool,
    },
    /// An entry this crate does not model (another protocol, or no ports).
    Skipped {
        /// The request's sequence number.
        seq: u32,
    },
    /// An entry that could not be decoded.
    Undecodable {
        /// The request's sequence number.
        seq: u32,
        /// Why.
        reason: String,
    },
    /// The end of a dump.
    Done {
        /// The request's sequence number.
        seq: u32,
    },
    /// An acknowledgement (`errno` 0) or an error.
    Ack {
        /// The request's sequence number.
        seq: u32,
        /// 0 for success, else the positive errno.
        errno: i32,
    },
}

/// A netfilter netlink socket bound in the calling thread's network namespace.
#[derive(Debug)]
pub struct ConntrackSocket {
    socket: Socket,
    seq: u32,
    buffer: Vec<u8>,
}

impl ConntrackSocket {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Self, Error> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(Error::Socket)?;
        socket.bind_auto().map_err(Error::Socket)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(Error::Socket)?;
        Ok(Self { socket, seq: 1, buffer: Vec::with_capacity(RECEIVE_BUFFER) })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// Dumps the entries of one family and protocol.
    pub fn dump(&mut self, family: IpFamily, protocol: Protocol) -> Result<Dump, Error> {
        const REQUEST: &str = "dump";
        let seq = self.next_seq();
        let request = encode_dump_request(family, protocol, seq);
        self.socket.send(&request, 0).map_err(|source| Error::Send { request: REQUEST, source })?;
        let mut dump = Dump::default();
        loop {
            self.receive(REQUEST)?;
            for reply in decode_replies(&self.buffer)? {
                match reply {
                    Reply::Flow { seq: s, flow, interrupted } if s == seq => {
                        dump.interrupted |= interrupted;
                        // Kernels without CTA_FILTER return every protocol of the family.
                        if flow.protocol == protocol && flow.family() == family {
                            dump.flows.push(flow);
                        } else {
                            dump.ignored_by_kernel_filter += 1;
                        }
                    }
                    Reply::Skipped { seq: s } if s == seq => dump.ignored_by_kernel_filter += 1,
                    Reply::Undecodable { seq: s, reason } if s == seq => {
                        debug!(%reason, "skipping an undecodable conntrack entry");
                        dump.undecodable += 1;
                    }
                    Reply::Done { seq: s } if s == seq => return Ok(dump),
                    Reply::Ack { seq: s, errno } if s == seq && errno != 0 => {
                        return Err(Error::Kernel { request: REQUEST, source: io::Error::from_raw_os_error(errno) });
                    }
                    other => debug!(?other, "ignoring a netlink message of another request"),
                }
            }
        }
    }

    /// Deletes entries by their original tuple, zone and id.
    pub fn delete(&mut self, flows: &[Flow]) -> Result<DeleteOutcome, Error> {
        const REQUEST: &str = "delete";
        let mut outcome = DeleteOutcome::default();
        for batch in flows.chunks(DELETE_BATCH) {
            let mut pending: BTreeMap<u32, &Flow> = BTreeMap::new();
            let mut request = Vec::new();
            for flow in batch {
                let seq = self.next_seq();
                request.extend_from_slice(&encode_delete_request(flow, seq));
                pending.insert(seq, flow);
            }
            self.socket.send(&request, 0).map_err(|source| Error::Send { request: REQUEST, source })?;
            while !pending.is_empty() {
                self.receive(REQUEST)?;
                for reply in decode_replies(&self.buffer)? {
                    let Reply::Ack { seq, errno } = reply else { continue };
                    let Some(flow) = pending.remove(&seq) else { continue };
                    match errno {
                        0 => outcome.deleted += 1,
                        ENOENT => outcome.not_found += 1,
                        errno => outcome.failed.push((*flow, io::Error::from_raw_os_error(errno))),
                    }
                }
            }
        }
        Ok(outcome)
    }

    fn receive(&mut self, request: &'static str) -> Result<(), Error> {
        self.buffer.clear();
        self.socket.recv(&mut self.buffer, 0).map_err(|source| Error::Receive { request, source })?;
        Ok(())
    }
}

fn netfilter_family(family: IpFamily) -> NetfilterProtoFamily {
    match family {
        IpFamily::V4 => NetfilterProtoFamily::IPv4,
        IpFamily::V6 => NetfilterProtoFamily::IPv6,
    }
}

fn serialize(flags: u16, seq: u32, family: IpFamily, message: ConntrackMessage) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let payload = NetfilterMessage::new(NetfilterHeader::new(netfilter_family(family), 0, 0), message);
    let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(payload));
    packet.finalize();
    let mut buffer = vec![0; packet.buffer_len()];
    packet.serialize(&mut buffer);
    buffer
}

/// `IPCTNL_MSG_CT_GET` with `NLM_F_DUMP` for one family, filtered in the kernel to one protocol.
pub fn encode_dump_request(family: IpFamily, protocol: Protocol, seq: u32) -> Vec<u8> {
    let tuple = ConntrackAttribute::CtaTupleOrig(vec![NlTuple::Proto(vec![ProtoTuple::Protocol(NlProtocol::from(
        protocol_number(protocol),
    ))])]);
    let mut request = serialize(NLM_F_REQUEST | NLM_F_DUMP, seq, family, ConntrackMessage::Get(vec![tuple]));
    // `DefaultNla` cannot carry the nested flag, so CTA_FILTER is appended by hand.
    let mut flags = Vec::new();
    push_attribute(&mut flags, CTA_FILTER_ORIG_FLAGS, &CTA_FILTER_F_CTA_PROTO_NUM.to_ne_bytes());
    push_attribute(&mut request, CTA_FILTER | NLA_F_NESTED, &flags);
    let length = request.len() as u32;
    request[..4].copy_from_slice(&length.to_ne_bytes());
    request
}

/// `IPCTNL_MSG_CT_DELETE` of one entry: its original tuple, its zone when not 0, and its id.
pub fn encode_delete_request(flow: &Flow, seq: u32) -> Vec<u8> {
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(vec![
        NlTuple::Ip(vec![IPTuple::SourceAddress(flow.original.src), IPTuple::DestinationAddress(flow.original.dst)]),
        NlTuple::Proto(vec![
            ProtoTuple::Protocol(NlProtocol::from(protocol_number(flow.protocol))),
            ProtoTuple::SourcePort(flow.original.src_port),
            ProtoTuple::DestinationPort(flow.original.dst_port),
        ]),
    ])];
    if flow.zone != 0 {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, flow.zone.to_be_bytes().to_vec())));
    }
    if let Some(id) = flow.id {
        attributes.push(ConntrackAttribute::Other(DefaultNla::new(CTA_ID, id.to_be_bytes().to_vec())));
    }
    serialize(NLM_F_REQUEST | NLM_F_ACK, seq, flow.family(), ConntrackMessage::Delete(attributes))
}

/// Appends one netlink attribute (header, value, padding to 4 bytes).
fn push_attribute(buffer: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let length = 4 + value.len();
    // Attribute values here are a few bytes; the length always fits.
    buffer.extend_from_slice(&(length as u16).to_ne_bytes());
    buffer.extend_from_slice(&kind.to_ne_bytes());
    buffer.extend_from_slice(value);
    buffer.resize(buffer.len() + (4 - length % 4) % 4, 0);
}

/// Decodes every netlink message in one received datagram.
pub fn decode_replies(mut buffer: &[u8]) -> Result<Vec<Reply>, Error> {
    let mut replies = Vec::new();
    while buffer.len() >= 16 {
        let length = u32::from_ne_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]) as usize;
        if length < 16 || length > buffer.len() {
            return Err(Error::Decode(format!("netlink message length {length} with {} bytes left", buffer.len())));
        }
        let seq = u32::from_ne_bytes([buffer[8], buffer[9], buffer[10], buffer[11]]);
        replies.push(decode_one(&buffer[..length], seq));
        let aligned = (length + 3) & !3;
        buffer = &buffer[aligned.min(buffer.len())..];
    }
    Ok(replies)
}

fn decode_one(bytes: &[u8], seq: u32) -> Reply {
    let message = match NetlinkMessage::<NetfilterMessage>::deserialize(bytes) {
        Ok(message) => message,
        Err(error) => return Reply::Undecodable { seq, reason: error.to_string() },
    };
    let interrupted = message.header.flags & NLM_F_DUMP_INTR != 0;
    match message.payload {
        NetlinkPayload::Done(_) => Reply::Done { seq },
        // An errno is negative; `i32::MIN` has no positive counterpart (the kernel never sends
        // it, but a reply must never panic the decoder): it saturates.
        NetlinkPayload::Error(error) => {
            Reply::Ack { seq, errno: error.code.map_or(0, |code| code.get().saturating_abs()) }
        }
        NetlinkPayload::InnerMessage(NetfilterMessage {
            inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
            ..
        }) => match flow_of(&attributes) {
            Ok(Some(flow)) => Reply::Flow { seq, flow, interrupted },
            Ok(None) => Reply::Skipped { seq },
            Err(reason) => Reply::Undecodable { seq, reason },
        },
        _ => Reply::Skipped { seq },
    }
}

/// The flow of a decoded entry; `None` for protocols without ports that a service can use.
fn flow_of(attributes: &[ConntrackAttribute]) -> Result<Option<Flow>, String> {
    let mut original = None;
    let mut reply = None;
    let mut zone = 0;
    let mut id = None;
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuple) => original = Some(tuple_of(tuple)?),
            ConntrackAttribute::CtaTupleReply(tuple) => reply = Some(tuple_of(tuple)?),
            ConntrackAttribute::Other(nla) => {
                let mut value = vec![0; netlink_packet_core::Nla::value_len(nla)];
                netlink_packet_core::Nla::emit_value(nla, &mut value);
                match netlink_packet_core::Nla::kind(nla) & !NLA_F_NESTED {
                    CTA_ZONE => {
                        let bytes: [u8; 2] = value.as_slice().try_into().map_err(|_| "CTA_ZONE is not 2 bytes")?;
                        zone = u16::from_be_bytes(bytes);
                    }
                    CTA_ID => {
                        let bytes: [u8; 4] = value.as_slice().try_into().map_err(|_| "CTA_ID is not 4 bytes")?;
                        id = Some(u32::from_be_bytes(bytes));
                    }
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let (Some(original), Some(reply)) = (original, reply) else {
        return Err("entry without both tuples".to_string());
    };
    let (Some((protocol, original)), Some((reply_protocol, reply))) = (original, reply) else {
        return Ok(None);
    };
    if protocol != reply_protocol {
        return Err(format!("original protocol {protocol} differs from reply protocol {reply_protocol}"));
    }
    let Some(protocol) = protocol_from_number(protocol) else { return Ok(None) };
    Ok(Some(Flow { protocol, original, reply, zone, id }))
}

/// A tuple with its protocol number; `None` when it has no ports (ICMP, GRE, ...).
fn tuple_of(tuple: &[NlTuple]) -> Result<Option<(u8, Tuple)>, String> {
    let mut src: Option<IpAddr> = None;
    let mut dst: Option<IpAddr> = None;
    let mut protocol = None;
    let mut src_port = None;
    let mut dst_port = None;
    for part in tuple {
        match part {
            NlTuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(address) => src = Some(*address),
                        IPTuple::DestinationAddress(address) => dst = Some(*address),
                        _ => {}
                    }
                }
            }
            NlTuple::Proto(protos) => {
                for proto in protos {
                    match proto {
                        ProtoTuple::Protocol(number) => protocol = Some(u8::from(*number)),
                        ProtoTuple::SourcePort(port) => src_port = Some(*port),
                        ProtoTuple::DestinationPort(port) => dst_port = Some(*port),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    let (Some(src), Some(dst), Some(protocol)) = (src, dst, protocol) else {
        return Err("tuple without addresses or protocol".to_string());
    };
    let (Some(src_port), Some(dst_port)) = (src_port, dst_port) else { return Ok(None) };
    Ok(Some((protocol, Tuple { src, dst, src_port, dst_port })))
}

#[cfg(test)]
mod tests;
