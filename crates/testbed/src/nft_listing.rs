//! `nft -j list ruleset` of a namespace, made comparable: handles and version info removed,
//! set elements sorted. Two namespaces that hold the same ruleset list equal, however it was
//! loaded (netlink or `nft -f` text) and in whatever order elements were added.

use serde_json::Value;

use crate::{Netns, Result, TestbedError};

/// The namespace's whole ruleset as comparable JSON.
pub fn nft_listing(ns: &Netns) -> Result<Value> {
    let out = ns.exec_ok("nft", &["-j", "list", "ruleset"])?;
    let mut v: Value =
        serde_json::from_str(&out).map_err(|e| TestbedError::BadReply(format!("nft -j list ruleset: {e}")))?;
    normalize(&mut v);
    Ok(v)
}

fn normalize(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("handle");
            m.remove("metainfo");
            m.values_mut().for_each(normalize);
            if let Some(Value::Array(elems)) = m.get_mut("elem") {
                elems.sort_by_key(|e| e.to_string());
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalize),
        _ => {}
    }
}
