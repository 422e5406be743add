//! The weaver-spec 0.9.0 data files, embedded at build time.
//!
//! They are copied byte-exact from the spec repository (see `schemas/spec/SOURCE.txt` for the
//! commit and sha256 of each). Embedding them means the `weft` binary validates offline and
//! can never drift from the files its tests ran against.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use include_dir::{include_dir, Dir};
use serde_json::Value;

/// The contract version these files describe.
pub const SPEC_VERSION: &str = "0.9.0";

static SPEC_DIR: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/spec");

/// A spec file by its path relative to the spec root (e.g. `conformance/corpus.yaml`).
pub fn file(path: &str) -> Option<&'static [u8]> {
    SPEC_DIR.get_file(path).map(|f| f.contents())
}

/// Every JSON Schema of the spec, keyed by file stem (`trace_event`, `trace_bundle`, ...).
/// Core and Extended schemas share one namespace of stems.
pub fn schemas() -> &'static BTreeMap<String, Value> {
    static SCHEMAS: OnceLock<BTreeMap<String, Value>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut out = BTreeMap::new();
        for dir in ["contracts/json", "contracts/json/extended"] {
            let Some(d) = SPEC_DIR.get_dir(dir) else {
                continue;
            };
            for f in d.files() {
                let name = f.path().file_name().and_then(|n| n.to_str()).unwrap_or("");
                let Some(stem) = name.strip_suffix(".schema.json") else {
                    continue;
                };
                // The files are part of the build; a parse failure is a packaging bug that the
                // unit tests catch, so skipping here cannot hide a user-facing problem.
                if let Ok(v) = serde_json::from_slice(f.contents()) {
                    out.insert(stem.to_owned(), v);
                }
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn all_33_schemas_are_embedded_with_ids() {
        let s = super::schemas();
        assert_eq!(s.len(), 33, "{:?}", s.keys().collect::<Vec<_>>());
        for (stem, schema) in s {
            let id = schema["$id"].as_str().unwrap();
            assert!(
                id.ends_with(&format!("/{stem}.schema.json")),
                "{stem}: {id}"
            );
        }
    }
}
