//! A trusted issuer's keys: a JWKS document (the shape of the API server's
//! `/openid/v1/jwks`) parsed into keys `ring` verifies with, and reloaded
//! when its file changes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use serde::Deserialize;

use super::b64url;

/// A key that verifies token signatures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VerifyingKey {
    /// ECDSA P-256 with SHA-256 (ES256): the uncompressed point
    /// `0x04 || x || y`.
    Es256 { point: Vec<u8> },
    /// RSASSA-PKCS1-v1_5 with SHA-256 (RS256): the modulus and exponent,
    /// big-endian without leading zeros.
    Rs256 { n: Vec<u8>, e: Vec<u8> },
}

impl VerifyingKey {
    /// The JWS `alg` this key verifies.
    pub fn alg(&self) -> &'static str {
        match self {
            Self::Es256 { .. } => "ES256",
            Self::Rs256 { .. } => "RS256",
        }
    }

    /// Whether `signature` is this key's over `message`.
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature;
        match self {
            Self::Es256 { point } => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
            Self::Rs256 { n, e } => signature::RsaPublicKeyComponents { n, e }
                .verify(&signature::RSA_PKCS1_2048_8192_SHA256, message, signature)
                .is_ok(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a JWKS document ({{\"keys\": [...]}}): {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} holds no usable key (EC P-256 or RSA, each with a kid){skipped}")]
    NoKeys { path: PathBuf, skipped: String },
}

/// An issuer's keys, by `kid`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeySet {
    keys: HashMap<String, VerifyingKey>,
}

#[derive(Deserialize)]
struct Document {
    keys: Vec<serde_json::Value>,
}

/// One JWK, with the members the store reads.
#[derive(Deserialize)]
struct Jwk {
    kty: String,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
    n: Option<String>,
    e: Option<String>,
}

impl KeySet {
    /// The usable keys of a JWKS document; the others, with why, in the
    /// second list (a key of another type is no reason to refuse the set).
    pub fn parse(json: &[u8]) -> Result<(Self, Vec<String>), serde_json::Error> {
        let document: Document = serde_json::from_slice(json)?;
        let mut keys = HashMap::new();
        let mut skipped = Vec::new();
        for (index, value) in document.keys.into_iter().enumerate() {
            match serde_json::from_value::<Jwk>(value)
                .map_err(|err| err.to_string())
                .and_then(parse_key)
            {
                Ok((kid, key)) => {
                    keys.insert(kid, key);
                }
                Err(why) => skipped.push(format!("keys[{index}]: {why}")),
            }
        }
        Ok((Self { keys }, skipped))
    }

    pub fn get(&self, kid: &str) -> Option<&VerifyingKey> {
        self.keys.get(kid)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

fn parse_key(jwk: Jwk) -> Result<(String, VerifyingKey), String> {
    let kid = jwk.kid.filter(|kid| !kid.is_empty()).ok_or("no kid")?;
    if jwk.use_.as_deref().is_some_and(|use_| use_ != "sig") {
        return Err(format!("key {kid:?} is not for signatures"));
    }
    let member = |name: &str, value: Option<String>| {
        let value = value.ok_or_else(|| format!("key {kid:?} has no {name}"))?;
        b64url(&value).map_err(|err| format!("key {kid:?}: {name} is not base64url: {err}"))
    };
    let key = match jwk.kty.as_str() {
        "EC" => {
            if jwk.crv.as_deref() != Some("P-256") {
                return Err(format!("key {kid:?} is on curve {:?}, not P-256", jwk.crv));
            }
            let (x, y) = (member("x", jwk.x)?, member("y", jwk.y)?);
            if x.len() != 32 || y.len() != 32 {
                return Err(format!("key {kid:?}: x and y must be 32 bytes each"));
            }
            let mut point = Vec::with_capacity(65);
            point.push(0x04);
            point.extend_from_slice(&x);
            point.extend_from_slice(&y);
            VerifyingKey::Es256 { point }
        }
        "RSA" => {
            let strip = |mut bytes: Vec<u8>| {
                let zeros = bytes.iter().take_while(|b| **b == 0).count();
                bytes.drain(..zeros);
                bytes
            };
            VerifyingKey::Rs256 {
                n: strip(member("n", jwk.n)?),
                e: strip(member("e", jwk.e)?),
            }
        }
        other => return Err(format!("key {kid:?} has type {other:?}, not EC or RSA")),
    };
    if let Some(alg) = jwk.alg.as_deref()
        && alg != key.alg()
    {
        return Err(format!(
            "key {kid:?} is for {alg}, but its type verifies {}",
            key.alg()
        ));
    }
    Ok((kid, key))
}

/// What tells that a file changed, without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
}

fn stamp(path: &Path) -> std::io::Result<FileStamp> {
    let meta = std::fs::metadata(path)?;
    Ok(FileStamp {
        modified: meta.modified().ok(),
        len: meta.len(),
    })
}

/// One trusted issuer: its name (the tokens' `iss`) and its keys, read
/// from a file that is read again when it changes.
#[derive(Debug)]
pub struct Issuer {
    name: String,
    path: PathBuf,
    state: RwLock<(Arc<KeySet>, Option<FileStamp>)>,
}

impl Issuer {
    /// Reads the issuer's JWKS file; fails unless it holds a usable key.
    pub fn load(name: impl Into<String>, path: impl Into<PathBuf>) -> Result<Self, JwksError> {
        let path = path.into();
        let file_stamp = stamp(&path).ok();
        let keys = read_keys(&path)?;
        Ok(Self {
            name: name.into(),
            path,
            state: RwLock::new((Arc::new(keys), file_stamp)),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn keys(&self) -> Arc<KeySet> {
        Arc::clone(&self.state.read().unwrap_or_else(PoisonError::into_inner).0)
    }

    /// Reads the file again if it changed since it was read (its time or
    /// size); whether the keys changed. A file that cannot be read or holds
    /// no usable key keeps the keys held, with a warning: tokens go on
    /// verifying through a botched rotation.
    pub fn reload_if_changed(&self) -> bool {
        let now = stamp(&self.path).ok();
        let held = self.state.read().unwrap_or_else(PoisonError::into_inner).1;
        if now.is_some() && now == held {
            return false;
        }
        match read_keys(&self.path) {
            Ok(keys) => {
                let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
                let changed = *state.0 != keys;
                if changed {
                    tracing::info!(issuer = %self.name, path = %self.path.display(), keys = keys.len(), "reloaded the issuer's keys");
                }
                *state = (Arc::new(keys), now);
                changed
            }
            Err(err) => {
                tracing::warn!(issuer = %self.name, error = %err, "cannot reload the issuer's keys; keeping those held");
                // Not again until the file changes once more.
                self.state.write().unwrap_or_else(PoisonError::into_inner).1 = now;
                false
            }
        }
    }
}

fn read_keys(path: &Path) -> Result<KeySet, JwksError> {
    let json = std::fs::read(path).map_err(|source| JwksError::Read {
        path: path.to_owned(),
        source,
    })?;
    let (keys, skipped) = KeySet::parse(&json).map_err(|source| JwksError::Json {
        path: path.to_owned(),
        source,
    })?;
    for why in &skipped {
        tracing::warn!(path = %path.display(), "skipping a JWKS key: {why}");
    }
    if keys.is_empty() {
        return Err(JwksError::NoKeys {
            path: path.to_owned(),
            skipped: if skipped.is_empty() {
                String::new()
            } else {
                format!(": {}", skipped.join("; "))
            },
        });
    }
    Ok(keys)
}
