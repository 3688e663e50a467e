//! ServiceAccount tokens for tests, signed as a Kubernetes API server signs
//! them: ES256 with a P-256 key made here (as the test control plane does),
//! or RS256 with a fixed 2048-bit test key (as kind does; ring makes no RSA
//! keys). The unit tests of `auth` include this file too.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, RsaKeyPair};
use serde_json::{Value, json};

/// A throwaway RSA key (PKCS#8), for tests only.
const TEST_RSA_KEY: &str = include_str!("test-rsa-key.pem");

enum Kind {
    Ec(EcdsaKeyPair),
    Rsa(RsaKeyPair),
}

/// A key that signs tokens, named by its `kid`.
pub struct SigningKey {
    pub kid: String,
    kind: Kind,
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

impl SigningKey {
    /// A new ECDSA P-256 key (ES256).
    pub fn ec(kid: &str) -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("generate a P-256 key");
        let pair = EcdsaKeyPair::from_pkcs8(
            &signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
            &rng,
        )
        .expect("read the P-256 key");
        Self {
            kid: kid.to_owned(),
            kind: Kind::Ec(pair),
        }
    }

    /// The fixed RSA test key (RS256).
    pub fn rsa(kid: &str) -> Self {
        let der: String = TEST_RSA_KEY
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(der)
            .expect("PEM body");
        let pair = RsaKeyPair::from_pkcs8(&der).expect("read the RSA key");
        Self {
            kid: kid.to_owned(),
            kind: Kind::Rsa(pair),
        }
    }

    pub fn alg(&self) -> &'static str {
        match self.kind {
            Kind::Ec(_) => "ES256",
            Kind::Rsa(_) => "RS256",
        }
    }

    /// The public key as the API server's JWKS lists it.
    pub fn jwk(&self) -> Value {
        match &self.kind {
            Kind::Ec(pair) => {
                let point = pair.public_key().as_ref();
                json!({
                    "use": "sig", "kty": "EC", "kid": self.kid, "crv": "P-256", "alg": "ES256",
                    "x": b64(&point[1..33]), "y": b64(&point[33..65]),
                })
            }
            Kind::Rsa(pair) => {
                let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(pair.public());
                json!({
                    "use": "sig", "kty": "RSA", "kid": self.kid, "alg": "RS256",
                    "n": b64(&public.n), "e": b64(&public.e),
                })
            }
        }
    }

    /// A compact JWS of `claims` with header `header` (alg and kid added).
    pub fn sign_with_header(&self, mut header: Value, claims: &Value) -> String {
        header["alg"] = json!(self.alg());
        header["kid"] = json!(self.kid);
        let signed = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let rng = SystemRandom::new();
        let signature = match &self.kind {
            Kind::Ec(pair) => pair
                .sign(&rng, signed.as_bytes())
                .expect("sign")
                .as_ref()
                .to_vec(),
            Kind::Rsa(pair) => {
                let mut signature = vec![0; pair.public().modulus_len()];
                pair.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    signed.as_bytes(),
                    &mut signature,
                )
                .expect("sign");
                signature
            }
        };
        format!("{signed}.{}", b64(&signature))
    }

    /// A token of `claims`.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(json!({"typ": "JWT"}), claims)
    }
}

/// A JWKS document of `keys`.
pub fn jwks(keys: &[&SigningKey]) -> String {
    json!({ "keys": keys.iter().map(|key| key.jwk()).collect::<Vec<_>>() }).to_string()
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs() as i64
}

/// A bound ServiceAccount token's claims, as `kubectl create token` gets
/// them: `name` in `namespace`, for `audience`, valid from `iat` for
/// `lifetime` seconds.
pub fn claims(
    issuer: &str,
    namespace: &str,
    name: &str,
    audience: &str,
    iat: i64,
    lifetime: i64,
) -> Value {
    json!({
        "aud": [audience],
        "exp": iat + lifetime,
        "iat": iat,
        "iss": issuer,
        "jti": "0b6d3c1e-3b0a-4d8e-9f43-5f8a3e0c2b11",
        "kubernetes.io": {
            "namespace": namespace,
            "serviceaccount": { "name": name, "uid": "7d6f5c4b-1a2b-4c3d-8e9f-0a1b2c3d4e5f" },
        },
        "nbf": iat,
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
    })
}
