//! Conntrack helpers for a namespace (each network namespace has its own conntrack table).

use crate::error::Result;
use crate::netns::Netns;

/// Deletes every conntrack entry of `netns`.
pub fn conntrack_flush(netns: &Netns) -> Result<()> {
    netns.exec_ok("conntrack", &["-F"]).map(drop)
}

/// Lists the conntrack entries of `netns` (`conntrack -L` output, one entry per line).
pub fn conntrack_list(netns: &Netns) -> Result<Vec<String>> {
    Ok(netns.exec_ok("conntrack", &["-L"])?.lines().map(str::to_owned).collect())
}
