//! Finding the line of a field inside a document, to point an error at it.
//!
//! Objects are decoded from a `serde_json::Value`, which has no positions; the decoder only knows
//! the *path* of the bad field (`spec.ports[0].port`). To report its line we re-read the document
//! text and walk that path with a seed that ignores everything else and fails on purpose when it
//! reaches the target: the parser's error then carries the target's position. This costs a parse
//! only for objects that are already wrong.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::documents::{Document, Format};

/// One step of a path into a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    Key(String),
    Index(usize),
}

/// Renders a path the way `kubectl explain` spells fields: `spec.ports[0].port`.
pub(crate) fn display_path(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

const FOUND: &str = "kproxy-locate-found-target";

/// The file line of the node at `path` in `doc`, when it can be found.
pub(crate) fn locate(doc: &Document<'_>, path: &[Segment]) -> Option<usize> {
    let seed = PathSeed { path };
    match doc.format {
        Format::Yaml => {
            let err = serde_saphyr::with_deserializer_from_str(doc.text, |de| seed.deserialize(de)).err()?;
            if !super::documents::yaml_message(&err).contains(FOUND) {
                return None;
            }
            err.location().map(|l| doc.file_line(l.line() as usize))
        }
        Format::Json => {
            let mut de = serde_json::Deserializer::from_str(doc.text);
            let err = seed.deserialize(&mut de).err()?;
            err.to_string().contains(FOUND).then(|| doc.file_line(err.line()))
        }
    }
}

/// Walks `path`; at its end, fails with [`FOUND`].
struct PathSeed<'p> {
    path: &'p [Segment],
}

impl<'de> DeserializeSeed<'de> for PathSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        match self.path.first() {
            None => deserializer.deserialize_any(Target),
            Some(Segment::Key(_)) => deserializer.deserialize_map(self),
            Some(Segment::Index(_)) => deserializer.deserialize_seq(self),
        }
    }
}

impl<'de> Visitor<'de> for PathSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map or sequence")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some(Segment::Key(wanted)) = self.path.first() else { return Ok(()) };
        while let Some(key) = map.next_key::<Value>()? {
            // Kubernetes objects only have string keys.
            let matches = matches!(&key, Value::String(s) if s == wanted);
            if matches {
                map.next_value_seed(PathSeed { path: &self.path[1..] })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some(Segment::Index(wanted)) = self.path.first() else { return Ok(()) };
        let mut index = 0;
        loop {
            let found = if index == *wanted {
                seq.next_element_seed(PathSeed { path: &self.path[1..] })?
            } else {
                seq.next_element::<IgnoredAny>()?.map(|_| ())
            };
            if found.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }
}

/// Fails on whatever it is handed, so the parser reports the position of that node.
struct Target;

impl<'de> Visitor<'de> for Target {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(FOUND)
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::documents::parse;

    fn path(p: &[&str]) -> Vec<Segment> {
        p.iter().map(|s| s.parse().map(Segment::Index).unwrap_or_else(|_| Segment::Key((*s).into()))).collect()
    }

    #[test]
    fn finds_nested_fields_in_yaml() {
        let text = "a: 1\n---\nkind: X\nspec:\n  ports:\n  - port: 80\n  - name: b\n    port: x\n";
        let (docs, _) = parse(text, Format::Yaml);
        let doc = &docs[1].doc;
        assert_eq!(locate(doc, &path(&["spec", "ports", "1", "port"])), Some(8));
        assert_eq!(locate(doc, &path(&["spec", "ports", "1"])), Some(7));
        assert_eq!(locate(doc, &path(&["kind"])), Some(3));
        assert_eq!(locate(doc, &path(&["spec", "missing"])), None);
        assert_eq!(locate(doc, &path(&["spec", "ports", "5"])), None);
    }

    #[test]
    fn finds_nested_fields_in_json() {
        let text = "{}\n{\n \"items\": [\n  {\"a\": 1},\n  {\"a\":\n    \"x\"}\n ]\n}\n";
        let (docs, _) = parse(text, Format::Json);
        let doc = &docs[1].doc;
        assert_eq!(locate(doc, &path(&["items", "1", "a"])), Some(6));
        assert_eq!(locate(doc, &path(&["items", "0"])), Some(4));
    }

    #[test]
    fn paths_render_like_kubectl() {
        assert_eq!(display_path(&path(&["spec", "ports", "0", "port"])), "spec.ports[0].port");
        assert_eq!(display_path(&path(&["items", "2"])), "items[2]");
    }
}
