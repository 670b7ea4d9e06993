//! Go `time.Duration` text: the only duration syntax a KubeProxyConfiguration or a kube-proxy flag uses.
//!
//! kube-proxy parses `30s`, `1m0s`, `2h22m`, `1.5h`, `500ms`, `-1s` with Go's `time.ParseDuration` and
//! writes them back with `Duration.String()` (`24h0m0s`). Neither `humantime` nor `std` speak this
//! dialect (no `1m0s`, no signed values), so it lives here. Values stay signed until validation: a
//! negative timeout must reach the validator to get the upstream message ("must be greater than or
//! equal to 0") instead of a parse error.

use std::fmt;
use std::time::Duration;

const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000 * NANOSECOND;
const MILLISECOND: u64 = 1_000 * MICROSECOND;
const SECOND: u64 = 1_000 * MILLISECOND;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// A signed duration in nanoseconds, as Go's `time.Duration`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub i64);

/// Why a duration string is not Go syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationError {
    /// The text that was rejected.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl GoDuration {
    /// The zero duration.
    pub const ZERO: GoDuration = GoDuration(0);

    /// Whole seconds, for defaults.
    pub const fn from_secs(secs: i64) -> Self {
        GoDuration(secs * SECOND as i64)
    }

    /// Parses Go's `time.ParseDuration` syntax: `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+`, or a bare `0`.
    pub fn parse(input: &str) -> Result<Self, DurationError> {
        let fail = |reason| DurationError { input: input.to_string(), reason };
        let mut s = input;
        let mut negative = false;
        if let Some(rest) = s.strip_prefix('-') {
            negative = true;
            s = rest;
        } else if let Some(rest) = s.strip_prefix('+') {
            s = rest;
        }
        if s == "0" {
            return Ok(GoDuration(0));
        }
        if s.is_empty() {
            return Err(fail("empty"));
        }
        let mut total: u64 = 0;
        while !s.is_empty() {
            let (whole, rest) = leading_int(s).ok_or_else(|| fail("number too large"))?;
            let had_whole = rest.len() != s.len();
            s = rest;
            let mut fraction = 0u64;
            let mut scale = 1f64;
            let mut had_fraction = false;
            if let Some(rest) = s.strip_prefix('.') {
                let (f, sc, rest2) = leading_fraction(rest);
                had_fraction = rest2.len() != rest.len();
                fraction = f;
                scale = sc;
                s = rest2;
            }
            if !had_whole && !had_fraction {
                return Err(fail("expected a number"));
            }
            let unit_len = s.find(|c: char| c == '.' || c.is_ascii_digit()).unwrap_or(s.len());
            if unit_len == 0 {
                return Err(fail("missing unit (use ns, us, ms, s, m or h)"));
            }
            let unit = match &s[..unit_len] {
                "ns" => NANOSECOND,
                "us" | "\u{b5}s" | "\u{3bc}s" => MICROSECOND,
                "ms" => MILLISECOND,
                "s" => SECOND,
                "m" => MINUTE,
                "h" => HOUR,
                _ => return Err(fail("unknown unit (use ns, us, ms, s, m or h)")),
            };
            s = &s[unit_len..];
            let limit = 1u64 << 63;
            if whole > limit / unit {
                return Err(fail("out of range"));
            }
            let mut value = whole * unit;
            if fraction > 0 {
                // Go computes the fractional part in float64 too; this keeps results identical.
                value = value.saturating_add((fraction as f64 * (unit as f64 / scale)) as u64);
                if value > limit {
                    return Err(fail("out of range"));
                }
            }
            total = total.saturating_add(value);
            if total > limit {
                return Err(fail("out of range"));
            }
        }
        if negative {
            // total <= 2^63, so this is at least i64::MIN.
            return Ok(GoDuration((total as i128).wrapping_neg() as i64));
        }
        i64::try_from(total).map(GoDuration).map_err(|_| fail("out of range"))
    }

    /// Whether the duration is below zero.
    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The duration as `std`'s unsigned type; `None` when negative.
    pub fn to_std(self) -> Option<Duration> {
        u64::try_from(self.0).ok().map(Duration::from_nanos)
    }

    /// Converts from `std`, saturating at Go's maximum (about 292 years).
    pub fn from_std(d: Duration) -> Self {
        GoDuration(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }
}

/// Consumes leading ASCII digits; `None` when they overflow Go's limit.
fn leading_int(s: &str) -> Option<(u64, &str)> {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut value: u64 = 0;
    for b in s[..end].bytes() {
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        if value > 1 << 63 {
            return None;
        }
    }
    Some((value, &s[end..]))
}

/// Consumes leading digits after a decimal point; digits past u64 precision are dropped, as in Go.
fn leading_fraction(s: &str) -> (u64, f64, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let mut value: u64 = 0;
    let mut scale = 1f64;
    let mut overflow = false;
    for b in s[..end].bytes() {
        if overflow {
            continue;
        }
        match value.checked_mul(10).and_then(|v| v.checked_add(u64::from(b - b'0'))) {
            Some(v) if v <= 1 << 63 => {
                value = v;
                scale *= 10.0;
            }
            _ => overflow = true,
        }
    }
    (value, scale, &s[end..])
}

/// Formats `value / 10^precision` with trailing fractional zeros dropped, like Go's `fmtFrac`+`fmtInt`.
fn write_fraction(out: &mut String, value: u64, precision: u32) {
    let divisor = 10u64.pow(precision);
    let whole = value / divisor;
    let frac = value % divisor;
    out.push_str(&whole.to_string());
    if frac != 0 {
        let digits = format!("{frac:0width$}", width = precision as usize);
        out.push('.');
        out.push_str(digits.trim_end_matches('0'));
    }
}

impl fmt::Display for GoDuration {
    /// Go's `Duration.String()`: `0s`, `500ms`, `1.5s`, `1m0s`, `24h0m0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        if self.0 < 0 {
            out.push('-');
        }
        let u = self.0.unsigned_abs();
        if u == 0 {
            return f.write_str("0s");
        }
        if u < SECOND {
            if u < MICROSECOND {
                out.push_str(&u.to_string());
                out.push_str("ns");
            } else if u < MILLISECOND {
                write_fraction(&mut out, u, 3);
                out.push_str("\u{b5}s");
            } else {
                write_fraction(&mut out, u, 6);
                out.push_str("ms");
            }
            return f.write_str(&out);
        }
        let seconds_part = u % MINUTE;
        let minutes = u / MINUTE;
        if minutes > 0 {
            let hours = minutes / 60;
            if hours > 0 {
                out.push_str(&hours.to_string());
                out.push('h');
            }
            out.push_str(&(minutes % 60).to_string());
            out.push('m');
        }
        write_fraction(&mut out, seconds_part, 9);
        out.push('s');
        f.write_str(&out)
    }
}

impl std::str::FromStr for GoDuration {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GoDuration::parse(s)
    }
}

impl serde::Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = GoDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"30s\", \"1m0s\" or \"500ms\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<GoDuration, E> {
                GoDuration::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> i64 {
        GoDuration::parse(s).unwrap().0
    }

    #[test]
    fn parses_go_syntax() {
        assert_eq!(parse("0"), 0);
        assert_eq!(parse("-0"), 0);
        assert_eq!(parse("30s"), 30 * SECOND as i64);
        assert_eq!(parse("1m0s"), 60 * SECOND as i64);
        assert_eq!(parse("2h22m"), (2 * HOUR + 22 * MINUTE) as i64);
        assert_eq!(parse("24h0m0s"), 24 * HOUR as i64);
        assert_eq!(parse("500ms"), 500 * MILLISECOND as i64);
        assert_eq!(parse("1.5h"), (HOUR + 30 * MINUTE) as i64);
        assert_eq!(parse(".5s"), 500 * MILLISECOND as i64);
        assert_eq!(parse("1.s"), SECOND as i64);
        assert_eq!(parse("-1s"), -(SECOND as i64));
        assert_eq!(parse("+2us"), 2_000);
        assert_eq!(parse("3\u{b5}s"), 3_000);
        assert_eq!(parse("3\u{3bc}s"), 3_000);
        assert_eq!(parse("1h1m1s1ms1us1ns"), (HOUR + MINUTE + SECOND + MILLISECOND + MICROSECOND + 1) as i64);
        assert_eq!(parse("9223372036854775807ns"), i64::MAX);
        assert_eq!(parse("-9223372036854775808ns"), i64::MIN);
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in
            ["", "3x", "30", "1.5", "s", ".s", "1m 0s", "-", "9223372036854775808ns", "10000000000000000h", "1e3s"]
        {
            assert!(GoDuration::parse(bad).is_err(), "{bad:?} must be rejected");
        }
        let err = GoDuration::parse("3x").unwrap_err();
        assert_eq!(err.to_string(), "invalid duration \"3x\": unknown unit (use ns, us, ms, s, m or h)");
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (0, "0s"),
            (1, "1ns"),
            (1_100, "1.1\u{b5}s"),
            (2_200_000, "2.2ms"),
            (500 * MILLISECOND as i64, "500ms"),
            (SECOND as i64, "1s"),
            (1_500 * MILLISECOND as i64, "1.5s"),
            (60 * SECOND as i64, "1m0s"),
            (90 * SECOND as i64, "1m30s"),
            (15 * MINUTE as i64, "15m0s"),
            (HOUR as i64, "1h0m0s"),
            (24 * HOUR as i64, "24h0m0s"),
            (-(SECOND as i64), "-1s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
        ];
        for (nanos, text) in cases {
            assert_eq!(GoDuration(nanos).to_string(), text);
            assert_eq!(parse(text), nanos, "round trip of {text}");
        }
    }

    #[test]
    fn converts_to_std_only_when_not_negative() {
        assert_eq!(GoDuration::from_secs(3).to_std(), Some(Duration::from_secs(3)));
        assert_eq!(GoDuration(-1).to_std(), None);
        assert_eq!(GoDuration::from_std(Duration::from_millis(1500)).to_string(), "1.5s");
    }
}
