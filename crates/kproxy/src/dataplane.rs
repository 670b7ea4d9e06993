//! The `--dry-run` printers the binary adds to the dataplanes. (The nftables dataplane applies
//! through `kproxy_nft_netlink::NetlinkExecutor`: the typed model encoded to netlink, no `nft`
//! process on any sync path.)

use std::io::Write as _;

use kproxy_nftables::{ExecError, Executor, Transaction};

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
    fn section_limit(&self) -> Option<usize> {
        self.0.section_limit()
    }
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
