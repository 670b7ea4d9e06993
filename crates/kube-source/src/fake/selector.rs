//! Label and field selectors as the API server applies them (equality-based subset).

use serde_json::Value;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Exists(String),
    NotExists(String),
    Equals(String, String),
    NotEquals(String, String),
}

/// A parsed selector; all terms must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector(Vec<Term>);

impl Selector {
    /// Parses `a=b,c!=d,e,!f` (set-based `in`/`notin` are not supported).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let parsed = if let Some((key, value)) = term.split_once("!=") {
                Term::NotEquals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
                Term::Equals(key.trim().into(), value.trim().into())
            } else if let Some(key) = term.strip_prefix('!') {
                Term::NotExists(key.trim().into())
            } else {
                Term::Exists(term.into())
            };
            let key = match &parsed {
                Term::Exists(k) | Term::NotExists(k) | Term::Equals(k, _) | Term::NotEquals(k, _) => k,
            };
            if key.is_empty() || key.contains(' ') || key.contains('(') {
                return Err(format!("unable to parse requirement {term:?}"));
            }
            terms.push(parsed);
        }
        Ok(Self(terms))
    }

    /// No terms: everything matches.
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when every term holds for the fields `lookup` finds.
    pub(crate) fn matches(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|term| match term {
            Term::Exists(k) => lookup(k).is_some(),
            Term::NotExists(k) => lookup(k).is_none(),
            Term::Equals(k, v) => lookup(k).as_deref() == Some(v.as_str()),
            Term::NotEquals(k, v) => lookup(k).as_deref() != Some(v.as_str()),
        })
    }

    /// Matches against an object's labels.
    pub(crate) fn matches_labels(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        self.matches(|key| labels.and_then(|l| l.get(key)).and_then(Value::as_str).map(str::to_owned))
    }

    /// Matches against an object's fields (`metadata.name`, `metadata.namespace`).
    pub(crate) fn matches_fields(&self, object: &Value) -> bool {
        self.matches(|path| {
            let pointer = format!("/{}", path.replace('.', "/"));
            Some(object.pointer(&pointer).and_then(Value::as_str).unwrap_or_default().to_owned())
        })
    }
}

/// Everything a list or watch request filters on.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) labels: Selector,
    pub(crate) fields: Selector,
    /// From a namespaced path (`/api/v1/namespaces/<ns>/services`).
    pub(crate) namespace: Option<String>,
}

impl Filter {
    /// True when the object passes every part of the filter.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let in_namespace = self
            .namespace
            .as_deref()
            .is_none_or(|ns| object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default() == ns);
        in_namespace && self.labels.matches_labels(object) && self.fields.matches_fields(object)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn upstream_selector() {
        let s = Selector::parse("!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless").unwrap();
        assert!(s.matches_labels(&json!({"metadata": {"labels": {"app": "x"}}})));
        assert!(s.matches_labels(&json!({"metadata": {}})));
        assert!(!s.matches_labels(&json!({"metadata": {"labels": {"service.kubernetes.io/headless": ""}}})));
        assert!(!s.matches_labels(&json!({"metadata": {"labels": {"service.kubernetes.io/service-proxy-name": "o"}}})));
    }

    #[test]
    fn equality_and_fields() {
        let s = Selector::parse("a=1,b!=2,c").unwrap();
        assert!(s.matches_labels(&json!({"metadata": {"labels": {"a": "1", "c": ""}}})));
        assert!(!s.matches_labels(&json!({"metadata": {"labels": {"a": "1", "b": "2", "c": ""}}})));
        let f = Selector::parse("metadata.name=node-a").unwrap();
        assert!(f.matches_fields(&json!({"metadata": {"name": "node-a"}})));
        assert!(!f.matches_fields(&json!({"metadata": {"name": "node-b"}})));
        assert!(Selector::parse("a in (x,y)").is_err());
    }
}
