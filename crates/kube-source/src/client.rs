//! Building the Kubernetes client from kube-proxy's `clientConnection` settings.
//!
//! Like kube-proxy, the configuration comes from `--kubeconfig` when given and from the in-cluster
//! service account otherwise; `KUBECONFIG` and `~/.kube/config` are deliberately not consulted
//! (kube-proxy does not either, and a node agent should not pick up an admin's personal config).
//! `--master` (overriding the server URL) is not supported here.

use std::path::Path;

use http::HeaderValue;
use http::header::USER_AGENT;
use kube::Client;
use kube::client::ClientBuilder;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

use crate::error::Error;
use crate::rate_limit::RateLimitLayer;

/// client-go's default when `qps` is 0.
pub const DEFAULT_QPS: f32 = 5.0;
/// client-go's default when `burst` is 0.
pub const DEFAULT_BURST: u32 = 10;

/// A client for the API server named by `kubeconfig` (its current context), or the in-cluster
/// configuration when `None`, limited to `qps`/`burst`. (`clientConnection.contentType` and
/// `acceptContentTypes` are the source's: [`ContentTypes`](crate::ContentTypes).)
pub async fn client(kubeconfig: Option<&Path>, qps: f32, burst: u32) -> Result<Client, Error> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig_error = |source| Error::Kubeconfig { path: path.to_owned(), source };
            let file = Kubeconfig::read_from(path).map_err(kubeconfig_error)?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default()).await.map_err(kubeconfig_error)?
        }
        None => Config::incluster().map_err(Error::InCluster)?,
    };
    client_from_config(config, qps, burst)
}

/// A client for `config`, with kube-proxy's `clientConnection` semantics:
///
/// `qps` 0 means [`DEFAULT_QPS`], negative means no limit (as in client-go); `burst` 0 means
/// [`DEFAULT_BURST`].
pub fn client_from_config(mut config: Config, qps: f32, burst: u32) -> Result<Client, Error> {
    let limit = rate_limit(qps, burst)?;
    // Built from the crate version and the target's names: always a valid header value.
    if let Ok(agent) = HeaderValue::from_str(&user_agent()) {
        config.headers.push((USER_AGENT, agent));
    }
    let builder = ClientBuilder::try_from(config).map_err(Error::Client)?;
    Ok(match limit {
        Some(layer) => builder.with_layer(&layer).build(),
        None => builder.build(),
    })
}

/// Who kproxy says it is to the API server, in client-go's form (`kube-proxy/v1.36.2 (linux/amd64)
/// kubernetes/…`), so that API server metrics and audit logs can tell kproxy's requests apart as
/// they do kube-proxy's.
pub fn user_agent() -> String {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    format!("kproxy/v{} ({}/{arch})", env!("CARGO_PKG_VERSION"), std::env::consts::OS)
}

fn rate_limit(qps: f32, burst: u32) -> Result<Option<RateLimitLayer>, Error> {
    if !qps.is_finite() {
        return Err(Error::InvalidQps(qps));
    }
    if qps < 0.0 {
        return Ok(None);
    }
    let qps = if qps == 0.0 { DEFAULT_QPS } else { qps };
    let burst = if burst == 0 { DEFAULT_BURST } else { burst };
    Ok(Some(RateLimitLayer::new(qps, burst)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qps_defaults_like_client_go() {
        assert!(rate_limit(-1.0, 0).unwrap().is_none());
        assert!(rate_limit(0.0, 0).unwrap().is_some());
        assert!(matches!(rate_limit(f32::NAN, 1), Err(Error::InvalidQps(_))));
    }

    #[tokio::test]
    async fn every_request_says_it_comes_from_kproxy() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the connection closed before the request's head ended");
                head.extend_from_slice(&buf[..n]);
            }
            let reply = "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            stream.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&head).to_lowercase()
        });
        let client = client_from_config(Config::new(url.parse().unwrap()), -1.0, 0).unwrap();
        let _ = client.apiserver_version().await;
        let head = server.await.unwrap();
        let expected = format!("user-agent: {}", user_agent()).to_lowercase();
        assert!(head.lines().any(|line| line == expected), "no `{expected}` in:\n{head}");
        assert!(user_agent().starts_with("kproxy/v"), "{}", user_agent());
    }

    #[tokio::test]
    async fn missing_kubeconfig_is_an_error_naming_the_file() {
        let Err(err) = client(Some(Path::new("/nonexistent/kproxy-kubeconfig")), 5.0, 10).await else {
            panic!("a missing kubeconfig must be an error");
        };
        assert!(err.to_string().contains("/nonexistent/kproxy-kubeconfig"), "{err}");
    }
}
