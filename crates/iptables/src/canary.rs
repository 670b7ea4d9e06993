//! Self-healing: kproxy keeps a `KUBE-PROXY-CANARY` chain with one rule in the mangle, nat and
//! filter tables. Someone flushing a table (`iptables -t nat -F`) removes the rule, deleting
//! the chains removes the chain; either way the check fails and the dataplane does a full
//! restore next. (Upstream's canary is an empty chain, which notices deletion but not a flush.)

use kproxy_state::IpFamily;

use crate::restore::{ExecError, Executor};
use crate::rules::{CANARY, Table};

/// Whether the canary rule is present in every table of `family`.
pub fn intact(exec: &mut dyn Executor, family: IpFamily) -> Result<bool, ExecError> {
    for table in Table::ALL {
        let args = ["-t", table.as_str(), "-S", CANARY].map(str::to_owned);
        let out = exec.run(family, &args)?;
        let prefix = format!("-A {CANARY} ");
        if !out.success || !out.stdout.lines().any(|l| l.starts_with(&prefix)) {
            tracing::debug!(?family, table = table.as_str(), "canary missing");
            return Ok(false);
        }
    }
    Ok(true)
}
