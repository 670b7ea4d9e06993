//! Health-check node ports for `externalTrafficPolicy: Local` Services.
//!
//! A cloud load balancer probes each node on the Service's `healthCheckNodePort` and sends traffic
//! only to nodes that answer 200: those with at least one ready local endpoint and a healthy proxy.
//! As upstream, every path and method gets the same answer: a JSON body
//! `{"service":{"namespace","name"},"localEndpoints":N,"serviceProxyHealthy":bool}` (laid out with
//! tabs exactly as upstream prints it), `Content-Type: application/json`,
//! `X-Content-Type-Options: nosniff` and `X-Load-Balancing-Endpoint-Weight: N`.
//!
//! One listener per Service and bind address. Upstream listens on the node IPs matching
//! `nodePortAddresses`, or on every address when that list matches everything; the caller decides
//! ([`HealthCheckBind`]). A port that cannot be opened (taken by another program) is logged,
//! counted in `kproxy_service_healthcheck_bind_failures_total` and returned to the caller (who may
//! emit an Event, as upstream does), never fatal; it is retried at the next sync.
//!
//! One deliberate difference: a request racing with the close of its Service gets 503 where
//! upstream writes an empty 200.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kproxy_state::ObjectKey;

use crate::error::ServeError;
use crate::health::ProxyHealth;
use crate::healthz::NOSNIFF;
use crate::metrics::Metrics;
use crate::server::{RunningServer, listen, spawn};

/// The header carrying the local endpoint count, for load balancers that weight nodes by it.
pub const ENDPOINT_WEIGHT_HEADER: &str = "x-load-balancing-endpoint-weight";

/// Where health-check node ports listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCheckBind {
    /// Every address of the node, IPv4 and IPv6 (one dual-stack socket on `[::]`, or `0.0.0.0` where
    /// IPv6 is unavailable). Upstream's choice when `nodePortAddresses` matches everything.
    AllAddresses,
    /// These node addresses (the node IPs matching `nodePortAddresses`).
    Addresses(Vec<IpAddr>),
}

/// A health-check port that could not be opened.
#[derive(Debug)]
pub struct BindFailure {
    /// The Service.
    pub service: ObjectKey,
    /// Its `healthCheckNodePort`.
    pub port: u16,
    /// Why.
    pub error: ServeError,
}

/// Serves one health-check node port per Service.
#[derive(Debug)]
pub struct ServiceHealthServer {
    /// Where ports are opened; changed (ports reopened) by [`ServiceHealthServer::set_bind`].
    bind: std::sync::Mutex<HealthCheckBind>,
    shared: Arc<Shared>,
    open: tokio::sync::Mutex<BTreeMap<ObjectKey, Instance>>,
}

#[derive(Debug)]
struct Shared {
    health: Arc<ProxyHealth>,
    metrics: Metrics,
    /// Local ready endpoints per open Service.
    endpoints: RwLock<HashMap<ObjectKey, usize>>,
}

#[derive(Debug)]
struct Instance {
    port: u16,
    servers: Vec<RunningServer>,
}

impl ServiceHealthServer {
    /// A server with no ports open yet.
    pub fn new(bind: HealthCheckBind, health: Arc<ProxyHealth>, metrics: Metrics) -> Self {
        Self {
            bind: std::sync::Mutex::new(bind),
            shared: Arc::new(Shared { health, metrics, endpoints: RwLock::new(HashMap::new()) }),
            open: tokio::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// Makes the open ports exactly `services` (Service → `healthCheckNodePort`): closes those no
    /// longer wanted or whose port changed (before opening anything, so a port can move between
    /// Services in one sync), opens the new ones, leaves the rest alone. Returns the ports that
    /// could not be opened; they are retried on the next call.
    pub async fn sync_services(&self, services: &HashMap<ObjectKey, u16>) -> Vec<BindFailure> {
        let mut open = self.open.lock().await;
        let stale: Vec<ObjectKey> = open
            .iter()
            .filter(|(name, instance)| services.get(*name) != Some(&instance.port))
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            if let Some(instance) = open.remove(&name) {
                tracing::info!(service = %name, port = instance.port, "closing health check node port");
                self.endpoints_mut().remove(&name);
                for server in instance.servers {
                    if let Err(error) = server.shutdown().await {
                        tracing::warn!(service = %name, %error, "health check server ended badly");
                    }
                }
            }
        }

        let mut failures = Vec::new();
        let mut wanted: Vec<(&ObjectKey, u16)> = services.iter().map(|(name, port)| (name, *port)).collect();
        wanted.sort();
        for (name, port) in wanted {
            if open.contains_key(name) {
                continue;
            }
            match self.open_instance(name, port).await {
                Ok(servers) => {
                    tracing::info!(service = %name, port, "opened health check node port");
                    self.endpoints_mut().insert(name.clone(), 0);
                    open.insert(name.clone(), Instance { port, servers });
                }
                Err(error) => {
                    tracing::error!(service = %name, port, %error, "cannot open health check node port");
                    self.shared.metrics.inc_healthcheck_bind_failure();
                    failures.push(BindFailure { service: name.clone(), port, error });
                }
            }
        }
        failures
    }

    /// Moves the health-check ports to `bind` (the node addresses `nodePortAddresses` now
    /// match): when it differs, every open port is closed, and the next
    /// [`ServiceHealthServer::sync_services`] opens them on the new addresses. Returns whether it
    /// changed.
    pub async fn set_bind(&self, bind: HealthCheckBind) -> bool {
        let mut open = self.open.lock().await;
        {
            let mut current = self.bind.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if *current == bind {
                return false;
            }
            tracing::info!(from = ?*current, to = ?bind, "health check node ports move");
            *current = bind;
        }
        for (name, instance) in std::mem::take(&mut *open) {
            self.endpoints_mut().remove(&name);
            for server in instance.servers {
                if let Err(error) = server.shutdown().await {
                    tracing::warn!(service = %name, %error, "health check server ended badly");
                }
            }
        }
        true
    }

    /// Sets the local ready endpoint count of each open Service; open Services missing from the
    /// map have none. Counts for Services without an open port are ignored.
    pub async fn sync_endpoints(&self, local_endpoints: &HashMap<ObjectKey, usize>) {
        let open = self.open.lock().await;
        let mut endpoints = self.endpoints_mut();
        for name in open.keys() {
            endpoints.insert(name.clone(), local_endpoints.get(name).copied().unwrap_or(0));
        }
    }

    /// The addresses each Service's health check listens on.
    pub async fn listening(&self) -> BTreeMap<ObjectKey, Vec<SocketAddr>> {
        let open = self.open.lock().await;
        open.iter().map(|(name, inst)| (name.clone(), inst.servers.iter().map(|s| s.local_addr()).collect())).collect()
    }

    /// Closes every port.
    pub async fn shutdown(&self) {
        self.sync_services(&HashMap::new()).await;
    }

    fn endpoints_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<ObjectKey, usize>> {
        self.shared.endpoints.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn open_instance(&self, name: &ObjectKey, port: u16) -> Result<Vec<RunningServer>, ServeError> {
        let router = service_router(self.shared.clone(), name.clone());
        let bind = self.bind.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let addresses: Vec<SocketAddr> = match &bind {
            HealthCheckBind::AllAddresses => {
                let dual_stack = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port);
                match listen(dual_stack) {
                    Ok(listener) => return Ok(vec![spawn(listener, router)?]),
                    // No IPv6 on this host: fall back to IPv4 only. Any other error is real.
                    Err(ServeError::Bind { source, .. })
                        if source.raw_os_error() == Some(97) || source.raw_os_error() == Some(99) =>
                    {
                        vec![SocketAddr::from(([0, 0, 0, 0], port))]
                    }
                    Err(error) => return Err(error),
                }
            }
            HealthCheckBind::Addresses(ips) => ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect(),
        };
        let mut servers = Vec::with_capacity(addresses.len());
        for addr in addresses {
            match listen(addr).and_then(|listener| spawn(listener, router.clone())) {
                Ok(server) => servers.push(server),
                Err(error) => {
                    // Release what was opened so a later retry (or another owner) can bind.
                    for server in servers {
                        let _ = server.shutdown().await;
                    }
                    return Err(error);
                }
            }
        }
        Ok(servers)
    }
}

fn service_router(shared: Arc<Shared>, name: ObjectKey) -> Router {
    let handler = move || std::future::ready(answer(&shared, &name));
    Router::new().fallback(handler)
}

/// The body upstream writes, byte for byte (tab-indented).
pub fn service_health_body(service: &ObjectKey, local_endpoints: usize, proxy_healthy: bool) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "{{\n\t\"service\": {{\n\t\t\"namespace\": {},\n\t\t\"name\": {}\n\t}},\n\t\"localEndpoints\": {},\n\t\"serviceProxyHealthy\": {}\n}}",
        quote(&service.namespace),
        quote(&service.name),
        local_endpoints,
        proxy_healthy
    )
}

fn answer(shared: &Shared, name: &ObjectKey) -> Response {
    let count = shared.endpoints.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name).copied();
    let Some(count) = count else {
        tracing::debug!(service = %name, "request for a closed health check");
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let healthy = shared.health.is_healthy();
    let status = if count > 0 && healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let mut response = (status, service_health_body(name, count, healthy)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(NOSNIFF.0, HeaderValue::from_static(NOSNIFF.1));
    headers.insert(ENDPOINT_WEIGHT_HEADER, HeaderValue::from(count));
    response
}
