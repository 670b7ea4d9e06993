//! The encoding kproxy asks the API server for, and the answer read in the encoding it came in.
//!
//! As client-go's REST client (`rest.NewRequest` in k8s.io/client-go/rest/request.go), which
//! kube-proxy's informers use: every request, list or watch, carries `Accept:
//! <acceptContentTypes>` when `clientConnection.acceptContentTypes` is set, and `Accept:
//! <contentType>, */*` otherwise. kube-proxy's default `contentType` is
//! `application/vnd.kubernetes.protobuf`, so it asks for protobuf first and takes whatever the
//! server has otherwise (JSON for a kind the server will not encode as protobuf);
//! `application/json` asks for JSON. The answer is read by its `Content-Type`, as client-go's
//! negotiator does: `application/vnd.kubernetes.protobuf` (a watch's
//! `...;stream=watch`: length-delimited frames) or `application/json` (a watch: one event per
//! line). Error answers are `Status` objects in either encoding.
//!
//! `contentType` is also the encoding of request bodies; kproxy sends none (it only lists and
//! watches), so it matters only through the Accept header.

use std::fmt;

use futures::{AsyncBufRead, TryStreamExt as _};
use http::HeaderValue;
use http::header::{ACCEPT, ACCEPT_ENCODING, CONTENT_TYPE};
use http_body_util::{BodyExt as _, Limited};
use kube::Client;
use kube::core::Status;

use crate::error::Error;
use crate::protobuf;

const JSON: &str = "application/json";
const ANY: &str = "*/*";

/// An error answer's body is read up to this many bytes.
const MAX_ERROR_BODY: usize = 1 << 20;

/// What the source asks the API server for: the Accept header of its lists and watches.
#[derive(Clone, PartialEq, Eq)]
pub struct ContentTypes {
    accept: HeaderValue,
}

impl fmt::Debug for ContentTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ContentTypes").field(&self.accept()).finish()
    }
}

impl Default for ContentTypes {
    /// kube-proxy's default: protobuf first.
    fn default() -> Self {
        Self::protobuf()
    }
}

impl ContentTypes {
    /// `application/vnd.kubernetes.protobuf, */*`: kube-proxy's default.
    pub fn protobuf() -> Self {
        Self { accept: HeaderValue::from_static("application/vnd.kubernetes.protobuf, */*") }
    }

    /// `application/json, */*`.
    pub fn json() -> Self {
        Self { accept: HeaderValue::from_static("application/json, */*") }
    }

    /// From kube-proxy's `clientConnection.contentType` and `acceptContentTypes`, as client-go
    /// makes its Accept header (see the module documentation). Refuses a media type kproxy
    /// could not read the answer in (each must be JSON, protobuf or `*/*`).
    pub fn from_client_connection(content_type: &str, accept_content_types: &str) -> Result<Self, Error> {
        let content_type = match content_type.trim() {
            // client-go's REST client when none is set.
            "" => JSON,
            given => given,
        };
        check(content_type, false).map_err(|_| Error::UnsupportedContentType(content_type.to_owned()))?;
        let accept = match accept_content_types.trim() {
            "" => format!("{content_type}, {ANY}"),
            given => {
                check(given, true).map_err(|_| Error::UnsupportedAcceptContentTypes(given.to_owned()))?;
                given.to_owned()
            }
        };
        let accept = HeaderValue::try_from(accept)
            .map_err(|_| Error::UnsupportedAcceptContentTypes(accept_content_types.to_owned()))?;
        Ok(Self { accept })
    }

    /// The Accept header.
    pub fn accept(&self) -> &str {
        self.accept.to_str().unwrap_or_default()
    }
}

/// Checks a comma-separated list of media types: each JSON or protobuf (or, where `any_ok`, `*/*`).
fn check(types: &str, any_ok: bool) -> Result<(), ()> {
    let mut seen = false;
    for part in types.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        seen = true;
        match media_type(part) {
            JSON | protobuf::MEDIA_TYPE => {}
            ANY if any_ok => {}
            _ => return Err(()),
        }
    }
    if seen { Ok(()) } else { Err(()) }
}

/// A media type without its parameters, as written.
fn media_type(value: &str) -> &str {
    value.split(';').next().unwrap_or_default().trim()
}

/// The encoding an answer came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Json,
    Protobuf,
}

/// A successful answer's encoding and body.
pub(crate) type Answer = (Encoding, Box<dyn AsyncBufRead + Send + Unpin>);

/// Sends `request` (a list or a watch) through `client` asking for `accept`; the answer's
/// encoding and body, or the API server's `Status` as the error when it did not succeed.
pub(crate) async fn send(
    client: &Client,
    request: http::Request<Vec<u8>>,
    accept: &ContentTypes,
) -> kube::Result<Answer> {
    let (mut parts, body) = request.into_parts();
    parts.headers.insert(ACCEPT, accept.accept.clone());
    // Lists and watches are read as they arrive; kproxy's client does not decompress.
    parts.headers.insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    let response = client.send(http::Request::from_parts(parts, kube::client::Body::from(body))).await?;
    let status = response.status();
    let encoding = encoding(response.headers().get(CONTENT_TYPE));
    if status.is_client_error() || status.is_server_error() {
        let body = Limited::new(response.into_body(), MAX_ERROR_BODY).collect().await.map(|b| b.to_bytes());
        let body = body.unwrap_or_default();
        return Err(kube::Error::Api(Box::new(error_status(status.as_u16(), encoding, body))));
    }
    let encoding = encoding.map_err(|unknown| {
        kube::Error::Service(format!("the API server answered in {unknown:?}, which kproxy does not read").into())
    })?;
    let body = response.into_body().into_data_stream().map_err(std::io::Error::other).into_async_read();
    Ok((encoding, Box::new(body)))
}

/// The encoding a `Content-Type` names (none: JSON, as kube-rs assumes); the type when unknown.
fn encoding(content_type: Option<&HeaderValue>) -> Result<Encoding, String> {
    let Some(value) = content_type else { return Ok(Encoding::Json) };
    let text = value.to_str().unwrap_or_default();
    match media_type(text) {
        JSON | "" => Ok(Encoding::Json),
        protobuf::MEDIA_TYPE => Ok(Encoding::Protobuf),
        _ => Err(text.to_owned()),
    }
}

/// The `Status` of an error answer (or, for a body that is none, a `Status` saying what came).
fn error_status(code: u16, encoding: Result<Encoding, String>, body: bytes::Bytes) -> Status {
    let decoded = match encoding {
        Ok(Encoding::Protobuf) => protobuf::unwrap(body.clone()).ok().and_then(|(_, raw)| protobuf::status(raw).ok()),
        _ => serde_json::from_slice::<Status>(&body).ok(),
    };
    match decoded {
        Some(status) if status.code != 0 => status,
        Some(status) => Status { code, ..status },
        None => {
            let text = String::from_utf8_lossy(&body);
            Status::failure(text.trim(), "Failed to parse error data").with_code(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_is_made_as_client_go_makes_it() {
        let accept = |content_type, accept| {
            ContentTypes::from_client_connection(content_type, accept).map(|c| c.accept().to_owned())
        };
        assert_eq!(
            accept("application/vnd.kubernetes.protobuf", "").unwrap(),
            "application/vnd.kubernetes.protobuf, */*"
        );
        assert_eq!(accept("application/json", "").unwrap(), "application/json, */*");
        assert_eq!(accept("", "").unwrap(), "application/json, */*", "client-go's REST client default");
        assert_eq!(accept("application/vnd.kubernetes.protobuf", "application/json").unwrap(), "application/json");
        assert_eq!(
            accept("application/json", "application/vnd.kubernetes.protobuf,application/json").unwrap(),
            "application/vnd.kubernetes.protobuf,application/json"
        );
        assert!(
            matches!(accept("application/yaml", ""), Err(Error::UnsupportedContentType(t)) if t == "application/yaml")
        );
        assert!(matches!(accept("application/json", "application/cbor"), Err(Error::UnsupportedAcceptContentTypes(_))));
        assert_eq!(ContentTypes::default(), ContentTypes::protobuf(), "kube-proxy's default");
    }

    #[test]
    fn answers_are_read_by_their_content_type() {
        let of = |v: &'static str| encoding(Some(&HeaderValue::from_static(v)));
        assert_eq!(of("application/json"), Ok(Encoding::Json));
        assert_eq!(of("application/vnd.kubernetes.protobuf"), Ok(Encoding::Protobuf));
        assert_eq!(of("application/vnd.kubernetes.protobuf;stream=watch"), Ok(Encoding::Protobuf));
        assert_eq!(encoding(None), Ok(Encoding::Json));
        assert_eq!(of("application/yaml"), Err("application/yaml".to_owned()));
    }

    #[test]
    fn error_answers_are_statuses_in_either_encoding() {
        let json =
            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"gone","reason":"Expired","code":410}"#;
        let status = error_status(410, Ok(Encoding::Json), bytes::Bytes::from_static(json));
        assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
        let text = error_status(502, Err("text/html".into()), bytes::Bytes::from_static(b"<html>bad gateway</html>"));
        assert_eq!(text.code, 502);
        assert!(text.message.contains("bad gateway"));
    }
}
