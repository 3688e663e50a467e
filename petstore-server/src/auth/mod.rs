//! Tenancy's authentication: who calls, from the Kubernetes ServiceAccount
//! token in a call's `authorization: Bearer <JWT>` metadata, verified
//! offline against the trusted issuers' keys (JWKS files), and what that
//! caller may do ([`Tenancy::access`]). A verified token is cached by its
//! exact text until it expires, so a caller's steady state costs one hash
//! lookup per call.

mod jwks;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;
use tonic::Status;
use tonic::metadata::MetadataMap;

pub use jwks::{Issuer, JwksError, KeySet, VerifyingKey};

use crate::tenancy::Access;

/// Clock skew tolerated on `exp` and `nbf`.
pub const LEEWAY_SECONDS: i64 = 30;
/// Verified tokens kept; beyond it, expired ones go, then all.
pub const MAX_CACHED_TOKENS: usize = 10_000;
/// How often the JWKS files are checked for changes (their time and size;
/// read only when changed).
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(5);
/// Longest token accepted: Kubernetes' are about 1 KB.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// The audience tokens must carry unless `--token-audience` says otherwise.
pub const DEFAULT_AUDIENCE: &str = "petstore";

/// Decodes base64url, padded or not.
pub(crate) fn b64url(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    const ENGINE: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    ENGINE.decode(text)
}

/// Why a token was refused: each is `UNAUTHENTICATED`, its message naming
/// what was wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error(
        "no token: with tenancy on, every call needs the metadata `authorization: Bearer <ServiceAccount token>`"
    )]
    Missing,
    #[error("the authorization metadata is not `Bearer <token>`")]
    NotBearer,
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("token algorithm {0:?} is not accepted: the store takes RS256 and ES256")]
    Algorithm(String),
    #[error("token issuer {0:?} is not trusted by this store")]
    UntrustedIssuer(String),
    #[error("token key {kid:?} is not one of issuer {issuer:?}'s keys")]
    UnknownKey { issuer: String, kid: String },
    #[error("token is signed {alg}, but issuer {issuer:?}'s key {kid:?} verifies {key_alg}")]
    KeyAlgorithm {
        issuer: String,
        kid: String,
        alg: String,
        key_alg: &'static str,
    },
    #[error("token signature does not verify with issuer {issuer:?}'s key {kid:?}")]
    BadSignature { issuer: String, kid: String },
    #[error("token expired at {} (now {}, leeway {LEEWAY_SECONDS} s)", time(*exp), time(*now))]
    Expired { exp: i64, now: i64 },
    #[error("token is not valid before {} (now {}, leeway {LEEWAY_SECONDS} s)", time(*nbf), time(*now))]
    NotYetValid { nbf: i64, now: i64 },
    #[error(
        "token was issued at {}, more than this store's --token-max-age of {max_age} s ago (now {})",
        time(*iat),
        time(*now)
    )]
    TooOld { iat: i64, max_age: i64, now: i64 },
    #[error("token audience is {got:?}, this store needs {want:?}")]
    Audience { got: Vec<String>, want: String },
    #[error(
        "token subject {0:?} is not a ServiceAccount's (system:serviceaccount:<namespace>:<name>)"
    )]
    Subject(String),
    #[error("token has no kubernetes.io claims: the store takes bound ServiceAccount tokens")]
    NoKubernetesClaims,
    #[error(
        "token subject {subject:?} disagrees with its kubernetes.io claims (namespace {namespace:?}, serviceaccount {name:?})"
    )]
    SubjectMismatch {
        subject: String,
        namespace: String,
        name: String,
    },
}

fn time(unix: i64) -> String {
    chrono::DateTime::from_timestamp(unix, 0).map_or_else(
        || unix.to_string(),
        |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

/// Text from a token, bounded, for a message.
fn shown(text: &str) -> String {
    text.chars().take(128).collect()
}

/// A verified caller: a ServiceAccount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// `system:serviceaccount:<namespace>:<name>`.
    pub subject: String,
    /// The ServiceAccount's namespace: the tenant.
    pub namespace: String,
    /// The ServiceAccount's name.
    pub name: String,
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct Claims {
    iss: String,
    aud: Option<Audience>,
    exp: Option<f64>,
    nbf: Option<f64>,
    iat: Option<f64>,
    sub: Option<String>,
    #[serde(rename = "kubernetes.io")]
    kubernetes: Option<KubernetesClaims>,
}

#[derive(Deserialize)]
struct KubernetesClaims {
    namespace: String,
    serviceaccount: Option<ServiceAccountClaim>,
}

#[derive(Deserialize)]
struct ServiceAccountClaim {
    name: String,
}

struct Cached {
    caller: Arc<Caller>,
    lifetime: Lifetime,
}

/// When a verified token stops being accepted.
#[derive(Clone, Copy, Debug)]
struct Lifetime {
    exp: i64,
    nbf: Option<i64>,
    /// With `--token-max-age`: when it was issued, and that age.
    issued: Option<(i64, i64)>,
}

impl Lifetime {
    fn check(&self, now: i64) -> Result<(), TokenError> {
        check_lifetime(self.exp, self.nbf, now)?;
        // No leeway: the limit is the store's own policy, on the issuer's
        // clock, and is set well above any skew.
        match self.issued {
            Some((iat, max_age)) if now > iat.saturating_add(max_age) => {
                Err(TokenError::TooOld { iat, max_age, now })
            }
            _ => Ok(()),
        }
    }
}

/// Verifies ServiceAccount tokens offline: a trusted issuer's key signed
/// it, it is within its lifetime, for this store's audience, and names one
/// ServiceAccount.
pub struct Verifier {
    issuers: HashMap<String, Issuer>,
    audience: String,
    /// Seconds after `iat` a token stops being accepted, whatever its `exp`.
    max_age: Option<i64>,
    cache: Mutex<HashMap<String, Cached>>,
    /// Monotonic milliseconds (since `started`) of the next look at the
    /// key files.
    next_reload: AtomicU64,
    started: Instant,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Verifier")
            .field("issuers", &self.issuers.keys().collect::<Vec<_>>())
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

fn unix_now() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
}

impl Verifier {
    pub fn new(issuers: Vec<Issuer>, audience: impl Into<String>) -> Self {
        Self {
            issuers: issuers
                .into_iter()
                .map(|issuer| (issuer.name().to_owned(), issuer))
                .collect(),
            audience: audience.into(),
            max_age: None,
            cache: Mutex::default(),
            next_reload: AtomicU64::new(RELOAD_INTERVAL.as_millis() as u64),
            started: Instant::now(),
        }
    }

    /// Refuses tokens issued more than `max_age` ago, however long they
    /// last: it bounds how long a leaked token can be replayed.
    #[must_use]
    pub fn with_max_age(mut self, max_age: Option<std::time::Duration>) -> Self {
        self.max_age = max_age.map(|age| i64::try_from(age.as_secs()).unwrap_or(i64::MAX).max(1));
        self
    }

    /// Verifies `token` now (the system clock).
    pub fn verify(&self, token: &str) -> Result<Arc<Caller>, TokenError> {
        self.reload_when_due();
        self.verify_at(token, unix_now())
    }

    /// Reads the issuers' key files again if they changed; forgets every
    /// cached token if a key set changed (a key may have been withdrawn).
    pub fn reload_keys(&self) {
        let mut changed = false;
        for issuer in self.issuers.values() {
            changed |= issuer.reload_if_changed();
        }
        if changed {
            self.cache().clear();
        }
    }

    /// [`Self::reload_keys`], at most once per [`RELOAD_INTERVAL`].
    fn reload_when_due(&self) {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let due = self.next_reload.load(Ordering::Relaxed);
        if now < due {
            return;
        }
        let next = now.saturating_add(RELOAD_INTERVAL.as_millis() as u64);
        // One caller reloads; the others go on with the keys held.
        if self
            .next_reload
            .compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.reload_keys();
        }
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        // Every update leaves the map whole.
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tokens cached now.
    pub fn cached(&self) -> usize {
        self.cache().len()
    }

    /// Verifies `token` at `now` (seconds since the Unix epoch).
    pub fn verify_at(&self, token: &str, now: i64) -> Result<Arc<Caller>, TokenError> {
        if let Some(cached) = self.cache().get(token) {
            cached.lifetime.check(now)?;
            return Ok(Arc::clone(&cached.caller));
        }
        let (caller, lifetime) = self.verify_uncached(token, now)?;
        let caller = Arc::new(caller);
        let mut cache = self.cache();
        if cache.len() >= MAX_CACHED_TOKENS {
            cache.retain(|_, cached| cached.lifetime.check(now).is_ok());
            if cache.len() >= MAX_CACHED_TOKENS {
                cache.clear();
            }
        }
        cache.insert(
            token.to_owned(),
            Cached {
                caller: Arc::clone(&caller),
                lifetime,
            },
        );
        Ok(caller)
    }

    fn verify_uncached(&self, token: &str, now: i64) -> Result<(Caller, Lifetime), TokenError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::Malformed(format!(
                "{} bytes, more than the {MAX_TOKEN_BYTES} accepted",
                token.len()
            )));
        }
        let mut parts = token.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed(
                "not a JWS in compact form (header.claims.signature)".into(),
            ));
        };
        let segment = |name: &str, text: &str| {
            b64url(text)
                .map_err(|err| TokenError::Malformed(format!("{name} is not base64url: {err}")))
        };
        let header: Header = serde_json::from_slice(&segment("header", header)?)
            .map_err(|err| TokenError::Malformed(format!("header: {err}")))?;
        let claims_json = segment("claims", claims)?;
        let signature = segment("signature", signature)?;
        if header.alg != "RS256" && header.alg != "ES256" {
            return Err(TokenError::Algorithm(shown(&header.alg)));
        }
        let claims: Claims = serde_json::from_slice(&claims_json)
            .map_err(|err| TokenError::Malformed(format!("claims: {err}")))?;
        let issuer = self
            .issuers
            .get(&claims.iss)
            .ok_or_else(|| TokenError::UntrustedIssuer(shown(&claims.iss)))?;
        let kid = header
            .kid
            .ok_or_else(|| TokenError::Malformed("header has no kid".into()))?;
        let keys = issuer.keys();
        let key = keys.get(&kid).ok_or_else(|| TokenError::UnknownKey {
            issuer: shown(&claims.iss),
            kid: shown(&kid),
        })?;
        if key.alg() != header.alg {
            return Err(TokenError::KeyAlgorithm {
                issuer: shown(&claims.iss),
                kid: shown(&kid),
                alg: header.alg,
                key_alg: key.alg(),
            });
        }
        // The signed text is the token up to its last (second) dot.
        let signed = token.rsplit_once('.').map_or("", |(signed, _)| signed);
        if !key.verifies(signed.as_bytes(), &signature) {
            return Err(TokenError::BadSignature {
                issuer: shown(&claims.iss),
                kid: shown(&kid),
            });
        }
        let exp = claims
            .exp
            .ok_or_else(|| TokenError::Malformed("claims have no exp".into()))?
            as i64;
        let nbf = claims.nbf.map(|nbf| nbf as i64);
        let issued = match self.max_age {
            None => None,
            Some(max_age) => {
                let iat = claims.iat.ok_or_else(|| {
                    TokenError::Malformed("claims have no iat, which --token-max-age needs".into())
                })? as i64;
                Some((iat, max_age))
            }
        };
        let lifetime = Lifetime { exp, nbf, issued };
        lifetime.check(now)?;
        let audiences = match claims.aud {
            None => Vec::new(),
            Some(Audience::One(one)) => vec![one],
            Some(Audience::Many(many)) => many,
        };
        if !audiences.contains(&self.audience) {
            return Err(TokenError::Audience {
                got: audiences.iter().map(|aud| shown(aud)).collect(),
                want: self.audience.clone(),
            });
        }
        let subject = claims.sub.unwrap_or_default();
        let Some((namespace, name)) = service_account(&subject) else {
            return Err(TokenError::Subject(shown(&subject)));
        };
        let kubernetes = claims.kubernetes.ok_or(TokenError::NoKubernetesClaims)?;
        let claimed_name = kubernetes.serviceaccount.map(|sa| sa.name);
        if kubernetes.namespace != namespace || claimed_name.as_deref().is_some_and(|n| n != name) {
            return Err(TokenError::SubjectMismatch {
                subject: shown(&subject),
                namespace: shown(&kubernetes.namespace),
                name: shown(claimed_name.as_deref().unwrap_or_default()),
            });
        }
        let caller = Caller {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            subject,
        };
        Ok((caller, lifetime))
    }
}

/// The namespace and name of a ServiceAccount principal,
/// `system:serviceaccount:<namespace>:<name>`; `None` for anything else.
fn service_account(principal: &str) -> Option<(&str, &str)> {
    principal
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'))
}

/// Who a client certificate says it is: its subject's Common Name, read as
/// Kubernetes reads a client certificate's CN, as a user name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertificateIdentity {
    /// A ServiceAccount principal, `system:serviceaccount:<namespace>:<name>`.
    Principal(String),
    /// A Common Name that is not a principal (`petstore-operator`, as
    /// certificates made before tenancy used).
    NotAPrincipal(String),
    /// No single readable Common Name (none, several, or not a string), or
    /// no certificate at all.
    Unnamed,
}

impl CertificateIdentity {
    /// Reads the Common Name of a DER certificate (the chain's first, the
    /// client's own). The handshake has already verified it against the
    /// client CA; this only reads its subject.
    pub fn from_der(der: &[u8]) -> Self {
        use x509_parser::prelude::FromDer as _;
        let Ok((_, certificate)) = x509_parser::certificate::X509Certificate::from_der(der) else {
            return Self::Unnamed;
        };
        let mut names = certificate.subject().iter_common_name();
        // Two CNs would leave the name to whichever a reader takes: none.
        let (Some(name), None) = (names.next(), names.next()) else {
            return Self::Unnamed;
        };
        match name.as_str() {
            Ok(name) if service_account(name).is_some() => Self::Principal(name.to_owned()),
            Ok(name) => Self::NotAPrincipal(shown(name)),
            Err(_) => Self::Unnamed,
        }
    }
}

impl std::fmt::Display for CertificateIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Principal(principal) => write!(f, "client certificate {principal:?}"),
            Self::NotAPrincipal(name) => write!(
                f,
                "client certificate {name:?}, which names no ServiceAccount (its CN is not system:serviceaccount:<namespace>:<name>),"
            ),
            Self::Unnamed => write!(f, "a client certificate without one Common Name"),
        }
    }
}

/// The rule that binds a token to the client certificate it came with: a
/// certificate carries its own ServiceAccount's token (a tenant calling as
/// itself), or, if it is one of the store's `observers`, any token (the
/// operator reads its feeds as itself, and writes each namespace's records
/// as that namespace's deputy). A certificate that names no ServiceAccount
/// carries no one's token.
pub fn certificate_may_carry(
    certificate: &CertificateIdentity,
    caller: &Caller,
    observers: &HashSet<String>,
) -> Result<(), Refusal> {
    match certificate {
        CertificateIdentity::Principal(principal)
            if *principal == caller.subject || observers.contains(principal) =>
        {
            Ok(())
        }
        _ => Err(Refusal::CertificateMismatch {
            certificate: certificate.clone(),
            subject: caller.subject.clone(),
        }),
    }
}

fn check_lifetime(exp: i64, nbf: Option<i64>, now: i64) -> Result<(), TokenError> {
    if now > exp.saturating_add(LEEWAY_SECONDS) {
        return Err(TokenError::Expired { exp, now });
    }
    if let Some(nbf) = nbf
        && now.saturating_add(LEEWAY_SECONDS) < nbf
    {
        return Err(TokenError::NotYetValid { nbf, now });
    }
    Ok(())
}

/// A trusted issuer and its JWKS file, as `--token-issuer ISSUER=FILE` names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedIssuer {
    pub issuer: String,
    pub jwks: PathBuf,
}

impl std::str::FromStr for TrustedIssuer {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // An OIDC issuer has no query, so no `=`: the first one splits.
        match text.split_once('=') {
            Some((issuer, jwks)) if !issuer.is_empty() && !jwks.is_empty() => Ok(Self {
                issuer: issuer.to_owned(),
                jwks: jwks.into(),
            }),
            _ => Err(format!(
                "{text:?} is not <ISSUER>=<JWKS_FILE>, e.g. https://kubernetes.default.svc.cluster.local=/etc/petstore/jwks.json"
            )),
        }
    }
}

/// What turns tenancy on, as the flags say.
#[derive(Clone, Debug, Default)]
pub struct TenancyOptions {
    pub issuers: Vec<TrustedIssuer>,
    pub audience: String,
    /// Subjects (`system:serviceaccount:NS:NAME`) that read every tenant's
    /// records and write none.
    pub observers: Vec<String>,
    /// The namespaces that may use the store; empty: any.
    pub tenant_namespaces: Vec<String>,
    /// Accept tokens over plaintext connections (local development).
    pub allow_plaintext_tokens: bool,
    /// Refuse tokens issued longer ago than this, whatever their `exp`.
    pub token_max_age: Option<std::time::Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum TenancyError {
    #[error("tenancy needs at least one --token-issuer <ISSUER>=<JWKS_FILE>")]
    NoIssuer,
    #[error("issuer {issuer:?}: {source}")]
    Jwks {
        issuer: String,
        #[source]
        source: JwksError,
    },
    #[error("--observer {0:?} is not system:serviceaccount:<namespace>:<name>")]
    Observer(String),
    #[error("--token-audience must not be empty")]
    Audience,
}

/// Why a call was refused before it reached storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `UNAUTHENTICATED`.
    Unauthenticated(TokenError),
    /// `PERMISSION_DENIED`: the caller's namespace is not among
    /// `--tenant-namespaces`.
    NamespaceNotAllowed { namespace: String },
    /// `PERMISSION_DENIED`: a call only observers make.
    ObserverOnly {
        namespace: String,
        what: &'static str,
    },
    /// `PERMISSION_DENIED`: the client certificate may not carry this token
    /// ([`certificate_may_carry`]).
    CertificateMismatch {
        certificate: CertificateIdentity,
        /// The token's subject.
        subject: String,
    },
}

impl Refusal {
    /// The `reason` label of `petstore_server_tenant_refusals_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unauthenticated(_) => "unauthenticated",
            Self::NamespaceNotAllowed { .. } => "namespace_not_allowed",
            Self::ObserverOnly { .. } => "observer_only",
            Self::CertificateMismatch { .. } => "certificate_mismatch",
        }
    }

    pub fn status(&self) -> Status {
        match self {
            Self::Unauthenticated(err) => Status::unauthenticated(err.to_string()),
            Self::NamespaceNotAllowed { namespace } => Status::permission_denied(format!(
                "tenant {namespace:?} may not use this store: its namespace is not one of --tenant-namespaces"
            )),
            Self::ObserverOnly { namespace, what } => Status::permission_denied(format!(
                "tenant {namespace:?} may not {what}: only observers may"
            )),
            Self::CertificateMismatch {
                certificate,
                subject,
            } => Status::permission_denied(format!(
                "{certificate} may not carry the token of {subject:?}: a token is accepted with a client certificate whose CN is its own ServiceAccount ({subject:?}) or one of this store's --observer accounts"
            )),
        }
    }
}

/// Tenancy: the verifier and who may do what.
#[derive(Debug)]
pub struct Tenancy {
    verifier: Verifier,
    observers: HashSet<String>,
    namespaces: Option<HashSet<String>>,
    allow_plaintext_tokens: bool,
}

impl Tenancy {
    /// Reads every issuer's keys; fails on a missing or unusable file.
    pub fn new(options: TenancyOptions) -> Result<Self, TenancyError> {
        if options.issuers.is_empty() {
            return Err(TenancyError::NoIssuer);
        }
        if options.audience.is_empty() {
            return Err(TenancyError::Audience);
        }
        let mut issuers = Vec::with_capacity(options.issuers.len());
        for trusted in options.issuers {
            let issuer = Issuer::load(&trusted.issuer, &trusted.jwks).map_err(|source| {
                TenancyError::Jwks {
                    issuer: trusted.issuer.clone(),
                    source,
                }
            })?;
            issuers.push(issuer);
        }
        for observer in &options.observers {
            let parts: Vec<&str> = observer.split(':').collect();
            if !matches!(parts.as_slice(), ["system", "serviceaccount", ns, name] if !ns.is_empty() && !name.is_empty())
            {
                return Err(TenancyError::Observer(observer.clone()));
            }
        }
        let namespaces: HashSet<String> = options
            .tenant_namespaces
            .into_iter()
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty())
            .collect();
        Ok(Self {
            verifier: Verifier::new(issuers, options.audience).with_max_age(options.token_max_age),
            observers: options.observers.into_iter().collect(),
            namespaces: (!namespaces.is_empty()).then_some(namespaces),
            allow_plaintext_tokens: options.allow_plaintext_tokens,
        })
    }

    pub fn verifier(&self) -> &Verifier {
        &self.verifier
    }

    pub fn allows_plaintext_tokens(&self) -> bool {
        self.allow_plaintext_tokens
    }

    /// Who a call acts for, from its metadata: an observer, or the tenant
    /// its token's namespace names. With client certificates (`certificate`
    /// is the one the call came with), the token must be one the
    /// certificate may carry ([`certificate_may_carry`]); without (no client
    /// CA), the token alone decides.
    pub fn access(
        &self,
        metadata: &MetadataMap,
        certificate: Option<&CertificateIdentity>,
    ) -> Result<Access, Refusal> {
        let caller = self.caller(metadata).map_err(Refusal::Unauthenticated)?;
        if let Some(certificate) = certificate {
            certificate_may_carry(certificate, &caller, &self.observers)?;
        }
        if self.observers.contains(&caller.subject) {
            return Ok(Access::Observer);
        }
        if let Some(namespaces) = &self.namespaces
            && !namespaces.contains(&caller.namespace)
        {
            return Err(Refusal::NamespaceNotAllowed {
                namespace: caller.namespace.clone(),
            });
        }
        Ok(Access::Tenant(caller.namespace.clone()))
    }

    fn caller(&self, metadata: &MetadataMap) -> Result<Arc<Caller>, TokenError> {
        let value = metadata.get("authorization").ok_or(TokenError::Missing)?;
        let value = value.to_str().map_err(|_| TokenError::NotBearer)?.trim();
        let token = match value.split_once(' ') {
            Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
            _ => return Err(TokenError::NotBearer),
        };
        if token.is_empty() {
            return Err(TokenError::Missing);
        }
        self.verifier.verify(token)
    }
}

#[cfg(test)]
#[path = "../../tests/support/tokens.rs"]
#[allow(dead_code)]
mod tokens;

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use serde_json::json;

    use super::tokens::{SigningKey, claims, jwks};
    use super::*;

    const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
    const NOW: i64 = 1_750_000_000;

    /// A verifier trusting `ISSUER` with `keys`, and the file it reads.
    fn verifier(keys: &[&SigningKey]) -> (Verifier, tempfile::NamedTempFile) {
        let mut file = tempfile::NamedTempFile::new().expect("jwks file");
        file.write_all(jwks(keys).as_bytes()).expect("write jwks");
        let issuer = Issuer::load(ISSUER, file.path()).expect("load jwks");
        (Verifier::new(vec![issuer], DEFAULT_AUDIENCE), file)
    }

    fn good(key: &SigningKey) -> String {
        key.sign(&claims(
            ISSUER,
            "team-a",
            "petstore-operator",
            "petstore",
            NOW - 60,
            600,
        ))
    }

    #[test]
    fn a_good_es256_token_names_its_service_account() {
        let key = SigningKey::ec("ec-1");
        let (verifier, _file) = verifier(&[&key]);
        let caller = verifier.verify_at(&good(&key), NOW).expect("verifies");
        assert_eq!(
            *caller,
            Caller {
                subject: "system:serviceaccount:team-a:petstore-operator".into(),
                namespace: "team-a".into(),
                name: "petstore-operator".into(),
            }
        );
    }

    #[test]
    fn a_good_rs256_token_verifies_and_a_string_audience_counts() {
        let key = SigningKey::rsa("rsa-1");
        let ec = SigningKey::ec("ec-1");
        let (verifier, _file) = verifier(&[&ec, &key]);
        assert_eq!(
            verifier
                .verify_at(&good(&key), NOW)
                .expect("RS256")
                .namespace,
            "team-a"
        );
        let mut one_audience = claims(ISSUER, "team-b", "x", "petstore", NOW, 600);
        one_audience["aud"] = json!("petstore");
        assert_eq!(
            verifier
                .verify_at(&key.sign(&one_audience), NOW)
                .expect("aud as a string")
                .namespace,
            "team-b"
        );
    }

    #[test]
    fn each_failure_is_named() {
        let key = SigningKey::ec("ec-1");
        let rsa = SigningKey::rsa("rsa-1");
        let (verifier, _file) = verifier(&[&key, &rsa]);
        let refused = |token: &str| verifier.verify_at(token, NOW).expect_err(token);
        let with = |edit: &dyn Fn(&mut serde_json::Value)| {
            let mut c = claims(ISSUER, "team-a", "sa", "petstore", NOW - 60, 600);
            edit(&mut c);
            key.sign(&c)
        };

        assert!(matches!(refused("not-a-token"), TokenError::Malformed(_)));
        assert!(matches!(refused("a.b.c.d"), TokenError::Malformed(_)));
        assert!(matches!(refused("!!.e30.AA"), TokenError::Malformed(_)));
        let token = good(&key);
        let (signed, _) = token.rsplit_once('.').expect("three parts");
        assert!(matches!(
            refused(&format!("{signed}.")),
            TokenError::BadSignature { .. }
        ));
        // Claims swapped under a valid signature.
        let other = with(&|c| c["sub"] = json!("system:serviceaccount:team-b:sa"));
        let forged = format!(
            "{}.{}.{}",
            token.split('.').next().expect("header"),
            other.split('.').nth(1).expect("claims"),
            token.rsplit('.').next().expect("signature")
        );
        assert_eq!(
            refused(&forged),
            TokenError::BadSignature {
                issuer: ISSUER.into(),
                kid: "ec-1".into()
            }
        );
        for alg in ["none", "HS256", "ES384"] {
            let header = json!({"alg": alg, "kid": "ec-1"}).to_string();
            let body = claims(ISSUER, "team-a", "sa", "petstore", NOW, 600).to_string();
            let b64 = |text: &str| {
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text.as_bytes())
            };
            let unsigned = format!("{}.{}.", b64(&header), b64(&body));
            assert_eq!(refused(&unsigned), TokenError::Algorithm(alg.into()));
        }
        assert_eq!(
            refused(&with(&|c| c["iss"] = json!("https://elsewhere"))),
            TokenError::UntrustedIssuer("https://elsewhere".into())
        );
        // Another key with the same issuer: one it does not list...
        let stranger = SigningKey::ec("ec-2");
        assert_eq!(
            refused(&good(&stranger)),
            TokenError::UnknownKey {
                issuer: ISSUER.into(),
                kid: "ec-2".into()
            }
        );
        // ...or one that claims a listed kid.
        let impostor = SigningKey::ec("ec-1");
        assert!(matches!(
            refused(&good(&impostor)),
            TokenError::BadSignature { .. }
        ));
        // RS256 under an EC key's kid.
        let mislabelled = SigningKey::rsa("ec-1");
        assert!(matches!(
            refused(&good(&mislabelled)),
            TokenError::KeyAlgorithm { .. }
        ));
        let wrong_audience = refused(&with(&|c| c["aud"] = json!(["other"])));
        assert_eq!(
            wrong_audience.to_string(),
            "token audience is [\"other\"], this store needs \"petstore\""
        );
        assert!(matches!(
            refused(&with(&|c| {
                c.as_object_mut().expect("claims").remove("aud");
            })),
            TokenError::Audience { .. }
        ));
        assert!(matches!(
            refused(&with(&|c| c["exp"] = json!(NOW - 31))),
            TokenError::Expired { .. }
        ));
        assert!(matches!(
            refused(&with(&|c| c["nbf"] = json!(NOW + 31))),
            TokenError::NotYetValid { .. }
        ));
        assert!(matches!(
            refused(&with(&|c| {
                c.as_object_mut().expect("claims").remove("exp");
            })),
            TokenError::Malformed(_)
        ));
        assert!(matches!(
            refused(&with(&|c| c["sub"] = json!("alice"))),
            TokenError::Subject(_)
        ));
        assert!(matches!(
            refused(&with(&|c| c["kubernetes.io"]["namespace"] = json!("team-b"))),
            TokenError::SubjectMismatch { .. }
        ));
        assert!(matches!(
            refused(&with(
                &|c| c["kubernetes.io"]["serviceaccount"]["name"] = json!("other")
            )),
            TokenError::SubjectMismatch { .. }
        ));
        assert_eq!(
            refused(&with(&|c| {
                c.as_object_mut().expect("claims").remove("kubernetes.io");
            })),
            TokenError::NoKubernetesClaims
        );
        assert_eq!(verifier.cached(), 0, "refusals are not cached");
    }

    #[test]
    fn exp_and_nbf_have_thirty_seconds_of_leeway() {
        let key = SigningKey::ec("ec-1");
        let (verifier, _file) = verifier(&[&key]);
        // Valid from NOW to NOW + 60.
        let token = key.sign(&claims(ISSUER, "team-a", "sa", "petstore", NOW, 60));
        assert!(verifier.verify_at(&token, NOW - 30).is_ok(), "30 s early");
        assert!(verifier.verify_at(&token, NOW + 90).is_ok(), "30 s late");
        let (fresh, _file) = verifier_pair(&key);
        assert!(matches!(
            fresh.verify_at(&token, NOW - 31),
            Err(TokenError::NotYetValid { .. })
        ));
        let (fresh, _file) = verifier_pair(&key);
        let expired = fresh.verify_at(&token, NOW + 91).expect_err("expired");
        assert!(matches!(expired, TokenError::Expired { .. }));
        assert!(
            expired
                .to_string()
                .starts_with("token expired at 2025-06-15T"),
            "{expired}"
        );
    }

    fn verifier_pair(key: &SigningKey) -> (Verifier, tempfile::NamedTempFile) {
        verifier(&[key])
    }

    #[test]
    fn a_cached_token_still_expires() {
        let key = SigningKey::ec("ec-1");
        let (verifier, _file) = verifier(&[&key]);
        let token = key.sign(&claims(ISSUER, "team-a", "sa", "petstore", NOW, 60));
        let first = verifier.verify_at(&token, NOW).expect("verifies");
        assert_eq!(verifier.cached(), 1);
        let again = verifier.verify_at(&token, NOW + 1).expect("from the cache");
        assert!(Arc::ptr_eq(&first, &again), "the cached caller");
        assert_eq!(verifier.cached(), 1);
        assert!(matches!(
            verifier.verify_at(&token, NOW + 91),
            Err(TokenError::Expired { .. })
        ));
        assert!(matches!(
            verifier.verify_at(&token, NOW - 31),
            Err(TokenError::NotYetValid { .. })
        ));
    }

    #[test]
    fn a_max_age_refuses_old_tokens_however_long_they_last_cached_or_not() {
        let key = SigningKey::ec("ec-1");
        let (verifier, _file) = verifier(&[&key]);
        let verifier = verifier.with_max_age(Some(std::time::Duration::from_secs(5)));
        let token = key.sign(&claims(ISSUER, "team-a", "sa", "petstore", NOW, 600));
        verifier
            .verify_at(&token, NOW + 5)
            .expect("5 s old: accepted");
        let refused = verifier
            .verify_at(&token, NOW + 6)
            .expect_err("cached, 6 s old");
        assert!(
            matches!(
                refused,
                TokenError::TooOld {
                    iat: NOW,
                    max_age: 5,
                    ..
                }
            ),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("--token-max-age of 5 s"),
            "{refused}"
        );
        // Verified afresh (not from the cache), the same.
        let other = key.sign(&claims(ISSUER, "team-b", "sa", "petstore", NOW, 600));
        assert!(matches!(
            verifier.verify_at(&other, NOW + 6),
            Err(TokenError::TooOld { .. })
        ));
        // A token without iat cannot be judged: refused, saying why.
        let mut no_iat = claims(ISSUER, "team-a", "sa", "petstore", NOW, 600);
        no_iat.as_object_mut().expect("claims").remove("iat");
        let refused = verifier
            .verify_at(&key.sign(&no_iat), NOW)
            .expect_err("no iat");
        assert!(refused.to_string().contains("no iat"), "{refused}");
        // Without a max age, the same old token is fine until its exp.
        let (plain, _file) = verifier_pair(&key);
        plain.verify_at(&token, NOW + 500).expect("no max age");
    }

    #[test]
    fn the_cache_is_bounded() {
        let key = SigningKey::ec("ec-1");
        let (verifier, _file) = verifier(&[&key]);
        // Short-lived tokens first, expired by the time the cache fills.
        let short = key.sign(&claims(ISSUER, "team-a", "short", "petstore", NOW, 10));
        verifier.verify_at(&short, NOW).expect("verifies");
        let mut cache = verifier.cache();
        for n in 1..MAX_CACHED_TOKENS {
            cache.insert(
                format!("token-{n}"),
                Cached {
                    caller: Arc::new(Caller {
                        subject: String::new(),
                        namespace: String::new(),
                        name: String::new(),
                    }),
                    lifetime: Lifetime {
                        exp: NOW + 3600,
                        nbf: None,
                        issued: None,
                    },
                },
            );
        }
        drop(cache);
        assert_eq!(verifier.cached(), MAX_CACHED_TOKENS);
        // Full: the expired one goes to make room.
        let late = NOW + 100;
        let token = key.sign(&claims(ISSUER, "team-a", "sa", "petstore", late, 600));
        verifier.verify_at(&token, late).expect("verifies");
        assert_eq!(verifier.cached(), MAX_CACHED_TOKENS);
        assert!(!verifier.cache().contains_key(&short));
        // Full of live tokens: all go.
        let other = key.sign(&claims(ISSUER, "team-b", "sa", "petstore", late, 600));
        verifier.verify_at(&other, late).expect("verifies");
        assert_eq!(verifier.cached(), 1);
    }

    #[test]
    fn a_changed_key_file_is_read_again_and_forgets_cached_tokens() {
        let old = SigningKey::ec("old");
        let new = SigningKey::ec("new");
        let (verifier, file) = verifier(&[&old]);
        let old_token = good(&old);
        verifier.verify_at(&old_token, NOW).expect("old key");
        assert!(matches!(
            verifier.verify_at(&good(&new), NOW),
            Err(TokenError::UnknownKey { .. })
        ));
        // Unchanged: nothing is read, the cache stays.
        verifier.reload_keys();
        assert_eq!(verifier.cached(), 1);
        // Rotated: the new key verifies, the withdrawn one no longer does.
        std::fs::write(file.path(), jwks(&[&new])).expect("rotate");
        verifier.reload_keys();
        assert_eq!(verifier.cached(), 0);
        verifier.verify_at(&good(&new), NOW).expect("new key");
        assert!(matches!(
            verifier.verify_at(&old_token, NOW),
            Err(TokenError::UnknownKey { .. })
        ));
        // A broken file keeps the keys held.
        std::fs::write(file.path(), "{not json").expect("break");
        verifier.reload_keys();
        verifier
            .verify_at(&good(&new), NOW + 1)
            .expect("still the new key");
    }

    #[test]
    fn jwks_documents_parse_as_the_api_server_serves_them() {
        // The shape of /openid/v1/jwks, with a key of a type the store
        // does not take, skipped.
        let ec = SigningKey::ec("ec-1");
        let rsa = SigningKey::rsa("rsa-1");
        let document = json!({"keys": [ec.jwk(), rsa.jwk(), {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "AA"}]});
        let (keys, skipped) = KeySet::parse(document.to_string().as_bytes()).expect("parses");
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.get("ec-1").map(VerifyingKey::alg), Some("ES256"));
        assert_eq!(keys.get("rsa-1").map(VerifyingKey::alg), Some("RS256"));
        assert_eq!(skipped.len(), 1, "{skipped:?}");
        let mut bad = ec.jwk();
        bad["crv"] = json!("P-384");
        let (keys, _) =
            KeySet::parse(json!({"keys": [bad]}).to_string().as_bytes()).expect("parses");
        assert!(keys.is_empty());
        assert!(KeySet::parse(b"[]").is_err());
        // A file without a usable key is refused at start.
        let mut file = tempfile::NamedTempFile::new().expect("file");
        file.write_all(b"{\"keys\": []}").expect("write");
        assert!(matches!(
            Issuer::load(ISSUER, file.path()),
            Err(JwksError::NoKeys { .. })
        ));
    }

    #[test]
    fn tenancy_maps_metadata_to_access() {
        let key = SigningKey::ec("ec-1");
        let mut file = tempfile::NamedTempFile::new().expect("jwks file");
        file.write_all(jwks(&[&key]).as_bytes()).expect("write");
        let tenancy = Tenancy::new(TenancyOptions {
            issuers: vec![TrustedIssuer {
                issuer: ISSUER.into(),
                jwks: file.path().to_owned(),
            }],
            audience: DEFAULT_AUDIENCE.into(),
            observers: vec!["system:serviceaccount:monitoring:reader".into()],
            tenant_namespaces: vec!["team-a".into(), "monitoring".into()],
            allow_plaintext_tokens: false,
            token_max_age: None,
        })
        .expect("tenancy");
        let now = super::unix_now();
        let metadata = |value: Option<String>| {
            let mut map = MetadataMap::new();
            if let Some(value) = value {
                map.insert("authorization", value.parse().expect("ascii"));
            }
            map
        };
        let token =
            |ns: &str, name: &str| key.sign(&claims(ISSUER, ns, name, "petstore", now, 600));
        // Without client certificates: the token alone decides.
        let access = |metadata: &MetadataMap| tenancy.access(metadata, None);
        assert_eq!(
            access(&metadata(Some(format!("Bearer {}", token("team-a", "op"))))),
            Ok(Access::Tenant("team-a".into()))
        );
        assert_eq!(
            access(&metadata(Some(format!(
                "bearer {}",
                token("monitoring", "reader")
            )))),
            Ok(Access::Observer)
        );
        assert_eq!(
            access(&metadata(Some(format!("Bearer {}", token("team-b", "op"))))),
            Err(Refusal::NamespaceNotAllowed {
                namespace: "team-b".into()
            })
        );
        assert_eq!(
            access(&metadata(None)),
            Err(Refusal::Unauthenticated(TokenError::Missing))
        );
        assert_eq!(
            access(&metadata(Some(format!("Basic {}", token("team-a", "op"))))),
            Err(Refusal::Unauthenticated(TokenError::NotBearer))
        );
        assert!(matches!(
            Tenancy::new(TenancyOptions {
                observers: vec!["monitoring:reader".into()],
                ..TenancyOptions {
                    issuers: vec![TrustedIssuer {
                        issuer: ISSUER.into(),
                        jwks: file.path().to_owned(),
                    }],
                    audience: "petstore".into(),
                    ..Default::default()
                }
            }),
            Err(TenancyError::Observer(_))
        ));
        assert!(matches!(
            Tenancy::new(TenancyOptions {
                audience: "petstore".into(),
                ..Default::default()
            }),
            Err(TenancyError::NoIssuer)
        ));
    }

    const OPERATOR: &str = "system:serviceaccount:petstore-system:petstore-operator";

    fn caller(subject: &str) -> Caller {
        let (namespace, name) = service_account(subject).expect("a principal");
        Caller {
            subject: subject.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    // One row per case: the certificate's identity, the token's subject,
    // and whether the call is accepted. Fails if a certificate may carry
    // a token that is neither its own nor, as an observer's, any token.
    #[test]
    fn a_certificate_carries_its_own_token_or_as_an_observer_any() {
        use CertificateIdentity::{NotAPrincipal, Principal, Unnamed};
        let principal = |p: &str| Principal(p.into());
        let observers: HashSet<String> = [OPERATOR.to_owned()].into();
        let team_a = "system:serviceaccount:team-a:petstore-tenant";
        let team_b = "system:serviceaccount:team-b:petstore-tenant";
        let rows: [(&str, CertificateIdentity, &str, bool); 9] = [
            (
                "a tenant calling as itself",
                principal(team_a),
                team_a,
                true,
            ),
            (
                "the observer as a namespace's deputy",
                principal(OPERATOR),
                team_a,
                true,
            ),
            (
                "the observer as itself",
                principal(OPERATOR),
                OPERATOR,
                true,
            ),
            (
                "another namespace's token",
                principal(team_b),
                team_a,
                false,
            ),
            (
                "another account of the same namespace",
                principal("system:serviceaccount:team-a:builder"),
                team_a,
                false,
            ),
            (
                "a tenant carrying the observer's token",
                principal(team_a),
                OPERATOR,
                false,
            ),
            (
                "a CN that is not a principal (the old operator's)",
                NotAPrincipal("petstore-operator".into()),
                team_a,
                false,
            ),
            ("a certificate without a CN", Unnamed, team_a, false),
            (
                "the observer's name, but not an observer of this store",
                principal("system:serviceaccount:petstore-system:other-operator"),
                team_a,
                false,
            ),
        ];
        for (case, certificate, subject, accepted) in rows {
            let outcome = certificate_may_carry(&certificate, &caller(subject), &observers);
            assert_eq!(outcome.is_ok(), accepted, "{case}: {outcome:?}");
            if let Err(refusal) = outcome {
                assert_eq!(refusal.reason(), "certificate_mismatch", "{case}");
                let status = refusal.status();
                assert_eq!(status.code(), tonic::Code::PermissionDenied, "{case}");
                assert!(status.message().contains(subject), "{case}: {status:?}");
                assert!(
                    status.message().contains("--observer"),
                    "{case}: {status:?}"
                );
            }
        }
        // No observers: a certificate carries its own token only.
        assert!(
            certificate_may_carry(&principal(OPERATOR), &caller(team_a), &HashSet::new()).is_err()
        );
        let refusal = certificate_may_carry(&principal(team_b), &caller(team_a), &observers)
            .expect_err("another namespace's token");
        assert_eq!(
            refusal.status().message(),
            "client certificate \"system:serviceaccount:team-b:petstore-tenant\" may not carry the token of \"system:serviceaccount:team-a:petstore-tenant\": a token is accepted with a client certificate whose CN is its own ServiceAccount (\"system:serviceaccount:team-a:petstore-tenant\") or one of this store's --observer accounts"
        );
    }

    // Fails if the CN is not read as Kubernetes reads a client
    // certificate's, or if something that is not a principal passes as one.
    #[test]
    fn the_certificate_identity_is_its_common_name_when_that_is_a_principal() {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject as _;
        let dir = tempfile::tempdir().expect("dir");
        let pki = fixtures::certs::Pki::create(dir.path(), "store", &[]).expect("CA");
        let identity = |name: &str| {
            let (cert, _) = pki.issue_client(name).expect("client");
            let der = CertificateDer::from_pem_file(cert).expect("PEM");
            CertificateIdentity::from_der(&der)
        };
        assert_eq!(
            identity(OPERATOR),
            CertificateIdentity::Principal(OPERATOR.into())
        );
        for not_a_principal in [
            "petstore-operator",
            "system:serviceaccount:team-a",
            "system:serviceaccount::petstore-tenant",
            "system:serviceaccount:team-a:a:b",
            "system:node:worker",
        ] {
            assert_eq!(
                identity(not_a_principal),
                CertificateIdentity::NotAPrincipal(not_a_principal.into()),
                "{not_a_principal}"
            );
        }
        assert_eq!(
            CertificateIdentity::from_der(b"not DER"),
            CertificateIdentity::Unnamed
        );
    }
}
