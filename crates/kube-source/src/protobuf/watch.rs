//! A protobuf watch body: frames of a 4-byte big-endian length and a `meta.v1.WatchEvent`
//! (apimachinery's `LengthDelimitedFramer` and raw protobuf serializer), turned into the events
//! kube-rs's JSON watch gives.
//!
//! A frame whose event or object does not decode is reported and skipped: the next frame starts
//! where its length says, so the watch goes on (an object that does not decode is an event
//! whose object says why, as in JSON; an event that does not decode at all is an error item). A
//! frame longer than [`MAX_OBJECT_BYTES`] ends the watch with an error (client-go's bound:
//! nothing real is that large, so the stream is broken), and so does a body that ends inside a
//! frame; the watcher resumes from its last resource version either way.

use bytes::Bytes;
use futures::io::{AsyncRead, AsyncReadExt as _};
use futures::{Stream, StreamExt as _};
use kube::core::watch::{Bookmark, BookmarkMeta};
use kube::core::{TypeMeta, WatchEvent};
use prost::Message as _;

use super::messages::{bookmark_meta, status};
use super::{DecodeError, MAX_OBJECT_BYTES, unwrap};
use crate::raw::{ApiKind, Decoded};

#[derive(Clone, PartialEq, prost::Message)]
struct WatchEventPb {
    #[prost(string, tag = "1")]
    type_: String,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawExtension {
    #[prost(bytes = "bytes", tag = "1")]
    raw: Bytes,
}

/// What one frame is: an event, or why it is not (the watch goes on).
pub(crate) fn event<K: ApiKind>(frame: Bytes) -> Result<WatchEvent<Decoded<K>>, DecodeError> {
    let event = WatchEventPb::decode(frame)?;
    let raw = event.object.map(|object| object.raw).unwrap_or_default();
    let object = || match unwrap(raw.clone()) {
        Ok((_, raw)) => Decoded::from_protobuf(raw),
        Err(error) => Decoded::unreadable(format!("the event's object: {error}")),
    };
    Ok(match event.type_.as_str() {
        "ADDED" => WatchEvent::Added(object()),
        "MODIFIED" => WatchEvent::Modified(object()),
        "DELETED" => WatchEvent::Deleted(object()),
        "BOOKMARK" => {
            let (type_meta, raw) = unwrap(raw)?;
            let (resource_version, annotations) = bookmark_meta(raw)?;
            WatchEvent::Bookmark(Bookmark {
                types: TypeMeta { api_version: type_meta.api_version, kind: type_meta.kind },
                metadata: BookmarkMeta { resource_version, annotations },
            })
        }
        "ERROR" => WatchEvent::Error(Box::new(status(unwrap(raw)?.1)?)),
        other => return Err(DecodeError::Message(format!("unknown watch event type {other:?}"))),
    })
}

/// What the frame reader hands over next.
enum Next {
    Frame(Bytes),
    /// The body ended between frames, or inside one (a broken connection: resumable).
    End,
    /// The stream cannot be read further.
    Broken(std::io::Error),
}

async fn next_frame(body: &mut (impl AsyncRead + Unpin)) -> Next {
    let mut len = [0u8; 4];
    match body.read_exact(&mut len).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Next::End,
        Err(e) => return Next::Broken(e),
    }
    let len = u32::from_be_bytes(len);
    if len as usize > MAX_OBJECT_BYTES {
        let error = DecodeError::TooLarge { what: "a watch frame", len: len.into() };
        return Next::Broken(std::io::Error::new(std::io::ErrorKind::InvalidData, error));
    }
    // Grown as the bytes come: a length the bytes do not back costs nothing.
    let mut frame = Vec::with_capacity((len as usize).min(64 * 1024));
    match body.take(u64::from(len)).read_to_end(&mut frame).await {
        Ok(read) if read == len as usize => Next::Frame(Bytes::from(frame)),
        Ok(_) => Next::End,
        Err(e) => Next::Broken(e),
    }
}

/// The events of a protobuf watch body, as kube-rs's JSON watch has them.
pub(crate) fn events<K: ApiKind>(
    body: impl AsyncRead + Unpin + Send + 'static,
) -> impl Stream<Item = kube::Result<WatchEvent<Decoded<K>>>> + Send + 'static {
    futures::stream::unfold(Some(body), |body| async move {
        let mut body = body?;
        match next_frame(&mut body).await {
            Next::Frame(frame) => {
                let item = event::<K>(frame).map_err(|error| {
                    kube::Error::ReadEvents(std::io::Error::new(std::io::ErrorKind::InvalidData, error))
                });
                Some((item, Some(body)))
            }
            Next::End => None,
            Next::Broken(error) => Some((Err(kube::Error::ReadEvents(error)), None)),
        }
    })
    .boxed()
}
