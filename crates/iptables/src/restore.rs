//! How rules reach the kernel: `iptables-restore --noflush -w` (and `iptables`, `iptables-save`)
//! of one backend, behind a trait so tests can record instead of apply.
//!
//! The binaries are always the backend's own (`iptables-legacy-restore`, `ip6tables-nft-save`,
//! ...), never the `iptables` alternative, so kproxy can never write half its rules with one
//! backend and half with the other.

use std::io::Write;
use std::process::{Command, Stdio};

use kproxy_state::IpFamily;

pub use crate::fake::KernelTables;
use crate::rules::Table;

/// Which iptables implementation the host uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The x_tables kernel API (`iptables-legacy`).
    Legacy,
    /// nf_tables through the iptables compatibility layer (`iptables-nft`).
    Nft,
}

impl Backend {
    /// `legacy` or `nft`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Nft => "nft",
        }
    }

    /// The backend's binary for `family`: `tool` is "" (iptables), "-save" or "-restore".
    pub fn program(self, family: IpFamily, tool: &str) -> String {
        let base = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        format!("{base}-{}{tool}", self.as_str())
    }
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The program could not be run.
    #[error("running {program}: {source}")]
    Spawn {
        /// Program.
        program: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The program refused (a restore is atomic per table: a refused table is unchanged).
    #[error("{program} failed: {stderr}")]
    Failed {
        /// Program.
        program: String,
        /// What it said.
        stderr: String,
    },
    /// A test executor was told to fail.
    #[error("injected failure")]
    Injected,
}

/// What a plain `iptables` command printed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Output {
    /// Exit status 0.
    pub success: bool,
    /// Standard output.
    pub stdout: String,
}

/// Runs the iptables tools of one backend.
pub trait Executor {
    /// Feeds `input` to `iptables-restore --noflush -w` (of `family`).
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError>;
    /// `iptables-save -t <table>`.
    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError>;
    /// `iptables-save` of every table at once (one run: iptables-nft reads the whole ruleset
    /// whatever `-t` says, so three runs cost three times one). By default, [`Executor::save`]
    /// of each of kproxy's tables.
    fn save_all(&mut self, family: IpFamily) -> Result<String, ExecError> {
        let mut out = String::new();
        for table in Table::ALL {
            out.push_str(&self.save(family, table)?);
        }
        Ok(out)
    }
    /// `iptables -w <args>`; a non-zero exit is an [`Output`] with `success: false`.
    fn run(&mut self, family: IpFamily, args: &[String]) -> Result<Output, ExecError>;
    /// Writes a sysctl under `/proc/sys` (`net/ipv4/conf/all/route_localnet`).
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), ExecError>;
    /// Removes a table that holds nothing but empty built-in chains, where the backend can
    /// (nf_tables; x_tables tables can't be removed and are left alone).
    fn drop_empty_table(&mut self, family: IpFamily, table: Table) -> Result<(), ExecError>;
    /// At most how many chains one `*table … COMMIT` section of a big restore should hold for
    /// this backend; `None`: one section per table (see [`crate::layout`]).
    fn section_limit(&self) -> Option<usize> {
        None
    }
}

/// The real tools of `backend`, run in the network namespace of the calling thread.
#[derive(Debug, Clone)]
pub struct IptablesRestore {
    backend: Backend,
}

/// How long the tools wait for the xtables lock (iptables-legacy; iptables-nft has none), and
/// how often they look: upstream's 5 s and 100 ms. A bare `-w` would wait for ever, and a
/// process that never lets go of the lock would freeze the sync loop; after 5 s the sync fails,
/// is counted, and is retried like any failed sync.
const XTABLES_WAIT: [&str; 4] = ["-w", "5", "-W", "100000"];

impl IptablesRestore {
    /// The tools of `backend`.
    pub fn new(backend: Backend) -> Self {
        Self { backend }
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    fn command(&self, family: IpFamily, tool: &str, args: &[&str], stdin: Option<&str>) -> Result<Output, ExecError> {
        let program = self.backend.program(family, tool);
        let spawn_err = |source| ExecError::Spawn { program: program.clone(), source };
        let mut child = Command::new(&program)
            .args(args)
            .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes()).map_err(spawn_err)?;
        }
        let out = child.wait_with_output().map_err(spawn_err)?;
        match out.status.code() {
            Some(0) => Ok(Output { success: true, stdout: String::from_utf8_lossy(&out.stdout).into_owned() }),
            // 1: "bad rule (does a matching rule exist in that chain?)" and kin.
            Some(1) if tool.is_empty() => {
                Ok(Output { success: false, stdout: String::from_utf8_lossy(&out.stdout).into_owned() })
            }
            _ => Err(ExecError::Failed { program, stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned() }),
        }
    }
}

impl Executor for IptablesRestore {
    fn section_limit(&self) -> Option<usize> {
        match self.backend {
            Backend::Nft => Some(crate::layout::NFT_SECTION_CHAINS),
            Backend::Legacy => None,
        }
    }

    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        let mut args = vec!["--noflush"];
        args.extend(XTABLES_WAIT);
        self.command(family, "-restore", &args, Some(input)).map(|_| ())
    }

    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        self.command(family, "-save", &["-t", table.as_str()], None).map(|o| o.stdout)
    }

    fn save_all(&mut self, family: IpFamily) -> Result<String, ExecError> {
        self.command(family, "-save", &[], None).map(|o| o.stdout)
    }

    fn run(&mut self, family: IpFamily, args: &[String]) -> Result<Output, ExecError> {
        let mut all = XTABLES_WAIT.to_vec();
        all.extend(args.iter().map(String::as_str));
        self.command(family, "", &all, None)
    }

    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), ExecError> {
        let path = format!("/proc/sys/{key}");
        // Written only where it differs: in an unprivileged container `/proc/sys` is read-only,
        // and `kproxy --init-only` set it before.
        if std::fs::read_to_string(&path).is_ok_and(|now| now.trim() == value) {
            return Ok(());
        }
        std::fs::write(&path, value).map_err(|source| ExecError::Spawn { program: path, source })
    }

    fn drop_empty_table(&mut self, family: IpFamily, table: Table) -> Result<(), ExecError> {
        if self.backend == Backend::Legacy {
            return Ok(());
        }
        // Over nf_tables netlink: the image carries no `nft` for this one command.
        use kproxy_nft_model::{Executor as _, Op, TableRef, Transaction};
        let table = TableRef { family: family.into(), name: table.as_str().to_owned() };
        let mut tx = Transaction::new();
        tx.push(Op::AddTable { table: table.clone(), comment: None });
        tx.push(Op::DeleteTable(table));
        kproxy_nft_netlink::NetlinkExecutor::new()
            .apply(&tx)
            .map_err(|e| ExecError::Failed { program: "nf_tables netlink".to_owned(), stderr: e.to_string() })
    }
}

/// Records instead of applying (unit tests, `--dry-run`); with `kernel` set, also applies to
/// an imitation of the kernel's tables.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    /// Every restore input, with its family, in order.
    pub restores: Vec<(IpFamily, String)>,
    /// Every `iptables` command, with its family, in order.
    pub commands: Vec<(IpFamily, Vec<String>)>,
    /// Every sysctl written.
    pub sysctls: Vec<(String, String)>,
    /// What `iptables-save` prints, per family and table (empty when absent).
    pub saved: std::collections::BTreeMap<(IpFamily, Table), String>,
    /// Whether `iptables -C` finds the rule.
    pub check_succeeds: bool,
    /// Fail the next restore (then reset).
    pub fail_next: bool,
    /// Tables dropped as empty.
    pub dropped: Vec<(IpFamily, Table)>,
    /// What [`Executor::section_limit`] answers.
    pub section_limit: Option<usize>,
    /// Restores and `-C`/`-I`/`-S` go to these tables too, and `iptables-save` prints them
    /// (instead of `saved`; `-C` answers from them instead of `check_succeeds`).
    pub kernel: Option<KernelTables>,
}

impl Recording {
    /// The last restore input for `family`.
    pub fn last(&self, family: IpFamily) -> Option<&str> {
        self.restores.iter().rev().find(|(f, _)| *f == family).map(|(_, s)| s.as_str())
    }
}

impl Executor for Recording {
    fn section_limit(&self) -> Option<usize> {
        self.section_limit
    }

    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        if std::mem::take(&mut self.fail_next) {
            return Err(ExecError::Injected);
        }
        self.restores.push((family, input.to_owned()));
        if let Some(kernel) = &mut self.kernel {
            kernel
                .restore(family, input)
                .map_err(|stderr| ExecError::Failed { program: "iptables-restore (fake)".to_owned(), stderr })?;
        }
        Ok(())
    }

    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        if let Some(kernel) = &self.kernel {
            return Ok(kernel.save(family, table));
        }
        Ok(self.saved.get(&(family, table)).cloned().unwrap_or_default())
    }

    fn run(&mut self, family: IpFamily, args: &[String]) -> Result<Output, ExecError> {
        self.commands.push((family, args.to_vec()));
        if let Some(kernel) = &mut self.kernel {
            let (success, stdout) = kernel.run(family, args);
            return Ok(Output { success, stdout });
        }
        let success = !args.iter().any(|a| a == "-C") || self.check_succeeds;
        Ok(Output { success, stdout: String::new() })
    }

    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), ExecError> {
        self.sysctls.push((key.to_owned(), value.to_owned()));
        Ok(())
    }

    fn drop_empty_table(&mut self, family: IpFamily, table: Table) -> Result<(), ExecError> {
        self.dropped.push((family, table));
        Ok(())
    }
}

impl<E: Executor + ?Sized> Executor for &mut E {
    fn section_limit(&self) -> Option<usize> {
        (**self).section_limit()
    }
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        (**self).restore(family, input)
    }
    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        (**self).save(family, table)
    }
    fn save_all(&mut self, family: IpFamily) -> Result<String, ExecError> {
        (**self).save_all(family)
    }
    fn run(&mut self, family: IpFamily, args: &[String]) -> Result<Output, ExecError> {
        (**self).run(family, args)
    }
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), ExecError> {
        (**self).sysctl(key, value)
    }
    fn drop_empty_table(&mut self, family: IpFamily, table: Table) -> Result<(), ExecError> {
        (**self).drop_empty_table(family, table)
    }
}

impl<E: Executor + ?Sized> Executor for Box<E> {
    fn section_limit(&self) -> Option<usize> {
        (**self).section_limit()
    }
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        (**self).restore(family, input)
    }
    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        (**self).save(family, table)
    }
    fn save_all(&mut self, family: IpFamily) -> Result<String, ExecError> {
        (**self).save_all(family)
    }
    fn run(&mut self, family: IpFamily, args: &[String]) -> Result<Output, ExecError> {
        (**self).run(family, args)
    }
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), ExecError> {
        (**self).sysctl(key, value)
    }
    fn drop_empty_table(&mut self, family: IpFamily, table: Table) -> Result<(), ExecError> {
        (**self).drop_empty_table(family, table)
    }
}
