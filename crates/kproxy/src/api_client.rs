//! The Kubernetes API client from kube-proxy's `clientConnection` and `--master`, which
//! overrides the kubeconfig's server (with no kubeconfig: that server, without credentials, as
//! client-go's `BuildConfigFromFlags`).

use anyhow::Context;
use kproxy_config::ClientConnection;

/// A client for the API server `cc` (and `--master`) name.
pub async fn client(cc: &ClientConnection) -> anyhow::Result<kube::Client> {
    let Some(master) = cc.master.as_deref() else {
        return Ok(kproxy_kube_source::client(cc.kubeconfig.as_deref(), cc.qps, cc.burst).await?);
    };
    let url = master.parse().with_context(|| format!("--master {master:?} is not a URL"))?;
    let config = match cc.kubeconfig.as_deref() {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            let mut config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading the kubeconfig {}", path.display()))?;
            config.cluster_url = url;
            config
        }
        None => kube::Config::new(url),
    };
    tracing::info!(master, "API server from --master");
    Ok(kproxy_kube_source::client_from_config(config, cc.qps, cc.burst)?)
}

/// The API source's options for the node `node_name`: upstream's defaults, with what
/// `clientConnection.contentType` and `acceptContentTypes` ask for.
pub fn source_options(
    cc: &ClientConnection,
    node_name: String,
) -> anyhow::Result<kproxy_kube_source::KubeSourceOptions> {
    let mut options = kproxy_kube_source::KubeSourceOptions::new(node_name);
    options.content_types =
        kproxy_kube_source::ContentTypes::from_client_connection(&cc.content_type, &cc.accept_content_types)?;
    tracing::info!(accept = options.content_types.accept(), "API lists and watches");
    Ok(options)
}

/// The API source's counters, as the metrics exporter reads them.
#[derive(Debug)]
pub struct ApiSourceCounters(pub std::sync::Arc<kproxy_kube_source::SourceStats>);

impl kproxy_servers::SourceCounters for ApiSourceCounters {
    fn counts(&self) -> Vec<kproxy_servers::SourceCount> {
        kproxy_state::Kind::ALL
            .into_iter()
            .map(|kind| kproxy_servers::SourceCount {
                kind: kind.to_string(),
                malformed: self.0.malformed_objects(kind),
                watch_errors: self.0.watch_errors(kind),
                lists: self.0.lists(kind),
                events: self.0.events(kind),
                streaming_fallbacks: self.0.streaming_fallbacks(kind),
            })
            .collect()
    }
}
