//! A protobuf list body read as it arrives: the envelope, then the list message inside its `raw`
//! field one field at a time, each of `items` handed over as soon as its bytes are in.
//!
//! prost decodes whole buffers only, and a list is the size of the cluster (about 100 MB at
//! 100k Services), so the list's framing is read here: `metadata` (field 1, a `ListMeta`) and
//! `items` (field 2, repeated, each one object's message), in whatever order they come. An item
//! is at most [`MAX_OBJECT_BYTES`](super::MAX_OBJECT_BYTES): a larger one is skipped (read and
//! dropped, never held) and handed over as an error, like an item that does not decode, and
//! the list goes on.

use std::io::{self, Read};

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message as _;

use super::messages::ListMeta;
use super::{DecodeError, FieldReader, MAX_OBJECT_BYTES, WireType, invalid, open_envelope};

/// Reads one protobuf list from `reader`, handing each item's message (or why it could not be
/// had) to `item`, which answers false when the list is no longer wanted; the list's metadata.
pub(crate) fn read_list(
    reader: impl Read,
    mut item: impl FnMut(Result<Bytes, DecodeError>) -> bool,
) -> io::Result<meta::ListMeta> {
    let mut reader = FieldReader::new(reader);
    let (type_meta, raw_len) = open_envelope(&mut reader)?;
    if type_meta.kind == "Status" {
        return Err(invalid(DecodeError::Message("the body is a Status, not a list".into())));
    }
    let Some(raw_len) = raw_len else {
        return Err(invalid(DecodeError::Message(format!("the {} envelope holds no list", type_meta.kind))));
    };
    let end = reader.offset.saturating_add(raw_len);
    let mut list_meta = ListMeta::default();
    while reader.offset < end {
        let Some((field, wire_type)) = reader.key()? else {
            return Err(invalid(DecodeError::Message("the body ends inside the list".into())));
        };
        match (field, wire_type) {
            (1, WireType::Len) => {
                let len = reader.len()?;
                list_meta =
                    ListMeta::decode(reader.bytes(len, "the list's metadata")?).map_err(|e| invalid(e.into()))?;
            }
            (2, WireType::Len) => {
                let len = reader.len()?;
                let object = if len > MAX_OBJECT_BYTES as u64 {
                    reader.skip(len)?;
                    Err(DecodeError::TooLarge { what: "a list item", len })
                } else {
                    Ok(reader.bytes(len, "a list item")?)
                };
                if !item(object) {
                    return Err(io::Error::other("the list was dropped"));
                }
            }
            (_, wire_type) => reader.skip_value(wire_type)?,
        }
    }
    if reader.offset != end {
        return Err(invalid(DecodeError::Message("a field runs past the end of the list".into())));
    }
    // The envelope's other fields, after `raw` as Go writes them.
    while let Some((field, wire_type)) = reader.key()? {
        match (field, wire_type) {
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
    Ok(meta::ListMeta {
        resource_version: Some(list_meta.resource_version).filter(|rv| !rv.is_empty()),
        continue_: Some(list_meta.continue_).filter(|c| !c.is_empty()),
        remaining_item_count: list_meta.remaining_item_count,
        self_link: None,
    })
}
