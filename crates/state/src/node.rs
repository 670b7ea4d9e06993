//! Nodes: the local node's zone, pod CIDRs, addresses and draining state.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::change::{Kind, ObjectKey};
use crate::error::ObjectError;
use crate::labels::ZONE_LABEL;
use crate::names;
use crate::service::parse_ip;

/// A Node, validated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// Labels (topology zone and others).
    pub labels: BTreeMap<String, String>,
    /// `spec.podCIDRs` (falling back to `spec.podCIDR`).
    pub pod_cidrs: Vec<IpNet>,
    /// `status.addresses` of type InternalIP, in order.
    pub internal_ips: Vec<IpAddr>,
    /// The node is being deleted (`metadata.deletionTimestamp`) or tainted for removal by the
    /// cluster autoscaler: health checks report it as not eligible.
    pub draining: bool,
}

/// Taint the cluster autoscaler puts on nodes it is about to remove.
const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

impl NodeInfo {
    /// The node's topology zone label, if any.
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(ZONE_LABEL).map(String::as_str)
    }

    /// Validates a Node.
    pub fn from_object(node: &Node) -> Result<Self, ObjectError> {
        let key = ObjectKey::of(&node.metadata);
        let err = |field: &str, reason: String| ObjectError::new(Kind::Node, &key, field, reason);
        if key.name.is_empty() {
            return Err(err("metadata.name", "missing".into()));
        }
        names::dns1123_subdomain(&key.name).map_err(|e| err("metadata.name", e))?;
        let spec = node.spec.as_ref();
        let mut cidr_strings: Vec<&String> = spec.and_then(|s| s.pod_cidrs.as_ref()).into_iter().flatten().collect();
        if cidr_strings.is_empty() {
            cidr_strings.extend(spec.and_then(|s| s.pod_cidr.as_ref()));
        }
        let pod_cidrs = cidr_strings
            .iter()
            .enumerate()
            .map(|(i, c)| {
                IpNet::from_str(c)
                    .map(|n| n.trunc())
                    .map_err(|_| err(&format!("spec.podCIDRs[{i}]"), format!("invalid CIDR {c:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut internal_ips = Vec::new();
        let addresses = node.status.as_ref().and_then(|s| s.addresses.as_ref());
        for (i, a) in addresses.into_iter().flatten().enumerate() {
            if a.type_ == "InternalIP" {
                internal_ips.push(parse_ip(&a.address).map_err(|e| err(&format!("status.addresses[{i}].address"), e))?);
            }
        }
        let tainted = spec.and_then(|s| s.taints.as_ref()).into_iter().flatten().any(|t| t.key == TO_BE_DELETED_TAINT);
        Ok(NodeInfo {
            name: key.name.to_string(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            pod_cidrs,
            internal_ips,
            draining: node.metadata.deletion_timestamp.is_some() || tainted,
        })
    }
}
