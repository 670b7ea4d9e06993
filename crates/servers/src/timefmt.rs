//! Timestamps spelled the way kube-proxy's JSON spells them.
//!
//! kube-proxy marshals Go `time.Time` values, whose JSON form is RFC 3339 with nanoseconds and
//! trailing zeros trimmed (`2024-05-01T10:00:00.5Z`); the zero time is `0001-01-01T00:00:00Z`.
//! Health-check clients and humans compare these bodies with upstream's, so we write the same form
//! (always in UTC).

use std::time::{SystemTime, UNIX_EPOCH};

/// Go's zero `time.Time` in JSON, used when nothing has happened yet.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// Formats a time as Go's `time.Time` JSON value (without the quotes), in UTC.
pub fn rfc3339_nano(time: Option<SystemTime>) -> String {
    let Some(time) = time else { return ZERO_TIME.to_string() };
    let (secs, nanos) = match time.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(before) => {
            let d = before.duration();
            let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
            if n == 0 { (-s, 0) } else { (-s - 1, 1_000_000_000 - n) }
        }
    };
    let days = secs.div_euclid(86_400);
    let of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let mut out =
        format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", of_day / 3600, of_day / 60 % 60, of_day % 60);
    if nanos != 0 {
        let fraction = format!("{nanos:09}");
        out.push('.');
        out.push_str(fraction.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// Parses an RFC 3339 timestamp (as found in `endpoints.kubernetes.io/last-change-trigger-time`).
///
/// Accepts `Z` or a numeric offset and an optional fraction of up to nine digits.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' {
        return None;
    }
    if b[16] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let s = text.get(from..to)?;
        if !s.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut nanos: i64 = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let padded = format!("{:0<9}", &frac[..digits]);
        nanos = padded.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_secs = match rest {
        "Z" | "z" => 0,
        _ => {
            let ob = rest.as_bytes();
            if ob.len() != 6 || !matches!(ob[0], b'+' | b'-') || ob[3] != b':' {
                return None;
            }
            let hours: i64 = rest.get(1..3)?.parse().ok()?;
            let mins: i64 = rest.get(4..6)?.parse().ok()?;
            let sign = if ob[0] == b'-' { -1 } else { 1 };
            sign * (hours * 3600 + mins * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    let since_epoch = std::time::Duration::new(u64::try_from(secs).ok()?, u32::try_from(nanos).ok()?);
    UNIX_EPOCH.checked_add(since_epoch)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) to days since 1970-01-01.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_like_go_time_json() {
        assert_eq!(rfc3339_nano(None), "0001-01-01T00:00:00Z");
        assert_eq!(rfc3339_nano(Some(UNIX_EPOCH)), "1970-01-01T00:00:00Z");
        // 2024-02-29T12:34:56.5Z: leap day, trailing zeros of the fraction trimmed.
        let t = UNIX_EPOCH + Duration::new(1_709_210_096, 500_000_000);
        assert_eq!(rfc3339_nano(Some(t)), "2024-02-29T12:34:56.5Z");
        let t = UNIX_EPOCH + Duration::new(1_709_210_096, 123_456_789);
        assert_eq!(rfc3339_nano(Some(t)), "2024-02-29T12:34:56.123456789Z");
        let t = UNIX_EPOCH + Duration::new(4_102_444_799, 1_000);
        assert_eq!(rfc3339_nano(Some(t)), "2099-12-31T23:59:59.000001Z");
    }

    #[test]
    fn parses_rfc3339_round_trip_and_offsets() {
        let t = UNIX_EPOCH + Duration::new(1_709_210_096, 123_456_789);
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56.123456789Z"), Some(t));
        assert_eq!(parse_rfc3339("2024-02-29T14:34:56.123456789+02:00"), Some(t));
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56Z"), Some(UNIX_EPOCH + Duration::from_secs(1_709_210_096)));
        assert_eq!(
            parse_rfc3339("2024-02-29T12:34:56.5Z"),
            Some(UNIX_EPOCH + Duration::new(1_709_210_096, 5e8 as u32))
        );
        for bad in [
            "",
            "2024-02-29",
            "2024-13-01T00:00:00Z",
            "2024-02-29T12:34:56",
            "2024-02-29T12:34:56.Z",
            "x024-02-29T12:34:56Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad:?}");
        }
    }
}
