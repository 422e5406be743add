//! Timestamps: the spec's RFC 3339 strings, and the microseconds ClickHouse stores.

use chrono::{DateTime, SecondsFormat, Utc};

/// Parse an RFC 3339 timestamp to microseconds since the Unix epoch (UTC).
pub fn parse_micros(s: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc).timestamp_micros())
}

/// The current time as RFC 3339 with microseconds and a `Z` suffix (the spec's recommended form).
pub fn now_rfc3339() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Format microseconds since the epoch as RFC 3339 UTC.
pub fn micros_to_rfc3339(micros: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(micros)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Micros, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_normalise_to_utc() {
        let a = parse_micros("2026-03-08T06:00:05Z").unwrap();
        let b = parse_micros("2026-03-08T07:00:05+01:00").unwrap();
        assert_eq!(a, b);
        assert_eq!(micros_to_rfc3339(a), "2026-03-08T06:00:05.000000Z");
        assert!(parse_micros("2026-03-08").is_none());
    }
}
