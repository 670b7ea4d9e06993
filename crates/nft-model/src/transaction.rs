//! The operations one sync applies atomically, and their rendering as `nft -f` input.

use std::fmt::{self, Write as _};

use crate::expr::Rule;
use crate::set::{Element, SetDef};
use crate::table::{Chain, Flowtable, TableRef, device_list};

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
        /// The rule.
        rule: Rule,
        /// Its comment (`comment "…"`, kept in the kernel as the rule's userdata): kproxy puts
        /// the digest of a chain's rules on its first rule, so a restart can tell which chains
        /// already hold what it would write.
        comment: Option<String>,
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
    /// Delete the element that [`crate::Executor::element_identities`] reported as `identity`:
    /// how a restart removes what a set holds and kproxy no longer wants without flushing the
    /// set. Only an executor that reports identities can apply it (nft text has no form for it).
    DeleteElementByIdentity {
        /// Table.
        table: TableRef,
        /// Set or map.
        set: String,
        /// The identity, as the executor reported it.
        identity: Vec<u8>,
    },
    /// Create a flowtable, or register the devices an existing one lacks (Linux 5.13+).
    AddFlowtable(TableRef, Flowtable),
    /// Unregister devices from a flowtable, leaving it and its other devices in place.
    DeleteFlowtableDevices {
        /// Table.
        table: TableRef,
        /// Flowtable.
        name: String,
        /// The devices to unregister.
        devices: Vec<String>,
    },
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
    /// Flowtable operations.
    pub flowtables: usize,
}

impl std::ops::AddAssign for OpCounts {
    fn add_assign(&mut self, o: OpCounts) {
        self.tables += o.tables;
        self.chains += o.chains;
        self.rules += o.rules;
        self.sets += o.sets;
        self.elements += o.elements;
        self.flowtables += o.flowtables;
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
    pub fn add_rules<I: IntoIterator<Item = Rule>>(&mut self, table: &TableRef, chain: &str, rules: I) {
        for rule in rules {
            self.push(Op::AddRule { table: table.clone(), chain: chain.to_owned(), rule, comment: None });
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
                Op::AddElement(..) | Op::DeleteElement(..) | Op::DeleteElementByIdentity { .. } => c.elements += 1,
                Op::AddFlowtable(..) | Op::DeleteFlowtableDevices { .. } => c.flowtables += 1,
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
                let (kind, hook) = (h.kind.as_str(), h.hook.as_str());
                write!(out, " {{ type {kind} hook {hook} priority {}; policy accept; }}", h.priority)?;
            }
            Ok(())
        }
        Op::FlushChain(t, name) => write!(out, "flush chain {t} {name}"),
        Op::DeleteChain(t, name) => write!(out, "delete chain {t} {name}"),
        Op::AddRule { table, chain, rule, comment } => {
            write!(out, "add rule {table} {chain} {rule}")?;
            match comment {
                Some(c) => write!(out, " comment \"{c}\""),
                None => Ok(()),
            }
        }
        Op::AddSet(t, s) => write!(out, "add {} {t} {} {s}", s.keyword(), s.name),
        Op::FlushSet { table, name, is_map } => write!(out, "flush {} {table} {name}", set_keyword(*is_map)),
        Op::DeleteSet { table, name, is_map } => write!(out, "delete {} {table} {name}", set_keyword(*is_map)),
        Op::AddElement(t, e) => write!(out, "add element {t} {} {e}", e.set),
        Op::DeleteElement(t, e) => write!(out, "delete element {t} {} {{ {} }}", e.set, e.key),
        Op::DeleteElementByIdentity { table, set, identity } => {
            let hex: String = identity.iter().map(|b| format!("{b:02x}")).collect();
            write!(out, "# delete element {table} {set} by identity {hex} (netlink only)")
        }
        Op::AddFlowtable(t, ft) => {
            write!(out, "add flowtable {t} {} {{ hook ingress priority {};", ft.name, ft.priority)?;
            if !ft.devices.is_empty() {
                write!(out, " devices = {{ {} }};", device_list(&ft.devices))?;
            }
            if ft.counter {
                out.push_str(" counter;");
            }
            out.push_str(" }");
            Ok(())
        }
        Op::DeleteFlowtableDevices { table, name, devices } => {
            write!(out, "delete flowtable {table} {name} {{ devices = {{ {} }}; }}", device_list(devices))
        }
    }
}

fn set_keyword(is_map: bool) -> &'static str {
    if is_map { "map" } else { "set" }
}

/// Quotes a string for nft (comments); quotes inside are dropped since nft has no escape for them.
pub fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', ""))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kproxy_state::IpFamily;

    use super::*;
    use crate::Verdict;
    use crate::expr::{Field, Stmt, Value};
    use crate::set::{DataType, Key, MapData};
    use crate::table::{ChainType, HookPoint, TableFamily};

    fn t() -> TableRef {
        TableRef { family: TableFamily::Ip, name: "kproxy".into() }
    }

    #[test]
    fn renders_every_op_as_nft_commands() {
        let dest = vec![Field::Daddr(IpFamily::V4), Field::L4Proto, Field::ThDport];
        let mut tx = Transaction::new();
        tx.push(Op::AddTable { table: t(), comment: Some("rules for kproxy".into()) });
        tx.push(Op::AddChain(t(), Chain::base("nat-output", ChainType::Nat, HookPoint::Output, -100)));
        tx.push(Op::AddChain(t(), Chain::regular("services")));
        tx.add_rules(&t(), "services", [Rule::from(Stmt::vmap(dest, "service-ips"))]);
        tx.push(Op::AddSet(
            t(),
            SetDef {
                comment: Some("ClusterIP traffic".into()),
                ..SetDef::verdict_map(
                    "service-ips",
                    vec![DataType::Ipv4Addr, DataType::InetProto, DataType::InetService],
                )
            },
        ));
        let key = Key::new([
            Value::Addr("10.0.0.1".parse().unwrap()),
            Value::Proto(kproxy_state::Protocol::Tcp),
            Value::Port(80),
        ]);
        let e = Element::mapped("service-ips", key, MapData::Verdict(Verdict::Drop));
        tx.push(Op::AddElement(t(), e.clone()));
        tx.push(Op::DeleteElement(t(), e));
        tx.push(Op::FlushChain(t(), "services".into()));
        tx.push(Op::DeleteChain(t(), "services".into()));
        tx.push(Op::FlushSet { table: t(), name: "service-ips".into(), is_map: true });
        tx.push(Op::DeleteTable(t()));
        assert_eq!(
            tx.render(),
            "add table ip kproxy { comment \"rules for kproxy\"; }\n\
             add chain ip kproxy nat-output { type nat hook output priority -100; policy accept; }\n\
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
