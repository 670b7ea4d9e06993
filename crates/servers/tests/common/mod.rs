//! A deliberately small HTTP/1.1 client, so the tests see the exact status line, headers and
//! bytes the servers send, with nothing normalised in between.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    /// The only value of a header (case-insensitive name); panics when repeated.
    pub fn header(&self, name: &str) -> Option<&str> {
        let values: Vec<&str> =
            self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect();
        assert!(values.len() <= 1, "header {name} repeated: {values:?}");
        values.first().copied()
    }
}

/// `GET path` with extra request headers; the connection is closed after the answer.
pub async fn get_with(addr: SocketAddr, path: &str, extra_headers: &[(&str, &str)]) -> std::io::Result<HttpResponse> {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut stream = TcpStream::connect(addr).await?;
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (name, value) in extra_headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok(parse(&raw))
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "HTTP request timed out"))?
}

pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<HttpResponse> {
    get_with(addr, path, &[]).await
}

fn parse(raw: &[u8]) -> HttpResponse {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("no end of headers");
    let head = std::str::from_utf8(&raw[..split]).expect("headers not UTF-8");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("no status line");
    let mut parts = status_line.splitn(3, ' ');
    assert_eq!(parts.next(), Some("HTTP/1.1"), "status line {status_line:?}");
    let status = parts.next().expect("no status").parse().expect("bad status");
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').expect("bad header line");
            (n.trim().to_string(), v.trim().to_string())
        })
        .collect();
    let rest = &raw[split + 4..];
    let chunked =
        headers.iter().any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        let length: Option<usize> = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().expect("bad content-length"));
        match length {
            Some(len) => {
                assert_eq!(rest.len(), len, "body length differs from Content-Length");
                rest.to_vec()
            }
            None => rest.to_vec(),
        }
    };
    HttpResponse { status, headers, body: String::from_utf8(body).expect("body not UTF-8") }
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n").expect("bad chunk");
        let size = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).expect("chunk size").trim(), 16)
            .expect("chunk size");
        rest = &rest[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether nothing listens on `addr` any more.
pub async fn refused(addr: SocketAddr) -> bool {
    matches!(TcpStream::connect(addr).await, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused)
}
