//! The spec's convention for keys it does not define: `x_<org>_<field>`.
//!
//! The contracts allow additional properties, and the spec's own samples carry keys such as
//! `x_weaver_signature`. A top-level key that is neither a property of its kind's schema nor of
//! that shape (`x_`, an organisation of `[a-z0-9]`, `_`, a field of `[a-z0-9_]`) is
//! *nonconforming*. Every entry checks with [`nonconforming_keys`]: the gateway
//! (`weft_gateway_nonconforming_keys_total`), the Rust `Publisher` behind `weft publish`, the
//! SDK and the router (`weft_publisher_nonconforming_keys_total`), and ingest
//! (`weft_ingest_nonconforming_keys_total`) count such keys and log them; the gateway and the
//! publisher refuse them only when configured to (`refuse_nonconforming_keys`).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use crate::{spec, Kind};

/// `true` for a key of the `x_<org>_<field>` shape.
pub fn is_extension_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("x_") else {
        return false;
    };
    let Some((org, field)) = rest.split_once('_') else {
        return false;
    };
    let lower_alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !org.is_empty()
        && org.bytes().all(lower_alnum)
        && !field.is_empty()
        && field.bytes().all(|b| lower_alnum(b) || b == b'_')
}

fn properties() -> &'static BTreeMap<String, BTreeSet<String>> {
    static P: OnceLock<BTreeMap<String, BTreeSet<String>>> = OnceLock::new();
    P.get_or_init(|| {
        spec::schemas()
            .iter()
            .map(|(name, s)| {
                let props = s
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                (name.clone(), props)
            })
            .collect()
    })
}

/// The top-level keys of `payload` that its kind's schema does not define and that are not of
/// the `x_<org>_<field>` shape, in key order.
pub fn nonconforming_keys(kind: Kind, payload: &Value) -> Vec<&str> {
    match payload.as_object() {
        Some(obj) => nonconforming(kind, obj.keys().map(String::as_str)),
        None => Vec::new(),
    }
}

/// [`nonconforming_keys`] over any list of top-level keys.
pub fn nonconforming<'a>(kind: Kind, keys: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let known = properties().get(kind.schema_name());
    keys.filter(|k| !known.is_some_and(|p| p.contains(*k)) && !is_extension_key(k))
        .collect()
}

/// (kind, key) pairs a process has logged already: at most this many are remembered.
const REPORTED_MAX: usize = 1024;

/// Which nonconforming keys a process has already logged, so a stream of events with the
/// same odd key logs it once rather than per event (the count in `/metrics` is per event).
#[derive(Debug, Default)]
pub struct Reported(Mutex<HashSet<(Kind, String)>>);

impl Reported {
    /// The keys of `odd` not logged before for `kind`, now remembered as logged. Once
    /// [`REPORTED_MAX`] pairs are remembered, new ones are no longer logged.
    pub fn first_seen<'a>(&self, kind: Kind, odd: &[&'a str]) -> Vec<&'a str> {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        odd.iter()
            .copied()
            .filter(|k| {
                // Remembered by their first 128 characters: a hostile key costs little.
                let pair = (kind, k.chars().take(128).collect::<String>());
                seen.len() < REPORTED_MAX && !seen.contains(&pair) && seen.insert(pair)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape() {
        for ok in [
            "x_weaver_signature",
            "x_acme_k",
            "x_weft_context",
            "x_a1_b_c",
        ] {
            assert!(is_extension_key(ok), "{ok}");
        }
        for bad in [
            "x_",
            "x_acme",
            "x__k",
            "x_acme_",
            "X_acme_k",
            "acme_k",
            "x_Acme_k",
            "x_ac-me_k",
        ] {
            assert!(!is_extension_key(bad), "{bad}");
        }
    }

    #[test]
    fn only_unknown_nonconforming_top_level_keys() {
        let p: Value = serde_json::from_str(
            r#"{"event_id":"e","event_type":"flow_started","timestamp":"2026-01-01T00:00:00Z",
                "x_weaver_signature":{},"weaver_reserved":1,"metadata":{"anything":1},"Foo":2}"#,
        )
        .unwrap();
        assert_eq!(
            nonconforming_keys(Kind::TraceEvent, &p),
            vec!["Foo", "weaver_reserved"]
        );
    }

    #[test]
    fn each_odd_key_is_reported_once_per_kind_and_the_memory_is_bounded() {
        let r = Reported::default();
        assert_eq!(r.first_seen(Kind::Frame, &["a", "b"]), vec!["a", "b"]);
        assert_eq!(r.first_seen(Kind::Frame, &["a", "c"]), vec!["c"]);
        assert_eq!(r.first_seen(Kind::Handle, &["a"]), vec!["a"]);
        let many: Vec<String> = (0..2 * REPORTED_MAX).map(|i| format!("k{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let logged = r.first_seen(Kind::Frame, &many);
        assert_eq!(logged.len(), REPORTED_MAX - 4);
        assert!(r.first_seen(Kind::Frame, &["new"]).is_empty());
    }
}
