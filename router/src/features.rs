//! Features of a routing request for the contextual policy: the request's `context` fields,
//! the candidate's own fields, and their interactions, hashed into a sparse vector.
//!
//! Rules (docs/ROUTER.md, "Features"):
//! - context: every field but `request_id`, `tenant` and keys ending in `_id`; strings and
//!   booleans are categorical (`key=value`, one feature of value 1, the value cut to
//!   [`MAX_VALUE_BYTES`]); numbers are numeric (`key` with value `sign(x) ln(1 + |x|)`, so
//!   sizes and counts of any scale stay comparable); objects one level deep as `key.sub`;
//!   arrays of strings as `key[]=value`; at most [`MAX_CONTEXT_FEATURES`] features;
//! - candidate: `a=<candidate_id>` (the whole id, never cut: two candidates that share a
//!   long prefix are two arms), `t=<candidate_type>`, and its metadata's scalar fields
//!   (`m.key`) except the router's own `x_weft_propensity`/`x_weft_scores`/`x_weft_excluded`,
//!   at most [`MAX_CANDIDATE_FEATURES`];
//! - the example of (context, candidate): a bias, every candidate feature, and every
//!   context feature times every candidate feature (their product).
//!
//! Hashing is FNV-1a 64 over the names, masked to [`HASH_BITS`] bits: deterministic, so a
//! model rebuilt from the logged decisions on another replica gets the same indices.

use serde_json::{Map, Value};

/// Bits of the hashed feature space (per tenant model).
pub const HASH_BITS: u32 = 20;
/// Longest string value used as a category (longer ones are cut).
pub const MAX_VALUE_BYTES: usize = 64;
/// Context features used at most per request.
pub const MAX_CONTEXT_FEATURES: usize = 64;
/// Candidate features used at most per candidate.
pub const MAX_CANDIDATE_FEATURES: usize = 16;

/// A named feature with its value, before hashing.
#[derive(Debug, Clone, PartialEq)]
pub struct Feature {
    /// Its hash (FNV-1a 64 of the name).
    pub hash: u64,
    /// Its value (1 for categories).
    pub value: f64,
}

/// A sparse hashed example: (index, value) pairs.
pub type Example = Vec<(u32, f64)>;

fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in *p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        // A separator, so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn cut(s: &str) -> &str {
    if s.len() <= MAX_VALUE_BYTES {
        return s;
    }
    let mut end = MAX_VALUE_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The numeric transform: `sign(x) ln(1 + |x|)`.
pub fn squash(x: f64) -> f64 {
    if x.is_finite() {
        x.signum() * x.abs().ln_1p()
    } else {
        0.0
    }
}

fn push_scalar(out: &mut Vec<Feature>, prefix: &[u8], key: &str, v: &Value, limit: usize) {
    if out.len() >= limit {
        return;
    }
    match v {
        Value::String(s) => out.push(Feature {
            hash: fnv(&[prefix, key.as_bytes(), b"=", cut(s).as_bytes()]),
            value: 1.0,
        }),
        Value::Bool(b) => out.push(Feature {
            hash: fnv(&[
                prefix,
                key.as_bytes(),
                b"=",
                if *b { b"true" } else { b"false" },
            ]),
            value: 1.0,
        }),
        Value::Number(n) => {
            if let Some(x) = n.as_f64() {
                out.push(Feature {
                    hash: fnv(&[prefix, key.as_bytes()]),
                    value: squash(x),
                });
            }
        }
        _ => {}
    }
}

fn skipped_context_key(k: &str) -> bool {
    k == "request_id" || k == "tenant" || k.ends_with("_id")
}

/// The context features of a request.
pub fn context_features(ctx: &Map<String, Value>) -> Vec<Feature> {
    let mut out = Vec::new();
    for (k, v) in ctx {
        if skipped_context_key(k) {
            continue;
        }
        match v {
            Value::Object(m) => {
                for (sub, v) in m {
                    let key = format!("{}.{sub}", cut(k));
                    push_scalar(&mut out, b"c:", &key, v, MAX_CONTEXT_FEATURES);
                }
            }
            Value::Array(a) => {
                for v in a.iter().filter(|v| v.is_string()).take(16) {
                    let key = format!("{}[]", cut(k));
                    push_scalar(&mut out, b"c:", &key, v, MAX_CONTEXT_FEATURES);
                }
            }
            v => push_scalar(&mut out, b"c:", cut(k), v, MAX_CONTEXT_FEATURES),
        }
    }
    out
}

const ROUTER_OWN: [&str; 3] = ["x_weft_propensity", "x_weft_scores", "x_weft_excluded"];

/// The features of one candidate.
pub fn candidate_features(
    id: &str,
    candidate_type: &str,
    meta: Option<&Map<String, Value>>,
) -> Vec<Feature> {
    let mut out = vec![
        // The whole id: cut, two ids sharing their first MAX_VALUE_BYTES would share weights.
        // (The route API bounds ids; a logged one is bounded by ingest's record size.)
        Feature {
            hash: fnv(&[b"a=", id.as_bytes()]),
            value: 1.0,
        },
        Feature {
            hash: fnv(&[b"t=", cut(candidate_type).as_bytes()]),
            value: 1.0,
        },
    ];
    for (k, v) in meta.into_iter().flatten() {
        if !ROUTER_OWN.contains(&k.as_str()) {
            push_scalar(&mut out, b"m.", cut(k), v, MAX_CANDIDATE_FEATURES);
        }
    }
    out
}

const BIAS: u64 = 0x5bd1_e995_0000_0001;

fn index(h: u64) -> u32 {
    // Fold the high bits in before masking.
    ((h ^ (h >> 32)) as u32) & ((1u32 << HASH_BITS) - 1)
}

/// The hashed example of one (context, candidate) pair: bias, candidate features, and
/// every context x candidate product.
pub fn example(ctx: &[Feature], cand: &[Feature]) -> Example {
    let mut out = Vec::with_capacity(1 + cand.len() * (1 + ctx.len()));
    out.push((index(BIAS), 1.0));
    for a in cand {
        out.push((index(a.hash), a.value));
        for c in ctx {
            let h = c.hash.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) ^ a.hash;
            out.push((index(h), c.value * a.value));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_for_strings_numbers_and_skipped_keys() {
        let ctx = json!({"tier": "gold", "tokens": 1000, "request_id": "r-1", "user_id": "u",
                         "tenant": "acme", "flags": {"beta": true}, "tags": ["a", "b"]});
        let f = context_features(ctx.as_object().unwrap());
        assert_eq!(f.len(), 5, "{f:?}");
        let tokens = f
            .iter()
            .find(|x| x.hash == fnv(&[b"c:", b"tokens"]))
            .unwrap();
        assert!((tokens.value - 1001f64.ln()).abs() < 1e-12);
        // The same request gives the same features; another value another hash.
        assert_eq!(f, context_features(ctx.as_object().unwrap()));
        let other = context_features(json!({"tier": "silver"}).as_object().unwrap());
        assert_ne!(
            other[0].hash,
            f.iter().find(|x| x.value == 1.0).unwrap().hash
        );
    }

    #[test]
    fn candidates_sharing_a_long_prefix_are_different_arms() {
        let stem = "flow:acme.pipelines.document-processing.summarization.longform-multi-";
        assert!(stem.len() >= MAX_VALUE_BYTES);
        let v1 = candidate_features(&format!("{stem}v1-citations"), "flow", None);
        let v2 = candidate_features(&format!("{stem}v2-citations"), "flow", None);
        assert_ne!(v1[0].hash, v2[0].hash, "the a= features must differ");
    }

    #[test]
    fn examples_cross_context_and_candidate() {
        let ctx = context_features(json!({"tier": "gold", "n": 3}).as_object().unwrap());
        let a = candidate_features("a", "tool", None);
        let b = candidate_features("b", "tool", None);
        let (ea, eb) = (example(&ctx, &a), example(&ctx, &b));
        assert_eq!(ea.len(), 1 + 2 * 3);
        // Shared: the bias and the type features and their crosses; not the id's.
        let shared = ea.iter().filter(|x| eb.contains(x)).count();
        assert_eq!(shared, 1 + 3);
    }

    #[test]
    fn huge_values_are_cut_and_counts_bounded() {
        let big = "x".repeat(1 << 20);
        let mut m = Map::new();
        for i in 0..500 {
            m.insert(format!("k{i}"), json!(big));
        }
        let f = context_features(&m);
        assert_eq!(f.len(), MAX_CONTEXT_FEATURES);
    }
}
