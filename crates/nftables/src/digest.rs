//! The digest of a chain's rules, carried in the kernel as the comment of the chain's first rule.
//!
//! A restarted kproxy knows nothing of what its predecessor wrote; a dump tells it how many rules
//! each chain holds, not whether they are the ones it would write (comparing rules expression by
//! expression would need the kernel's own encoding of every statement). Every time kproxy writes
//! a chain it writes all of its rules, so it tags the first with a digest of them all: at the
//! next start, a chain whose rule count and digest are what kproxy would write is left as it is
//! (see [`crate::kernel::adopt_ops`]). A chain someone else changed without touching its first
//! rule or its length would be kept too; the periodic check trusts the same summary.
//!
//! The digest is SHA-256 over the typed rules (their `Hash` implementations), so a kproxy that
//! renders a chain differently (an upgrade) finds a different digest and rewrites the chain.

use std::hash::{Hash, Hasher};

use kproxy_nft_model::Rule;
use sha2::{Digest, Sha256};

/// What every digest comment starts with.
pub const PREFIX: &str = "kproxy-rules:";

/// The comment for the first rule of a chain holding `rules`; `None` for an empty chain.
pub fn chain_comment(rules: &[Rule]) -> Option<String> {
    if rules.is_empty() {
        return None;
    }
    let mut h = Sha(Sha256::new());
    rules.hash(&mut h);
    Some(format!("{PREFIX}{:016x}", h.finish()))
}

/// Feeds `Hash` into SHA-256 (std's hashers are not meant to be stable across processes).
struct Sha(Sha256);

impl Hasher for Sha {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_be_bytes(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kproxy_nft_model::Stmt;

    fn rules(marks: &[u32]) -> Vec<Rule> {
        marks.iter().map(|m| Rule::new([Stmt::MarkOr(*m), Stmt::MarkAnd(!*m)])).collect()
    }

    #[test]
    fn the_digest_follows_the_rules_their_order_and_nothing_else() {
        let c = chain_comment(&rules(&[1, 2])).unwrap();
        assert!(c.starts_with(PREFIX) && c.len() == PREFIX.len() + 16, "{c}");
        assert_eq!(Some(c.clone()), chain_comment(&rules(&[1, 2])));
        assert_ne!(Some(c.clone()), chain_comment(&rules(&[2, 1])));
        assert_ne!(Some(c.clone()), chain_comment(&rules(&[1, 3])));
        assert_ne!(Some(c), chain_comment(&rules(&[1])));
        assert_eq!(chain_comment(&[]), None);
    }
}
