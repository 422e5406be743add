//! Signatures: ed25519 over the RFC 8785 (JCS) canonical form of a JSON document.
//!
//! Used for TraceBundles (the spec's `signature` envelope: `{alg, kid, sig, canonicalization,
//! signed_at}`, signed over the bundle without its `signature` member) and for the hash
//! chain's checkpoints. Keys: a signing key file is JSON `{"kid": ..., "seed_b64url": ...}`
//! (the 32-byte ed25519 seed, base64url without padding); a keyring is the spec's
//! `{"keys": [{"kid", "alg": "ed25519", "public_key_b64url"}]}`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::AuditError;

/// A private signing key and its id.
#[derive(Clone)]
pub struct Key {
    /// The key id written into every signature.
    pub kid: String,
    key: SigningKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
struct KeyFile {
    kid: String,
    seed_b64url: String,
}

/// One public key of a keyring.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PublicKey {
    /// Key id that signatures name.
    pub kid: String,
    /// Signature algorithm; only `ed25519` is accepted.
    pub alg: String,
    /// The 32-byte public key, base64url without padding.
    pub public_key_b64url: String,
}

/// Public keys by id (the spec's keyring format).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Keyring {
    /// The public keys, looked up by `kid`.
    pub keys: Vec<PublicKey>,
}

impl Key {
    /// A fresh random key (for `weft audit keygen`).
    pub fn generate(kid: &str) -> Result<Self, AuditError> {
        let mut seed = [0u8; 32];
        getrandom(&mut seed)?;
        Ok(Self {
            kid: kid.to_owned(),
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// Read a key file (`{"kid", "seed_b64url"}`).
    pub fn from_json(text: &str) -> Result<Self, AuditError> {
        // The errors name where, never what: serde_json's and base64's messages quote the
        // text they could not read, which here is the secret.
        let f: KeyFile = serde_json::from_str(text).map_err(|e| {
            AuditError::Key(format!(
                "key file is not {{\"kid\", \"seed_b64url\"}} ({:?} error at line {}, column {})",
                e.classify(),
                e.line(),
                e.column()
            ))
        })?;
        let seed = B64
            .decode(f.seed_b64url.trim())
            .map_err(|_| AuditError::Key("seed_b64url is not unpadded base64url".into()))?;
        let seed: [u8; 32] = seed
            .try_into()
            .map_err(|_| AuditError::Key("seed_b64url must decode to 32 bytes".into()))?;
        Ok(Self {
            kid: f.kid,
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// The key file text (keep it secret).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&KeyFile {
            kid: self.kid.clone(),
            seed_b64url: B64.encode(self.key.to_bytes()),
        })
        .unwrap_or_default()
    }

    /// The public half, as a keyring entry.
    pub fn public(&self) -> PublicKey {
        PublicKey {
            kid: self.kid.clone(),
            alg: "ed25519".into(),
            public_key_b64url: B64.encode(self.key.verifying_key().to_bytes()),
        }
    }

    /// Sign the JCS form of `doc`; returns the base64url signature.
    pub fn sign(&self, doc: &Value) -> Result<String, AuditError> {
        let bytes = jcs(doc)?;
        Ok(B64.encode(self.key.sign(&bytes).to_bytes()))
    }
}

fn getrandom(buf: &mut [u8]) -> Result<(), AuditError> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| AuditError::Key(format!("reading /dev/urandom: {e}")))
}

/// RFC 8785 canonical bytes of a JSON value.
pub fn jcs(doc: &Value) -> Result<Vec<u8>, AuditError> {
    serde_jcs::to_vec(doc).map_err(|e| AuditError::Invalid(format!("canonicalization: {e}")))
}

impl Keyring {
    /// Parse a keyring file.
    pub fn from_json(text: &str) -> Result<Self, AuditError> {
        serde_json::from_str(text).map_err(|e| AuditError::Key(format!("keyring: {e}")))
    }

    /// A stored signature `(kid, sig)` of `doc` against `keyring`, as verify checks a
    /// checkpoint's or a retention's `pruned_before`: `Ok` when there is no keyring (nothing
    /// is checked), `unsigned` when `sig` is empty, else what [`Keyring::verify`] says.
    pub fn check(keyring: Option<&Self>, kid: &str, doc: &Value, sig: &str) -> Result<(), String> {
        match (keyring, sig.is_empty()) {
            (Some(ring), false) => ring.verify(kid, doc, sig).map_err(|e| e.to_string()),
            (Some(_), true) => Err("unsigned".to_owned()),
            (None, _) => Ok(()),
        }
    }

    /// Verify a base64url ed25519 signature by key `kid` over the JCS form of `doc`.
    pub fn verify(&self, kid: &str, doc: &Value, sig_b64: &str) -> Result<(), AuditError> {
        let pk = self.keys.iter().find(|k| k.kid == kid).ok_or_else(|| {
            AuditError::Key(format!("no key `{}` in the keyring", crate::short(kid)))
        })?;
        if pk.alg != "ed25519" {
            return Err(AuditError::Key(format!(
                "key {kid}: unsupported alg {}",
                pk.alg
            )));
        }
        let raw: [u8; 32] = B64
            .decode(pk.public_key_b64url.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                AuditError::Key(format!(
                    "key {kid}: public key is not 32 bytes of base64url"
                ))
            })?;
        let vk = VerifyingKey::from_bytes(&raw)
            .map_err(|e| AuditError::Key(format!("key {kid}: {e}")))?;
        let sig: [u8; 64] = B64
            .decode(sig_b64.trim())
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| AuditError::Invalid("signature is not 64 bytes of base64url".into()))?;
        vk.verify(&jcs(doc)?, &Signature::from_bytes(&sig))
            .map_err(|_| AuditError::Invalid(format!("signature by {kid} does not verify")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key file that does not parse is named by where it fails, never by its text: serde
    /// and base64 quote what they could not read, and a startup error reaches logs.
    #[test]
    fn a_bad_key_file_error_does_not_quote_the_secret() {
        for text in [
            r#""SECRETSEED""#,
            r#"{"kid": "k", "seed_b64url": SECRETSEED}"#,
            r#"{"kid": "k", "seed_b64url": "SECRET*SEED"}"#,
        ] {
            let Err(e) = Key::from_json(text) else {
                panic!("accepted: {text}");
            };
            assert!(!e.to_string().contains("SECRET"), "{e}");
        }
        let good = Key::generate("k").unwrap().to_json();
        assert!(Key::from_json(&good).is_ok());
    }
}
