//! Sets and maps, declared with typed keys and data, and their elements.

use std::fmt;

use crate::expr::{Concat, Field, Value, Verdict};

/// An nft datatype a set is declared by name with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `ipv4_addr`
    Ipv4Addr,
    /// `ipv6_addr`
    Ipv6Addr,
    /// `inet_proto`
    InetProto,
    /// `inet_service`
    InetService,
    /// `mark`: a packet mark (map data).
    Mark,
    /// `verdict` (map data).
    Verdict,
}

impl DataType {
    /// The type's name.
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Ipv4Addr => "ipv4_addr",
            DataType::Ipv6Addr => "ipv6_addr",
            DataType::InetProto => "inet_proto",
            DataType::InetService => "inet_service",
            DataType::Mark => "mark",
            DataType::Verdict => "verdict",
        }
    }

    /// The address type of a family.
    pub fn addr(family: kproxy_state::IpFamily) -> Self {
        match family {
            kproxy_state::IpFamily::V4 => DataType::Ipv4Addr,
            kproxy_state::IpFamily::V6 => DataType::Ipv6Addr,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a set holds, declared by type names or, where a field has no fixed-size type name (a
/// `numgen` draw), by the expressions whose values it holds (`typeof`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SetType {
    /// `type K [: D]`.
    Named {
        /// Key types (several: a concatenation).
        key: Vec<DataType>,
        /// Data type, for a map.
        data: Option<DataType>,
    },
    /// `typeof K [: D]`.
    Typeof {
        /// Key expressions.
        key: Vec<Field>,
        /// Data expressions, for a map.
        data: Option<Vec<Field>>,
    },
}

/// A set flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SetFlag {
    /// `interval`: elements are ranges.
    Interval,
    /// `dynamic`: the ruleset adds elements.
    Dynamic,
    /// `timeout`: elements expire.
    Timeout,
}

impl SetFlag {
    fn as_str(self) -> &'static str {
        match self {
            SetFlag::Interval => "interval",
            SetFlag::Dynamic => "dynamic",
            SetFlag::Timeout => "timeout",
        }
    }
}

/// A set or map definition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SetDef {
    /// Name.
    pub name: String,
    /// Key and data.
    pub ty: SetType,
    /// Flags.
    pub flags: Vec<SetFlag>,
    /// Default element timeout in seconds.
    pub timeout: Option<u32>,
    /// Maximum number of elements (dynamic sets).
    pub size: Option<u32>,
    /// Comment.
    pub comment: Option<String>,
    /// Every element carries a counter of the packets and bytes that matched it (`counter;`).
    pub counter: bool,
}

impl SetDef {
    /// A set or map of `ty` with no flags, timeout, size or comment; the other fields are set
    /// with struct update syntax.
    pub fn new(name: impl Into<String>, ty: SetType) -> Self {
        SetDef { name: name.into(), ty, flags: vec![], timeout: None, size: None, comment: None, counter: false }
    }

    /// A set of keys of the given types.
    pub fn of(name: impl Into<String>, key: Vec<DataType>) -> Self {
        Self::new(name, SetType::Named { key, data: None })
    }

    /// A verdict map keyed by the given types.
    pub fn verdict_map(name: impl Into<String>, key: Vec<DataType>) -> Self {
        Self::new(name, SetType::Named { key, data: Some(DataType::Verdict) })
    }

    /// Whether this is a map.
    pub fn is_map(&self) -> bool {
        match &self.ty {
            SetType::Named { data, .. } => data.is_some(),
            SetType::Typeof { data, .. } => data.is_some(),
        }
    }

    /// Whether a flag is set.
    pub fn has(&self, flag: SetFlag) -> bool {
        self.flags.contains(&flag)
    }

    /// `set` or `map`.
    pub fn keyword(&self) -> &'static str {
        if self.is_map() { "map" } else { "set" }
    }
}

impl fmt::Display for SetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetType::Named { key, data } => {
                write!(f, "type {}", Concat(key))?;
                if let Some(d) = data {
                    write!(f, " : {d}")?;
                }
            }
            SetType::Typeof { key, data } => {
                write!(f, "typeof {}", Concat(key))?;
                if let Some(d) = data {
                    write!(f, " : {}", Concat(d))?;
                }
            }
        }
        Ok(())
    }
}

/// The body of a set declaration: `{ type ...; flags ...; ... }`.
impl fmt::Display for SetDef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{ {};", self.ty)?;
        if !self.flags.is_empty() {
            let flags: Vec<&str> = self.flags.iter().map(|fl| fl.as_str()).collect();
            write!(f, " flags {};", flags.join(","))?;
        }
        if let Some(t) = self.timeout {
            write!(f, " timeout {t}s;")?;
        }
        if let Some(size) = self.size {
            write!(f, " size {size};")?;
        }
        if self.counter {
            f.write_str(" counter;")?;
        }
        if let Some(c) = &self.comment {
            write!(f, " comment {};", crate::transaction::quote(c))?;
        }
        f.write_str(" }")
    }
}

/// A set key or map value: one value or a concatenation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(pub Vec<Value>);

impl Key {
    /// A key of these values.
    pub fn new(values: impl IntoIterator<Item = Value>) -> Self {
        Key(values.into_iter().collect())
    }

    /// The values.
    pub fn values(&self) -> &[Value] {
        &self.0
    }
}

impl From<Value> for Key {
    fn from(v: Value) -> Self {
        Key(vec![v])
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Concat(&self.0))
    }
}

/// The data of a map element.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapData {
    /// A verdict (`goto service-...`).
    Verdict(Verdict),
    /// A value (`198.18.16.10 . 8080`).
    Value(Key),
}

impl fmt::Display for MapData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapData::Verdict(v) => write!(f, "{v}"),
            MapData::Value(k) => write!(f, "{k}"),
        }
    }
}

/// The data of an element: `None` for a set.
pub type ElementData = Option<MapData>;

/// One element of a set (`value: None`) or map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    /// Set or map name.
    pub set: String,
    /// Key.
    pub key: Key,
    /// Data, for maps.
    pub value: ElementData,
}

impl Element {
    /// A set element.
    pub fn new(set: impl Into<String>, key: impl Into<Key>) -> Self {
        Element { set: set.into(), key: key.into(), value: None }
    }

    /// A map element.
    pub fn mapped(set: impl Into<String>, key: impl Into<Key>, value: MapData) -> Self {
        Element { set: set.into(), key: key.into(), value: Some(value) }
    }
}

/// `{ KEY [: DATA] }`.
impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{{ {} : {v} }}", self.key),
            None => write!(f, "{{ {} }}", self.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counted_set_declares_its_counter() {
        let counted = SetDef { counter: true, ..SetDef::of("dests", vec![DataType::Ipv4Addr]) };
        assert!(counted.to_string().contains(" counter; }"), "{counted}");
        assert!(!SetDef::of("dests", vec![DataType::Ipv4Addr]).to_string().contains("counter"));
    }
}
