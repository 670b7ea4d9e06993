//! The API server's rules for names (apimachinery's `IsDNS1123Label`, `IsDNS1123Subdomain`,
//! `IsDNS1035Label`, `IsValidLabelValue`), checked where objects enter the state, whatever their
//! source. The API server enforces them on what it stores, but a manifest directory has no API
//! server in front of it, and names end up in kernel rule comments and in `iptables-restore`
//! input: a name with a space, a quote or a newline must never get that far.
//!
//! Hand-written: each rule is one character class and a length, and a regex crate would add a
//! compiled automaton per rule for what fits in a few lines.

/// `IsDNS1123Label`: 1 to 63 of `[a-z0-9-]`, starting and ending with an alphanumeric.
/// Namespaces, Service and EndpointSlice port names.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 63 {
        return Err(format!("{:?} must be 1 to 63 characters", truncated(s)));
    }
    label_chars(s, |c| c.is_ascii_lowercase() || c.is_ascii_digit(), "lowercase letters, digits and '-'")
}

/// `IsDNS1035Label`: a DNS-1123 label that starts with a letter. Service names.
pub fn dns1035_label(s: &str) -> Result<(), String> {
    dns1123_label(s)?;
    if !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(format!("{:?} must start with a lowercase letter", truncated(s)));
    }
    Ok(())
}

/// `IsDNS1123Subdomain`: at most 253 characters, DNS-1123 labels joined by dots (each label
/// here may be up to 253 long, as upstream's regex allows). Node, EndpointSlice and ServiceCIDR
/// names.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err(format!("{:?} must be 1 to 253 characters", truncated(s)));
    }
    for part in s.split('.') {
        if part.is_empty() {
            return Err(format!("{:?} has an empty part between dots", truncated(s)));
        }
        label_chars(part, |c| c.is_ascii_lowercase() || c.is_ascii_digit(), "lowercase letters, digits, '-' and '.'")
            .map_err(|_| format!("{:?} must be lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit", truncated(s)))?;
    }
    Ok(())
}

/// `IsValidLabelValue`: empty, or up to 63 of `[A-Za-z0-9-_.]` starting and ending with an
/// alphanumeric. Topology zones.
pub fn label_value(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    if s.len() > 63 {
        return Err(format!("{:?} must be at most 63 characters", truncated(s)));
    }
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ends = |c: char| c.is_ascii_alphanumeric();
    let ok = s.chars().all(inner) && s.starts_with(ends) && s.ends_with(ends);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} must be letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
            truncated(s)
        ))
    }
}

/// Whether every character is `alnum` or `-`, with an `alnum` first and last.
fn label_chars(s: &str, alnum: impl Fn(char) -> bool, allowed: &str) -> Result<(), String> {
    let ok = s.chars().all(|c| alnum(c) || c == '-') && s.starts_with(&alnum) && s.ends_with(&alnum);
    if ok {
        Ok(())
    } else {
        Err(format!("{:?} must be {allowed}, starting and ending with a letter or digit", truncated(s)))
    }
}

/// At most 80 characters of `s`, for an error message (a rejected name may be huge).
fn truncated(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_api_servers_rule() {
        for ok in ["a", "web", "web-1", "0abc", &"a".repeat(63)] {
            assert!(dns1123_label(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a b", "a\nb", "a\"b", &"a".repeat(64), "ü"] {
            assert!(dns1123_label(bad).is_err(), "{bad:?}");
        }
        assert!(dns1035_label("web").is_ok());
        assert!(dns1035_label("1web").is_err(), "a Service name starts with a letter");
    }

    #[test]
    fn subdomains_are_labels_joined_by_dots() {
        for ok in ["node-a", "node-a.example.com", "a.b.c", "10.0.0.1"] {
            assert!(dns1123_subdomain(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "A.b", "a_b", "a b", &"a".repeat(254), "a\n"] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn label_values_may_be_empty_or_mixed_case_with_underscores_and_dots() {
        for ok in ["", "zone-a", "Zone_A.1", "us-east-1a"] {
            assert!(label_value(ok).is_ok(), "{ok}");
        }
        for bad in ["-a", "a-", "a b", "a/b", &"a".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_huge_name_is_shortened_in_the_message() {
        let e = dns1123_label(&"a".repeat(10_000)).unwrap_err();
        assert!(e.len() < 200, "{e}");
    }
}
