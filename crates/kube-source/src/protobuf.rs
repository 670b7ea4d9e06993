//! Kubernetes' protobuf encoding, read straight into the objects the state takes.
//!
//! What kube-apiserver sends for `Accept: application/vnd.kubernetes.protobuf` (apimachinery's
//! `runtime/serializer/protobuf`):
//!
//! - a list or a single object: the 4-byte magic `k8s\0`, then a `runtime.Unknown` message
//!   (`typeMeta` = 1, `raw` = 2: the object's own message, `contentEncoding` = 3,
//!   `contentType` = 4); a list's `raw` is e.g. a `ServiceList` (`metadata` = 1, `items` = 2);
//! - a watch (`Content-Type: application/vnd.kubernetes.protobuf;stream=watch`): frames of a
//!   4-byte big-endian length and a `meta.v1.WatchEvent` (`type` = 1, `object` = 2, a
//!   `runtime.RawExtension` whose `raw` = 1 is an object as above, magic and all) with no magic
//!   of its own (the "raw" serializer and the length-delimited framer);
//! - errors: a `meta.v1.Status` the same way, as a response body or an ERROR event's object.
//!
//! Field numbers are those of k8s.io/api and k8s.io/apimachinery v0.36.2 `generated.proto`
//! (`messages.rs`); `tests/real_apiserver.rs` decodes every kind from kube-apiserver v1.36.2 in
//! both encodings and compares what the state makes of them.
//!
//! **What is hand-written and what is not.** Messages are decoded by [`prost`]'s derive from
//! structs that name only the fields kproxy reads, with their field numbers: prost skips every
//! other field (managed fields, conditions, a Node's images: most of an object's bytes) without
//! allocating, checks every length against the bytes there are, bounds nesting, and its errors
//! name the message and field at fault. Those structs are moved, not copied, into the
//! k8s-openapi types the state takes (`Object`): no generated type of the whole API (k8s-pb)
//! is built first — it would decode, allocate and then drop everything kproxy never reads, and
//! its code for the whole API costs minutes of build on two cores. Only the framing is
//! hand-written (`FieldReader`, `list.rs`, `watch.rs`): reading a list's items one at a time as
//! the body arrives (prost decodes whole buffers only; a 100k-Service list is ~100 MB), the
//! watch frames, and the identity of an object that does not decode. Those read varints and
//! lengths and nothing else, and bound every length by [`MAX_OBJECT_BYTES`].
//!
//! Conversions follow the JSON form of the same object, so the state cannot tell the encodings
//! apart: Go writes a plain `string`/`int32`/`bool` field even when empty or zero in protobuf, and
//! drops it (`omitempty`) in JSON, so empty values of those fields become `None`; pointer fields
//! keep their presence.
//!
//! Not in any protobuf: `spec.trafficHint` (KEP-4963) has no field number in a released API, so
//! over protobuf a Service opts in to acceleration by its annotation only (docs/acceleration.md).

#[cfg(feature = "fake")]
pub mod encode;
mod list;
mod messages;
mod watch;

use std::io::{self, Read};

use bytes::Bytes;
use kproxy_state::{Kind, Object};
use prost::Message as _;

use crate::raw::{ApiKind, Decoded, Malformed};

pub(crate) use list::read_list;
pub(crate) use messages::{decode_object, identity, status};
pub(crate) use watch::events;

/// Every protobuf-encoded object starts with these 4 bytes.
pub const MAGIC: [u8; 4] = *b"k8s\0";

/// The media type kube-apiserver answers `Accept: application/vnd.kubernetes.protobuf` with.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// No object, list item or watch frame may be larger: client-go's bound on a streamed object
/// (`streaming.NewDecoder`, 16 MiB). etcd keeps objects below 1.5 MiB by default, so only a broken
/// or hostile stream comes near it; it keeps a length of 4 GiB from being allocated.
pub const MAX_OBJECT_BYTES: usize = 16 << 20;

/// Why protobuf bytes could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not an object: the magic `k8s\0` is missing.
    #[error("not a protobuf object: it does not start with the magic k8s\\0 (starts {0:02x?})")]
    NoMagic(Vec<u8>),
    /// The bytes do not decode as the message they should be.
    #[error("{0}")]
    Message(String),
    /// A length beyond [`MAX_OBJECT_BYTES`].
    #[error("{what} of {len} bytes is larger than the {MAX_OBJECT_BYTES} bytes allowed")]
    TooLarge {
        /// What carried the length.
        what: &'static str,
        /// The length.
        len: u64,
    },
    /// An encoding of the object's bytes kproxy does not read (`runtime.Unknown.contentEncoding`).
    #[error("content encoding {0:?} is not supported")]
    ContentEncoding(String),
}

impl From<prost::DecodeError> for DecodeError {
    fn from(error: prost::DecodeError) -> Self {
        DecodeError::Message(error.to_string())
    }
}

/// `runtime.TypeMeta`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TypeMeta {
    #[prost(string, tag = "1")]
    pub(crate) api_version: String,
    #[prost(string, tag = "2")]
    pub(crate) kind: String,
}

/// `runtime.Unknown`: the envelope of every object.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Unknown {
    #[prost(message, optional, tag = "1")]
    pub(crate) type_meta: Option<TypeMeta>,
    #[prost(bytes = "bytes", tag = "2")]
    pub(crate) raw: Bytes,
    #[prost(string, tag = "3")]
    pub(crate) content_encoding: String,
    #[prost(string, tag = "4")]
    pub(crate) content_type: String,
}

/// The envelope of one object (magic, then `runtime.Unknown`): its kind and its own message.
pub(crate) fn unwrap(bytes: Bytes) -> Result<(TypeMeta, Bytes), DecodeError> {
    if bytes.len() < MAGIC.len() || bytes[..MAGIC.len()] != MAGIC {
        return Err(DecodeError::NoMagic(bytes.iter().take(MAGIC.len()).copied().collect()));
    }
    let unknown = Unknown::decode(bytes.slice(MAGIC.len()..))?;
    if !unknown.content_encoding.is_empty() {
        return Err(DecodeError::ContentEncoding(unknown.content_encoding));
    }
    Ok((unknown.type_meta.unwrap_or_default(), unknown.raw))
}

/// Protobuf's wire types, as the framing needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireType {
    Varint,
    Fixed64,
    Len,
    Fixed32,
}

/// A field's key: its number and wire type.
fn wire_type(key: u64) -> Result<WireType, DecodeError> {
    match key & 7 {
        0 => Ok(WireType::Varint),
        1 => Ok(WireType::Fixed64),
        2 => Ok(WireType::Len),
        5 => Ok(WireType::Fixed32),
        other => Err(DecodeError::Message(format!("wire type {other} is not one Kubernetes' messages use"))),
    }
}

/// Reads a message's fields one at a time from a byte source, counting what it consumed: the
/// framing of a list whose body is read as it arrives, and the identity of a bad object.
pub(crate) struct FieldReader<R> {
    source: R,
    /// Bytes consumed so far.
    pub(crate) offset: u64,
}

impl<R: Read> FieldReader<R> {
    pub(crate) fn new(source: R) -> Self {
        Self { source, offset: 0 }
    }

    /// The next byte; `None` at the end of the source.
    fn byte(&mut self) -> io::Result<Option<u8>> {
        let mut byte = [0u8; 1];
        loop {
            match self.source.read(&mut byte) {
                Ok(0) => return Ok(None),
                Ok(_) => {
                    self.offset += 1;
                    return Ok(Some(byte[0]));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// A varint; `None` at the end of the source, before its first byte.
    pub(crate) fn varint(&mut self) -> io::Result<Option<u64>> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let Some(byte) = self.byte()? else {
                if shift == 0 {
                    return Ok(None);
                }
                return Err(invalid(DecodeError::Message("the bytes end inside a varint".into())));
            };
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(Some(value));
            }
        }
        Err(invalid(DecodeError::Message("a varint longer than 10 bytes".into())))
    }

    /// The next field's number and wire type; `None` at the end of the source.
    pub(crate) fn key(&mut self) -> io::Result<Option<(u64, WireType)>> {
        let Some(key) = self.varint()? else { return Ok(None) };
        Ok(Some((key >> 3, wire_type(key).map_err(invalid)?)))
    }

    /// A length-delimited field's length.
    pub(crate) fn len(&mut self) -> io::Result<u64> {
        self.varint()?.ok_or_else(|| invalid(DecodeError::Message("the bytes end before a length".into())))
    }

    /// The next `len` bytes (at most [`MAX_OBJECT_BYTES`]: `what` names them in the error).
    pub(crate) fn bytes(&mut self, len: u64, what: &'static str) -> io::Result<Bytes> {
        if len > MAX_OBJECT_BYTES as u64 {
            return Err(invalid(DecodeError::TooLarge { what, len }));
        }
        // Grown as the bytes come, not sized by the length: a length the bytes do not back
        // costs nothing.
        let mut buf = Vec::with_capacity(len.min(64 * 1024) as usize);
        let read = (&mut self.source).take(len).read_to_end(&mut buf)?;
        self.offset += read as u64;
        if (read as u64) < len {
            return Err(invalid(DecodeError::Message(format!("the bytes end inside {what}"))));
        }
        Ok(Bytes::from(buf))
    }

    /// Skips `len` bytes without keeping them.
    pub(crate) fn skip(&mut self, len: u64) -> io::Result<()> {
        let copied = io::copy(&mut (&mut self.source).take(len), &mut io::sink())?;
        self.offset += copied;
        if copied < len {
            return Err(ended(io::ErrorKind::UnexpectedEof.into(), "a field"));
        }
        Ok(())
    }

    /// Skips the value of a field of `wire_type`.
    pub(crate) fn skip_value(&mut self, wire_type: WireType) -> io::Result<()> {
        match wire_type {
            WireType::Varint => {
                self.varint()?.map(drop).ok_or_else(|| ended(io::ErrorKind::UnexpectedEof.into(), "a varint"))
            }
            WireType::Fixed64 => self.skip(8),
            WireType::Fixed32 => self.skip(4),
            WireType::Len => {
                let len = self.len()?;
                self.skip(len)
            }
        }
    }
}

/// A decode error as an I/O error of the reader (what serde_json's reader and `read_exact` give too).
pub(crate) fn invalid(error: DecodeError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

fn ended(error: io::Error, what: &'static str) -> io::Error {
    if error.kind() == io::ErrorKind::UnexpectedEof {
        return invalid(DecodeError::Message(format!("the bytes end inside {what}")));
    }
    error
}

/// The `runtime.Unknown` envelope of a body read as it arrives: its `raw` field's length, after
/// the magic and whatever fields come before it. `Ok(None)`: no `raw` at all.
pub(crate) fn open_envelope<R: Read>(reader: &mut FieldReader<R>) -> io::Result<(TypeMeta, Option<u64>)> {
    let mut magic = [0u8; 4];
    reader.source.read_exact(&mut magic).map_err(|e| ended(e, "the magic k8s\\0"))?;
    reader.offset += 4;
    if magic != MAGIC {
        return Err(invalid(DecodeError::NoMagic(magic.to_vec())));
    }
    let mut type_meta = TypeMeta::default();
    while let Some((field, wire_type)) = reader.key()? {
        match (field, wire_type) {
            (1, WireType::Len) => {
                let len = reader.len()?;
                type_meta =
                    TypeMeta::decode(reader.bytes(len, "runtime.Unknown.typeMeta")?).map_err(|e| invalid(e.into()))?;
            }
            (2, WireType::Len) => return Ok((type_meta, Some(reader.len()?))),
            (3, WireType::Len) => {
                let len = reader.len()?;
                let encoding = reader.bytes(len, "runtime.Unknown.contentEncoding")?;
                if !encoding.is_empty() {
                    let encoding = String::from_utf8_lossy(&encoding).into_owned();
                    return Err(invalid(DecodeError::ContentEncoding(encoding)));
                }
            }
            (_, wire_type) => reader.skip_value(wire_type)?,
        }
    }
    Ok((type_meta, None))
}

#[cfg(test)]
mod tests;

/// What [`read_list_body`] read: each item, read or why not, and the list's resource version, or
/// why the list failed.
pub type ListBody = (Vec<Result<Object, Malformed>>, Result<Option<String>, String>);

/// A protobuf list body of `kind` read whole, as a list answer is read (for fuzzing and tests).
pub fn read_list_body(kind: Kind, body: &[u8]) -> ListBody {
    fn read<K: ApiKind>(body: &[u8]) -> ListBody {
        let mut items = Vec::new();
        let meta = read_list(body, |raw| {
            let decoded = match raw {
                Ok(raw) => Decoded::<K>::from_protobuf(raw),
                Err(error) => Decoded::unreadable(error.to_string()),
            };
            items.push(decoded.into_result());
            true
        });
        (items, meta.map(|m| m.resource_version).map_err(|e| e.to_string()))
    }
    match kind {
        Kind::Service => read::<k8s_openapi::api::core::v1::Service>(body),
        Kind::EndpointSlice => read::<k8s_openapi::api::discovery::v1::EndpointSlice>(body),
        Kind::Node => read::<k8s_openapi::api::core::v1::Node>(body),
        Kind::ServiceCidr => read::<k8s_openapi::api::networking::v1::ServiceCIDR>(body),
    }
}

/// A protobuf watch body of `kind` read whole, as a watch is read (for fuzzing and tests): each
/// item as `TYPE name` (`ERROR <code>`, `BOOKMARK <resourceVersion>[ initial-events-end]`), or
/// the error.
pub fn read_watch_body(kind: Kind, body: &[u8]) -> Vec<Result<String, String>> {
    fn read<K: ApiKind>(body: &[u8]) -> Vec<Result<String, String>> {
        use futures::StreamExt as _;
        let stream = events::<K>(futures::io::Cursor::new(body.to_vec()));
        let describe = |event: kube::core::WatchEvent<Decoded<K>>| {
            use kube::core::WatchEvent;
            let name = |object: Decoded<K>| match object.into_result() {
                Ok(object) => object.key().to_string(),
                Err(bad) => format!("malformed {}: {}", bad.key, bad.reason),
            };
            match event {
                WatchEvent::Added(o) => format!("ADDED {}", name(o)),
                WatchEvent::Modified(o) => format!("MODIFIED {}", name(o)),
                WatchEvent::Deleted(o) => format!("DELETED {}", name(o)),
                WatchEvent::Bookmark(b) => {
                    let end = b.metadata.annotations.contains_key(crate::watcher::INITIAL_EVENTS_END_ANNOTATION);
                    format!("BOOKMARK {}{}", b.metadata.resource_version, if end { " initial-events-end" } else { "" })
                }
                WatchEvent::Error(status) => format!("ERROR {}", status.code),
            }
        };
        futures::executor::block_on(stream.map(|item| item.map(describe).map_err(|e| e.to_string())).collect())
    }
    match kind {
        Kind::Service => read::<k8s_openapi::api::core::v1::Service>(body),
        Kind::EndpointSlice => read::<k8s_openapi::api::discovery::v1::EndpointSlice>(body),
        Kind::Node => read::<k8s_openapi::api::core::v1::Node>(body),
        Kind::ServiceCidr => read::<k8s_openapi::api::networking::v1::ServiceCIDR>(body),
    }
}
