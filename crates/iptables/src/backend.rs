//! Which iptables backend the host uses, decided like upstream's `iptables-wrapper` (the
//! heuristic kube-proxy's image runs before kube-proxy starts):
//!
//! 1. kubelet's marker chains (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`) in the mangle table
//!    of the nft backend ⇒ nft; else in the legacy backend ⇒ legacy;
//! 2. otherwise whichever backend holds more rules; a tie (a fresh host) ⇒ nft.
//!
//! The choice is made once and every command then uses that backend's binaries, so kproxy
//! never mixes the two.

use std::process::{Command, Stdio};

use kproxy_state::IpFamily;

use crate::restore::Backend;

/// Kubelet's chains that say which backend the node's kubelet uses.
const HINT_CHAINS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// What the save tools print for one backend: both families, `mangle` only and everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendView {
    /// `iptables-save -t mangle` and `ip6tables-save -t mangle`, concatenated.
    pub mangle: String,
    /// `iptables-save` and `ip6tables-save`, concatenated.
    pub all: String,
}

impl BackendView {
    fn has_hint(&self) -> bool {
        self.mangle
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .any(|l| HINT_CHAINS.iter().any(|h| l.split_whitespace().next() == Some(h)))
    }

    fn rule_count(&self) -> usize {
        self.all.lines().filter(|l| l.starts_with('-')).count()
    }
}

/// The pure decision, from what each backend's save tools printed.
pub fn choose(nft: &BackendView, legacy: &BackendView) -> Backend {
    if nft.has_hint() {
        Backend::Nft
    } else if legacy.has_hint() || legacy.rule_count() > nft.rule_count() {
        Backend::Legacy
    } else {
        Backend::Nft
    }
}

fn save(backend: Backend, args: &[&str]) -> String {
    let mut out = String::new();
    for family in IpFamily::BOTH {
        let program = backend.program(family, "-save");
        match Command::new(&program).args(args).stdin(Stdio::null()).stderr(Stdio::null()).output() {
            Ok(o) => out.push_str(&String::from_utf8_lossy(&o.stdout)),
            Err(e) => tracing::debug!(%program, error = %e, "backend probe failed"),
        }
    }
    out
}

fn view(backend: Backend) -> BackendView {
    BackendView { mangle: save(backend, &["-t", "mangle"]), all: save(backend, &[]) }
}

/// [`choose`], reading nft's view only when it can matter: with neither a hint nor a rule in
/// legacy the answer is nft whatever nft holds. (`iptables-nft-save` reads the whole ruleset
/// even for `-t mangle`: seconds on a node where kproxy's own 10,000 Services are, as on every
/// restart; the legacy tools on such a node print next to nothing.)
pub fn choose_lazily(nft: impl FnOnce() -> BackendView, legacy: &BackendView) -> Backend {
    if !legacy.has_hint() && legacy.rule_count() == 0 {
        return Backend::Nft;
    }
    choose(&nft(), legacy)
}

/// Detects the host's backend (in the calling thread's network namespace).
pub fn detect() -> Backend {
    let backend = choose_lazily(|| view(Backend::Nft), &view(Backend::Legacy));
    tracing::info!(backend = backend.as_str(), "iptables backend");
    backend
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(mangle: &str, all: &str) -> BackendView {
        BackendView { mangle: mangle.into(), all: all.into() }
    }

    #[test]
    fn kubelet_hints_win_nft_first() {
        let hint = ":KUBE-IPTABLES-HINT - [0:0]\n";
        let many = "-A INPUT -j ACCEPT\n".repeat(5);
        assert_eq!(choose(&v(hint, ""), &v(hint, &many)), Backend::Nft);
        assert_eq!(choose(&v("", ""), &v(":KUBE-KUBELET-CANARY - [0:0]\n", "")), Backend::Legacy);
    }

    #[test]
    fn nfts_view_is_read_only_when_it_can_change_the_answer() {
        let hint = ":KUBE-IPTABLES-HINT - [0:0]\n";
        let one = "-A INPUT -j ACCEPT\n";
        let views = [v("", ""), v(hint, ""), v("", one), v("", &one.repeat(2)), v(hint, one)];
        for nft in &views {
            for legacy in &views {
                let mut read = false;
                let lazily = choose_lazily(
                    || {
                        read = true;
                        nft.clone()
                    },
                    legacy,
                );
                assert_eq!(lazily, choose(nft, legacy), "nft {nft:?}, legacy {legacy:?}");
                assert_eq!(read, *legacy != v("", ""), "nft {nft:?}, legacy {legacy:?}");
            }
        }
    }

    #[test]
    fn otherwise_the_backend_with_more_rules_and_nft_on_a_tie() {
        let one = "-A INPUT -j ACCEPT\n";
        assert_eq!(choose(&v("", one), &v("", &one.repeat(2))), Backend::Legacy);
        assert_eq!(choose(&v("", one), &v("", one)), Backend::Nft);
        assert_eq!(choose(&v("", ""), &v("", "# comment\n:INPUT ACCEPT [0:0]\n")), Backend::Nft);
    }
}
