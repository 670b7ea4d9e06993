//! Executors the binary adds to the dataplanes: netlink with an `nft` fallback, and `--dry-run` printers.

use std::io::Write as _;

use kproxy_nftables::{ExecError, Executor, Transaction};

/// Applies transactions over nf_tables netlink (no `nft` process, no ruleset dump), falling back
/// to `nft -f` for a transaction that uses syntax the netlink encoder does not cover.
#[derive(Debug, Default)]
pub struct PreferNetlink {
    netlink: kproxy_nft_netlink::NetlinkExecutor,
    nft: kproxy_nftables::NftCommand,
    warned: bool,
}

impl Executor for PreferNetlink {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        match self.netlink.apply(tx) {
            // Nothing was sent: the same transaction can go through nft instead.
            Err(ExecError::Unsupported { op, reason, .. }) => {
                if !std::mem::replace(&mut self.warned, true) {
                    tracing::warn!(%op, %reason, "netlink encoder cannot express an operation; using nft -f for such transactions");
                }
                self.nft.apply(tx)
            }
            other => other,
        }
    }
}

/// `--dry-run`: prints each transaction as nft text instead of applying it.
#[derive(Debug, Default)]
pub struct PrintTransactions;

impl Executor for PrintTransactions {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "# --- transaction ({} operations) ---\n{}", tx.len(), tx.render());
        Ok(())
    }
}

/// `--dry-run` in iptables mode: prints each `iptables-restore` input instead of applying it.
#[derive(Debug, Default)]
pub struct PrintRestores(kproxy_iptables::Recording);

impl kproxy_iptables::Executor for PrintRestores {
    fn restore(&mut self, family: kproxy_state::IpFamily, input: &str) -> Result<(), kproxy_iptables::ExecError> {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "# --- {family} iptables-restore --noflush ---\n{input}");
        self.0.restore(family, input)
    }
    fn save(
        &mut self,
        family: kproxy_state::IpFamily,
        table: kproxy_iptables::rules::Table,
    ) -> Result<String, kproxy_iptables::ExecError> {
        self.0.save(family, table)
    }
    fn run(
        &mut self,
        family: kproxy_state::IpFamily,
        args: &[String],
    ) -> Result<kproxy_iptables::Output, kproxy_iptables::ExecError> {
        self.0.run(family, args)
    }
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), kproxy_iptables::ExecError> {
        self.0.sysctl(key, value)
    }
    fn drop_empty_table(
        &mut self,
        family: kproxy_state::IpFamily,
        table: kproxy_iptables::rules::Table,
    ) -> Result<(), kproxy_iptables::ExecError> {
        self.0.drop_empty_table(family, table)
    }
}
