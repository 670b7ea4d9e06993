//! One small HTTP/1.1 server loop shared by all of kproxy's listeners, with the same limits on
//! every one of them: at most [`MAX_CONNECTIONS`] connections at once (a further client waits in
//! the listen backlog), request heads of at most [`MAX_HEAD_BYTES`], read within
//! [`HEADER_READ_TIMEOUT`] (also the longest a kept-alive connection may idle), and no request
//! bodies (every route is a GET: a request announcing a body is refused with 413 and the
//! connection closed). Each request carries the connection's [`ConnInfo`], for routes that
//! answer only the node itself (`/debug/explain`).
//!
//! We run the accept loop ourselves (rather than `axum::serve`) for one reason: closing must be
//! synchronous. When a health-check node port is closed and the same port is reopened in the same
//! sync (a Service deleted and another created with its port), the old socket must already be
//! gone, and in-flight keep-alive connections must not keep answering for a closed Service. So
//! [`RunningServer::shutdown`] returns only once the listener is dropped and every connection
//! task has been aborted.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::error::ServeError;

/// A slow client may take this long to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once per listener. Probes and scrapes open one or a few; this bounds
/// what a flood of idle connections can hold (each is a task and its buffers).
pub const MAX_CONNECTIONS: usize = 128;

/// The largest request head (request line and headers) read; hyper's smallest allowed buffer.
pub const MAX_HEAD_BYTES: usize = 8192;

/// The two ends of the connection a request came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    /// The client's address.
    pub peer: SocketAddr,
    /// The address the client connected to.
    pub local: SocketAddr,
}

impl ConnInfo {
    /// Whether the client is the node itself: a loopback peer, or a peer whose address is the
    /// one it connected to (a process on the node using the node's address). A pod or another
    /// host has an address of its own.
    pub fn from_this_node(&self) -> bool {
        let (peer, local) = (canonical_ip(self.peer.ip()), canonical_ip(self.local.ip()));
        peer.is_loopback() || peer == local
    }
}

/// IPv4 addresses seen on a dual-stack socket (`::ffff:a.b.c.d`) as IPv4.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Opens a listening TCP socket with the options Go's `net.Listen` uses (SO_REUSEADDR, so a port
/// can be reopened at once). The unspecified IPv6 address listens dual-stack, as Go does for
/// wildcard addresses.
pub(crate) fn listen(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let bind_error = |source| ServeError::Bind { addr, source };
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(bind_error)?;
    socket.set_reuse_address(true).map_err(bind_error)?;
    if addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED) {
        socket.set_only_v6(false).map_err(bind_error)?;
    }
    socket.set_nonblocking(true).map_err(bind_error)?;
    socket.bind(&addr.into()).map_err(bind_error)?;
    socket.listen(1024).map_err(bind_error)?;
    TcpListener::from_std(socket.into()).map_err(bind_error)
}

/// A server running in the background. Dropping it stops it (without waiting).
#[derive(Debug)]
pub struct RunningServer {
    local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl RunningServer {
    /// The address actually bound (useful when asking for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether the server stopped on its own (only after an accept error).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stops accepting, closes the listener and every open connection, and waits for all that.
    pub async fn shutdown(mut self) -> Result<(), ServeError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.map_err(|e| ServeError::Task { addr: self.local_addr, reason: e.to_string() })?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves `router` on `listener` in a background task.
pub(crate) fn spawn(listener: TcpListener, router: Router) -> Result<RunningServer, ServeError> {
    let local_addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: unspecified(), source })?;
    let (stop, stopped) = oneshot::channel();
    let router = router.layer(axum::middleware::from_fn(refuse_bodies));
    let task = tokio::spawn(accept_loop(listener, local_addr, router, stopped));
    Ok(RunningServer { local_addr, stop: Some(stop), task: Some(task) })
}

fn unspecified() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 0))
}

async fn accept_loop(
    listener: TcpListener,
    local_addr: SocketAddr,
    router: Router,
    mut stopped: oneshot::Receiver<()>,
) -> Result<(), ServeError> {
    let mut connections = JoinSet::new();
    let result = loop {
        tokio::select! {
            _ = &mut stopped => break Ok(()),
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept(), if connections.len() < MAX_CONNECTIONS => match accepted {
                Ok((stream, peer)) => {
                    let conn = ConnInfo { peer, local: stream.local_addr().unwrap_or(local_addr) };
                    let service = TowerToHyperService::new(
                        tower::ServiceBuilder::new()
                            .map_request(move |mut request: hyper::Request<hyper::body::Incoming>| {
                                request.extensions_mut().insert(conn);
                                request
                            })
                            .service(router.clone()),
                    );
                    connections.spawn(async move {
                        let served = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HEADER_READ_TIMEOUT)
                            .max_buf_size(MAX_HEAD_BYTES)
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                        if let Err(error) = served {
                            tracing::debug!(%error, "HTTP connection ended with an error");
                        }
                    });
                }
                Err(error) if transient(&error) => {
                    tracing::warn!(%error, address = %local_addr, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(source) => break Err(ServeError::Accept { addr: local_addr, source }),
            },
        }
    };
    drop(listener);
    connections.shutdown().await;
    result
}

/// Every route is a GET: a request that announces a body is answered 413 and its connection
/// closed, so no body is ever read or buffered.
async fn refuse_bodies(request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    use axum::http::{HeaderValue, StatusCode, header};
    use axum::response::IntoResponse;
    let length = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).map(str::trim);
    let has_body = request.headers().contains_key(header::TRANSFER_ENCODING) || length.is_some_and(|l| l != "0");
    if has_body {
        let mut response = (StatusCode::PAYLOAD_TOO_LARGE, "request bodies are not accepted\n").into_response();
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        return response;
    }
    next.run(request).await
}

/// Accept errors that concern one connection or a momentary shortage, not the listener.
fn transient(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(error.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut)
        || matches!(error.raw_os_error(), Some(23 | 24 | 105 | 12)) // ENFILE, EMFILE, ENOBUFS, ENOMEM
}
