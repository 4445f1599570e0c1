//! Signed checkpoints of an audit chain's head (hardening finding 7).
//!
//! A hash chain alone shows that records were changed, removed or reordered *within* what is
//! there; it cannot show that records were cut off the end, or that the whole chain was
//! rewritten and its hashes recomputed. A checkpoint is the chain's name, the `seq` and `hash`
//! of its head and the time, signed with Ed25519 by a key the writer holds and a verifier does
//! not need: with the public key, `stateward audit verify` checks that every checkpoint's
//! record is present with that hash (a truncated tail ends before it; a recomputed chain has
//! another hash there, and a forged checkpoint fails its signature).
//!
//! Key material: the private key is PKCS#8 (v2, as `stateward audit keygen` writes it) in
//! base64, mounted from a Secret into the operator's pod; the public key is the raw 32 bytes in
//! base64, published for whoever verifies (a ConfigMap, the release notes). A checkpoint
//! records the first 16 hex digits of the public key's SHA-256 (`key_id`), so a rotated key is
//! recognisable.

use std::path::Path;

use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair as _, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::PolicyError;

/// What is signed: a fixed prefix, so a signature can never be taken for one over anything else.
const DOMAIN: &str = "stateward-audit-checkpoint/v1";

/// One signed head of one chain, one JSON line in a checkpoint file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub chain: String,
    pub seq: u64,
    pub hash: String,
    pub time: String,
    pub key_id: String,
    /// Ed25519 signature over [`Checkpoint::message`], base64.
    pub signature: String,
}

impl Checkpoint {
    /// The bytes the signature covers.
    fn message(chain: &str, seq: u64, hash: &str, time: &str) -> String {
        format!("{DOMAIN}\n{chain}\n{seq}\n{hash}\n{time}")
    }

    /// Signs the head (`seq`, `hash`) of `chain` now.
    pub fn sign(key: &SigningKey, chain: &str, seq: u64, hash: &str) -> Checkpoint {
        let time = jiff::Timestamp::now().to_string();
        let signature = key.pair.sign(Self::message(chain, seq, hash, &time).as_bytes());
        Checkpoint {
            chain: chain.to_string(),
            seq,
            hash: hash.to_string(),
            time,
            key_id: key_id(key.pair.public_key().as_ref()),
            signature: base64::engine::general_purpose::STANDARD.encode(signature.as_ref()),
        }
    }

    /// Whether the signature is `public_key`'s over this checkpoint's fields.
    pub fn verify(&self, public_key: &[u8]) -> bool {
        let Ok(signature) = base64::engine::general_purpose::STANDARD.decode(&self.signature) else {
            return false;
        };
        let message = Self::message(&self.chain, self.seq, &self.hash, &self.time);
        UnparsedPublicKey::new(&ED25519, public_key).verify(message.as_bytes(), &signature).is_ok()
    }

    /// The checkpoint as one JSON line (no newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// `key_id` of a public key: the first 16 hex digits of its SHA-256.
pub fn key_id(public_key: &[u8]) -> String {
    hex::encode(Sha256::digest(public_key))[..16].to_string()
}

/// The writer's Ed25519 key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey").field("key_id", &key_id(self.public_key())).finish_non_exhaustive()
    }
}

impl SigningKey {
    /// A new key as base64 PKCS#8 text (what a key file holds).
    pub fn generate() -> Result<String, PolicyError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| PolicyError::WriteAudit("cannot generate a signing key".into()))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref()))
    }

    /// Reads a key from base64 PKCS#8 text.
    pub fn from_text(text: &str) -> Result<SigningKey, String> {
        let der = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| format!("not base64: {e}"))?;
        let pair = Ed25519KeyPair::from_pkcs8(&der).map_err(|e| format!("not an Ed25519 PKCS#8 key: {e}"))?;
        Ok(SigningKey { pair })
    }

    /// Reads a key file.
    pub fn from_file(path: &Path) -> Result<SigningKey, PolicyError> {
        let err = |message: String| PolicyError::OpenAudit { path: path.to_path_buf(), message };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Self::from_text(&text).map_err(err)
    }

    /// The raw 32-byte public key.
    pub fn public_key(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    /// The public key as a public key file holds it (base64).
    pub fn public_key_text(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.public_key())
    }
}

/// Reads a public key file (base64 of the raw 32 bytes).
pub fn read_public_key(path: &Path) -> Result<Vec<u8>, PolicyError> {
    let err = |message: String| PolicyError::OpenAudit { path: path.to_path_buf(), message };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let key =
        base64::engine::general_purpose::STANDARD.decode(text.trim()).map_err(|e| err(e.to_string()))?;
    if key.len() != 32 {
        return Err(err(format!("an Ed25519 public key has 32 bytes, not {}", key.len())));
    }
    Ok(key)
}

/// Field of an operator log line that carries a checkpoint (so checkpoints can be taken
/// straight from the shipped logs).
pub const LOG_FIELD: &str = "audit_checkpoint";

/// Every checkpoint in `path`: lines that are a checkpoint, or an operator log line whose
/// [`LOG_FIELD`] holds one. Other lines are skipped.
pub fn read_checkpoints(path: &Path) -> Result<Vec<Checkpoint>, PolicyError> {
    use std::io::BufRead as _;
    let file = std::fs::File::open(path)
        .map_err(|source| PolicyError::ReadAudit { path: path.to_path_buf(), source })?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|source| PolicyError::ReadAudit { path: path.to_path_buf(), source })?;
        if let Ok(c) = serde_json::from_str::<Checkpoint>(&line) {
            out.push(c);
        } else if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            let field = v.get(LOG_FIELD).or_else(|| v.pointer(&format!("/fields/{LOG_FIELD}")));
            if let Some(c) = field.and_then(|f| f.as_str()).and_then(|s| serde_json::from_str(s).ok()) {
                out.push(c);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_verifies_with_its_key_only() {
        let key = SigningKey::from_text(&SigningKey::generate().expect("key")).expect("read");
        let other = SigningKey::from_text(&SigningKey::generate().expect("key")).expect("read");
        let c = Checkpoint::sign(&key, "replica-0", 7, "ab");
        assert!(c.verify(key.public_key()));
        assert!(!c.verify(other.public_key()));
        let mut moved = c.clone();
        moved.seq = 6;
        assert!(!moved.verify(key.public_key()), "the signature covers seq");
        let mut rehashed = c.clone();
        rehashed.hash = "cd".into();
        assert!(!rehashed.verify(key.public_key()), "the signature covers hash");
        let back: Checkpoint = serde_json::from_str(&c.to_line()).expect("line");
        assert_eq!(back, c);
    }
}
