//! Building the Kubernetes client from kube-proxy's `clientConnection` settings.
//!
//! Like kube-proxy, the configuration comes from `--kubeconfig` when given and from the in-cluster
//! service account otherwise; `KUBECONFIG` and `~/.kube/config` are deliberately not consulted
//! (kube-proxy does not either, and a node agent should not pick up an admin's personal config).
//! `--master` (overriding the server URL) is not supported here.

use std::path::Path;

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
pub fn client_from_config(config: Config, qps: f32, burst: u32) -> Result<Client, Error> {
    let limit = rate_limit(qps, burst)?;
    let builder = ClientBuilder::try_from(config).map_err(Error::Client)?;
    Ok(match limit {
        Some(layer) => builder.with_layer(&layer).build(),
        None => builder.build(),
    })
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
    async fn missing_kubeconfig_is_an_error_naming_the_file() {
        let Err(err) = client(Some(Path::new("/nonexistent/kproxy-kubeconfig")), 5.0, 10).await else {
            panic!("a missing kubeconfig must be an error");
        };
        assert!(err.to_string().contains("/nonexistent/kproxy-kubeconfig"), "{err}");
    }
}
