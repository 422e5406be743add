//! Bearer API keys for every weft HTTP service: each key maps to exactly one tenant.
//!
//! Keys come from three places, merged (a key listed twice must name the same tenant):
//! - a `key1=tenantA,key2=tenantB` list (a flag or its environment variable, e.g.
//!   `WEFT_GATEWAY_KEYS`, `WEFT_API_KEYS`, `WEFT_ROUTER_KEYS`);
//! - a `keys = { "key1" = "tenantA" }` table in the TOML config;
//! - a keys file: one `key=tenant` per line, `#` comments.
//!
//! Only SHA-256 digests of the keys are kept, and a presented key is compared with every
//! digest in constant time (`subtle`), so neither timing nor a memory dump gives keys away.

use std::collections::BTreeMap;
use std::path::Path;

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use weft_schemas::envelope::is_valid_tenant;

/// Why a key set could not be built.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// An entry without `=`; holds where it is (`#n` in a list, `line n` in a file).
    #[error("API key entry {0} is not `key=tenant`")]
    Syntax(String),
    /// A key shorter than 16 characters or containing whitespace or `,`; holds the entry number.
    #[error("API key entry {0}: a key must be at least 16 characters, without whitespace or `,`")]
    BadKey(usize),
    /// A tenant name that is not a valid tenant id.
    #[error("API key entry {entry}: tenant `{tenant}` is not 1..=128 of [A-Za-z0-9_.-]")]
    BadTenant {
        /// The 1-based entry (list item or file line) it came from.
        entry: usize,
        /// The rejected tenant name.
        tenant: String,
    },
    /// One key mapped to two tenants: a key must scope exactly one.
    #[error("an API key is configured twice with different tenants")]
    Conflict,
    /// An error in one of the sources given to [`ApiKeys::load`], named by its origin.
    #[error("{origin}: {source}")]
    In {
        /// Where the entry came from (`WEFT_GATEWAY_KEYS / --keys`, `[gateway] keys`, ...).
        origin: String,
        /// The error in that source.
        source: Box<AuthError>,
    },
    /// The keys file could not be read.
    #[error("reading keys file {path}: {source}")]
    File {
        /// The keys file, as given.
        path: String,
        /// The read error.
        source: std::io::Error,
    },
}

/// Why a request was not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unauthorized {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A bearer key that matches no configured key.
    Invalid,
}

/// Where a service's keys come from; [`ApiKeys::load`] merges them (the one key loader).
#[derive(Debug, Clone, Copy, Default)]
pub struct KeySources<'a> {
    /// A `key1=tenantA,key2=tenantB` list (a flag or its environment variable).
    pub list: Option<&'a str>,
    /// How the list is named in errors, e.g. `WEFT_GATEWAY_KEYS / --keys`.
    pub list_origin: &'a str,
    /// A TOML `keys` table (key -> tenant), and how it is named in errors.
    pub map: Option<(&'a BTreeMap<String, String>, &'a str)>,
    /// A keys file of `key=tenant` lines.
    pub file: Option<&'a Path>,
}

/// The configured keys, as digests.
#[derive(Clone, Default)]
pub struct ApiKeys {
    entries: Vec<([u8; 32], String)>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print keys or digests.
        f.debug_struct("ApiKeys")
            .field("keys", &self.entries.len())
            .finish()
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl ApiKeys {
    /// Number of configured keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` when no key is configured (the gateway then refuses every request).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Add one key. Re-adding a key for the same tenant is a no-op.
    pub fn insert(&mut self, key: &str, tenant: &str, entry: usize) -> Result<(), AuthError> {
        // 16+ characters: short keys are guessable.
        if key.len() < 16 || key.contains(|c: char| c.is_whitespace() || c == ',') {
            return Err(AuthError::BadKey(entry));
        }
        if !is_valid_tenant(tenant) {
            return Err(AuthError::BadTenant {
                entry,
                tenant: tenant.to_owned(),
            });
        }
        let d = digest(key);
        match self.entries.iter().find(|(k, _)| *k == d) {
            Some((_, t)) if t == tenant => Ok(()),
            Some(_) => Err(AuthError::Conflict),
            None => {
                self.entries.push((d, tenant.to_owned()));
                Ok(())
            }
        }
    }

    /// Parse `key1=tenantA,key2=tenantB` (the `WEFT_GATEWAY_KEYS` form).
    pub fn add_list(&mut self, list: &str) -> Result<(), AuthError> {
        for (i, item) in list.split(',').map(str::trim).enumerate() {
            if item.is_empty() {
                continue;
            }
            let (k, t) = item
                .split_once('=')
                .ok_or_else(|| AuthError::Syntax(format!("#{}", i + 1)))?;
            self.insert(k.trim(), t.trim(), i + 1)?;
        }
        Ok(())
    }

    /// Add the `[gateway] keys` table (key -> tenant).
    pub fn add_map(&mut self, map: &BTreeMap<String, String>) -> Result<(), AuthError> {
        for (i, (k, t)) in map.iter().enumerate() {
            self.insert(k, t, i + 1)?;
        }
        Ok(())
    }

    /// Add a keys file: `key=tenant` per line; blank lines and `#` comments are ignored.
    pub fn add_file(&mut self, path: &Path) -> Result<(), AuthError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthError::File {
            path: path.display().to_string(),
            source,
        })?;
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, t) = line
                .split_once('=')
                .ok_or_else(|| AuthError::Syntax(format!("line {}", i + 1)))?;
            self.insert(k.trim(), t.trim(), i + 1)?;
        }
        Ok(())
    }

    /// The one key loader: merge a service's sources (map, then file, then list); a key
    /// named twice must name the same tenant.
    pub fn load(src: &KeySources<'_>) -> Result<Self, AuthError> {
        let within = |origin: &str| {
            let origin = origin.to_owned();
            move |e: AuthError| AuthError::In {
                origin,
                source: Box::new(e),
            }
        };
        let mut keys = Self::default();
        if let Some((map, origin)) = src.map {
            keys.add_map(map).map_err(within(origin))?;
        }
        if let Some(file) = src.file {
            keys.add_file(file)?;
        }
        if let Some(list) = src.list {
            keys.add_list(list).map_err(within(src.list_origin))?;
        }
        Ok(keys)
    }

    /// Authenticate a request from its `Authorization: Bearer KEY` header.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<&str, Unauthorized> {
        let value = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or(Unauthorized::Missing)?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or(Unauthorized::Missing)?
            .trim();
        self.tenant_for(token).ok_or(Unauthorized::Invalid)
    }

    /// The tenant of a presented key, comparing against every key in constant time.
    pub fn tenant_for(&self, presented: &str) -> Option<&str> {
        let d = digest(presented);
        let mut found = None;
        for (k, t) in &self.entries {
            if bool::from(k.ct_eq(&d)) {
                found = Some(t.as_str());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_env_list_map_and_file() {
        let mut k = ApiKeys::default();
        k.add_list(" key-a-0123456789ab=acme , key-b-0123456789ab=globex,")
            .unwrap();
        let mut m = BTreeMap::new();
        m.insert("key-c-0123456789ab".to_owned(), "initech".to_owned());
        m.insert("key-a-0123456789ab".to_owned(), "acme".to_owned());
        k.add_map(&m).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("keys");
        std::fs::write(&f, "# comment\n\nkey-d-0123456789ab = umbrella\n").unwrap();
        k.add_file(&f).unwrap();
        assert_eq!(k.len(), 4);
        assert_eq!(k.tenant_for("key-a-0123456789ab"), Some("acme"));
        assert_eq!(k.tenant_for("key-b-0123456789ab"), Some("globex"));
        assert_eq!(k.tenant_for("key-c-0123456789ab"), Some("initech"));
        assert_eq!(k.tenant_for("key-d-0123456789ab"), Some("umbrella"));
        assert_eq!(k.tenant_for("key-e-0123456789ab"), None);
        assert_eq!(k.tenant_for("key-a"), None);
        assert_eq!(k.tenant_for(""), None);
        assert!(!format!("{k:?}").contains("key-a"));
    }

    #[test]
    fn load_merges_sources_and_names_the_bad_one() {
        let mut m = BTreeMap::new();
        m.insert("key-c-0123456789ab".to_owned(), "initech".to_owned());
        let k = ApiKeys::load(&KeySources {
            list: Some("key-a-0123456789ab=acme"),
            list_origin: "WEFT_X_KEYS",
            map: Some((&m, "[x] keys")),
            file: None,
        })
        .unwrap();
        assert_eq!(k.len(), 2);
        let e = ApiKeys::load(&KeySources {
            list: Some("short=acme"),
            list_origin: "WEFT_X_KEYS",
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("WEFT_X_KEYS: "), "{e}");
    }

    #[test]
    fn rejects_bad_entries_and_conflicts() {
        let mut k = ApiKeys::default();
        assert!(matches!(k.add_list("nokey"), Err(AuthError::Syntax(_))));
        assert!(matches!(k.add_list("=acme"), Err(AuthError::BadKey(1))));
        assert!(matches!(
            k.add_list("short=acme"),
            Err(AuthError::BadKey(1))
        ));
        assert!(matches!(
            k.add_list("k-0123456789abcdef=bad tenant"),
            Err(AuthError::BadTenant { .. })
        ));
        k.add_list("k-0123456789abcdef=acme").unwrap();
        assert!(matches!(
            k.add_list("k-0123456789abcdef=globex"),
            Err(AuthError::Conflict)
        ));
    }
}
