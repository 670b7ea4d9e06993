//! A typed nf_tables transaction: the batch one sync applies atomically.
//!
//! Operations are typed so that the executor (today `nft -f`, later raw netlink) and the tests
//! see the same thing; rule bodies are nft expression text, which is what both the `nft` parser
//! and the golden snapshots want. [`Transaction::render`] produces `nft -f` input.

use std::fmt::{self, Write as _};

/// An nf_tables address family kproxy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TableFamily {
    /// `ip`
    Ip,
    /// `ip6`
    Ip6,
}

impl TableFamily {
    /// The family keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            TableFamily::Ip => "ip",
            TableFamily::Ip6 => "ip6",
        }
    }
}

impl fmt::Display for TableFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A table, addressed by family and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableRef {
    /// Family.
    pub family: TableFamily,
    /// Name.
    pub name: String,
}

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// Where a base chain hooks in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hook {
    /// `filter` or `nat`.
    pub kind: &'static str,
    /// `prerouting`, `input`, `forward`, `output`, `postrouting`.
    pub hook: &'static str,
    /// Priority as nft spells it (`dstnat`, `-110`, ...).
    pub priority: &'static str,
}

/// A chain definition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    /// Name.
    pub name: String,
    /// Set for base chains.
    pub hook: Option<Hook>,
}

/// A set or map definition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetDef {
    /// Name.
    pub name: String,
    /// Key type (`ipv4_addr . inet_proto . inet_service`), or with [`SetDef::by_typeof`] the
    /// expressions whose types it has (`ip daddr . numgen random mod 2`).
    pub key_type: String,
    /// Data type for maps (`verdict`), `None` for sets; expressions with [`SetDef::by_typeof`].
    pub data_type: Option<String>,
    /// The types are given as `typeof` expressions: needed for keys with an `integer` field (a
    /// `numgen` result), which has no type name of a fixed size.
    pub by_typeof: bool,
    /// Flags (`interval`, `dynamic`, `timeout`).
    pub flags: Vec<&'static str>,
    /// Default element timeout in seconds.
    pub timeout: Option<u32>,
    /// Maximum number of elements (dynamic sets).
    pub size: Option<u32>,
    /// Comment.
    pub comment: Option<String>,
}

impl SetDef {
    /// A plain set of `key_type` (no data, flags, timeout, size or comment); the other fields
    /// are set with struct update syntax.
    pub fn new(name: impl Into<String>, key_type: impl Into<String>) -> Self {
        SetDef {
            name: name.into(),
            key_type: key_type.into(),
            data_type: None,
            by_typeof: false,
            flags: vec![],
            timeout: None,
            size: None,
            comment: None,
        }
    }

    /// Whether this is a map.
    pub fn is_map(&self) -> bool {
        self.data_type.is_some()
    }

    fn keyword(&self) -> &'static str {
        if self.is_map() { "map" } else { "set" }
    }
}

/// One element of a set (`value: None`) or map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    /// Set or map name.
    pub set: String,
    /// Key, in nft syntax (`10.96.0.1 . tcp . 80`).
    pub key: String,
    /// Data for maps (`goto service-...`).
    pub value: Option<String>,
}

/// One operation of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// Create the table if missing.
    AddTable {
        /// Table.
        table: TableRef,
        /// Comment.
        comment: Option<String>,
    },
    /// Remove every rule and element in the table.
    FlushTable(TableRef),
    /// Delete the table and everything in it.
    DeleteTable(TableRef),
    /// Create a chain if missing.
    AddChain(TableRef, Chain),
    /// Remove every rule of a chain.
    FlushChain(TableRef, String),
    /// Delete an (empty, unreferenced) chain.
    DeleteChain(TableRef, String),
    /// Append a rule to a chain.
    AddRule {
        /// Table.
        table: TableRef,
        /// Chain.
        chain: String,
        /// Rule body in nft syntax.
        rule: String,
    },
    /// Create a set or map if missing.
    AddSet(TableRef, SetDef),
    /// Remove every element of a set or map (`is_map` picks the keyword).
    FlushSet {
        /// Table.
        table: TableRef,
        /// Name.
        name: String,
        /// Map rather than set.
        is_map: bool,
    },
    /// Delete a set or map.
    DeleteSet {
        /// Table.
        table: TableRef,
        /// Name.
        name: String,
        /// Map rather than set.
        is_map: bool,
    },
    /// Add an element.
    AddElement(TableRef, Element),
    /// Delete an element (the value is ignored).
    DeleteElement(TableRef, Element),
}

/// Operation counts by kind, for tests and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpCounts {
    /// Table operations.
    pub tables: usize,
    /// Chain add/flush/delete.
    pub chains: usize,
    /// Rules added.
    pub rules: usize,
    /// Set/map add/flush/delete.
    pub sets: usize,
    /// Elements added or deleted.
    pub elements: usize,
}

impl std::ops::AddAssign for OpCounts {
    fn add_assign(&mut self, o: OpCounts) {
        self.tables += o.tables;
        self.chains += o.chains;
        self.rules += o.rules;
        self.sets += o.sets;
        self.elements += o.elements;
    }
}

/// An ordered batch of operations applied atomically.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Transaction {
    ops: Vec<Op>,
}

impl Transaction {
    /// An empty transaction.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an operation.
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// Appends `add rule` for each rule.
    pub fn add_rules<I: IntoIterator<Item = String>>(&mut self, table: &TableRef, chain: &str, rules: I) {
        for rule in rules {
            self.push(Op::AddRule { table: table.clone(), chain: chain.to_owned(), rule });
        }
    }

    /// The operations, in order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The operations, by value.
    pub fn into_ops(self) -> Vec<Op> {
        self.ops
    }

    /// Number of operations.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True when there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Counts by kind.
    pub fn counts(&self) -> OpCounts {
        let mut c = OpCounts::default();
        for op in &self.ops {
            match op {
                Op::AddTable { .. } | Op::FlushTable(_) | Op::DeleteTable(_) => c.tables += 1,
                Op::AddChain(..) | Op::FlushChain(..) | Op::DeleteChain(..) => c.chains += 1,
                Op::AddRule { .. } => c.rules += 1,
                Op::AddSet(..) | Op::FlushSet { .. } | Op::DeleteSet { .. } => c.sets += 1,
                Op::AddElement(..) | Op::DeleteElement(..) => c.elements += 1,
            }
        }
        c
    }

    /// Appends all operations of `other`.
    pub fn extend(&mut self, other: Transaction) {
        self.ops.extend(other.ops);
    }

    /// The transaction as `nft -f` input, one command per line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for op in &self.ops {
            // Writing to a String cannot fail.
            let _ = render_op(&mut out, op);
            out.push('\n');
        }
        out
    }
}

impl fmt::Display for Transaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render())
    }
}

fn render_op(out: &mut String, op: &Op) -> fmt::Result {
    match op {
        Op::AddTable { table, comment } => {
            write!(out, "add table {table}")?;
            if let Some(c) = comment {
                write!(out, " {{ comment {}; }}", quote(c))?;
            }
            Ok(())
        }
        Op::FlushTable(t) => write!(out, "flush table {t}"),
        Op::DeleteTable(t) => write!(out, "delete table {t}"),
        Op::AddChain(t, chain) => {
            write!(out, "add chain {t} {}", chain.name)?;
            if let Some(h) = &chain.hook {
                write!(out, " {{ type {} hook {} priority {}; policy accept; }}", h.kind, h.hook, h.priority)?;
            }
            Ok(())
        }
        Op::FlushChain(t, name) => write!(out, "flush chain {t} {name}"),
        Op::DeleteChain(t, name) => write!(out, "delete chain {t} {name}"),
        Op::AddRule { table, chain, rule } => write!(out, "add rule {table} {chain} {rule}"),
        Op::AddSet(t, s) => {
            let declared = if s.by_typeof { "typeof" } else { "type" };
            write!(out, "add {} {t} {} {{ {declared} {}", s.keyword(), s.name, s.key_type)?;
            if let Some(d) = &s.data_type {
                write!(out, " : {d}")?;
            }
            out.push(';');
            if !s.flags.is_empty() {
                write!(out, " flags {};", s.flags.join(","))?;
            }
            if let Some(t) = s.timeout {
                write!(out, " timeout {t}s;")?;
            }
            if let Some(size) = s.size {
                write!(out, " size {size};")?;
            }
            if let Some(c) = &s.comment {
                write!(out, " comment {};", quote(c))?;
            }
            out.push_str(" }");
            Ok(())
        }
        Op::FlushSet { table, name, is_map } => write!(out, "flush {} {table} {name}", set_keyword(*is_map)),
        Op::DeleteSet { table, name, is_map } => write!(out, "delete {} {table} {name}", set_keyword(*is_map)),
        Op::AddElement(t, e) => match &e.value {
            Some(v) => write!(out, "add element {t} {} {{ {} : {v} }}", e.set, e.key),
            None => write!(out, "add element {t} {} {{ {} }}", e.set, e.key),
        },
        Op::DeleteElement(t, e) => write!(out, "delete element {t} {} {{ {} }}", e.set, e.key),
    }
}

fn set_keyword(is_map: bool) -> &'static str {
    if is_map { "map" } else { "set" }
}

/// Quotes a string for nft (comments); quotes inside are dropped since nft has no escape for them.
pub(crate) fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', ""))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t() -> TableRef {
        TableRef { family: TableFamily::Ip, name: "kproxy".into() }
    }

    #[test]
    fn renders_every_op_as_nft_commands() {
        let mut tx = Transaction::new();
        tx.push(Op::AddTable { table: t(), comment: Some("rules for kproxy".into()) });
        tx.push(Op::AddChain(
            t(),
            Chain { name: "nat-output".into(), hook: Some(Hook { kind: "nat", hook: "output", priority: "dstnat" }) },
        ));
        tx.push(Op::AddChain(t(), Chain { name: "services".into(), hook: None }));
        tx.add_rules(&t(), "services", ["ip daddr . meta l4proto . th dport vmap @service-ips".to_owned()]);
        tx.push(Op::AddSet(
            t(),
            SetDef {
                name: "service-ips".into(),
                key_type: "ipv4_addr . inet_proto . inet_service".into(),
                data_type: Some("verdict".into()),
                by_typeof: false,
                flags: vec![],
                timeout: None,
                size: None,
                comment: Some("ClusterIP traffic".into()),
            },
        ));
        let e = Element { set: "service-ips".into(), key: "10.0.0.1 . tcp . 80".into(), value: Some("drop".into()) };
        tx.push(Op::AddElement(t(), e.clone()));
        tx.push(Op::DeleteElement(t(), e));
        tx.push(Op::FlushChain(t(), "services".into()));
        tx.push(Op::DeleteChain(t(), "services".into()));
        tx.push(Op::FlushSet { table: t(), name: "service-ips".into(), is_map: true });
        tx.push(Op::DeleteTable(t()));
        assert_eq!(
            tx.render(),
            "add table ip kproxy { comment \"rules for kproxy\"; }\n\
             add chain ip kproxy nat-output { type nat hook output priority dstnat; policy accept; }\n\
             add chain ip kproxy services\n\
             add rule ip kproxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
             add map ip kproxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict; comment \"ClusterIP traffic\"; }\n\
             add element ip kproxy service-ips { 10.0.0.1 . tcp . 80 : drop }\n\
             delete element ip kproxy service-ips { 10.0.0.1 . tcp . 80 }\n\
             flush chain ip kproxy services\n\
             delete chain ip kproxy services\n\
             flush map ip kproxy service-ips\n\
             delete table ip kproxy\n"
        );
        let c = tx.counts();
        assert_eq!((c.tables, c.chains, c.rules, c.sets, c.elements), (2, 4, 1, 2, 2));
        assert_eq!(tx.len(), 11);
    }
}
