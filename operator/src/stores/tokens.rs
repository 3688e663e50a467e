//! Tokens that say, to a store, which namespace a write is for: a
//! TokenRequest for the ServiceAccount [`TENANT_SERVICE_ACCOUNT`] of the
//! Pet's namespace, with the store's audience, lasting minutes. Never the
//! operator's own token: a store that checks tenants sees the Pet's
//! namespace, whatever the operator is asked to do.
//!
//! The one exception reads and writes nothing of a tenant's on its behalf:
//! the store's change feed, which shows a tenant only its own records, is
//! read with a token of the operator's own ServiceAccount
//! ([`ObserverAccount`]), which a store names an observer
//! (`--observer`) to let it see every tenant's changes and write none.
//!
//! Minted tokens are kept until a fifth of their life is left (as the
//! kubelet renews projected tokens), so a store call costs a map lookup,
//! and a namespace costs one TokenRequest per renewal, not per call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tonic::codegen::http::HeaderValue;

use crate::store::Credentials;
use crate::store::grpc::StoreCallMetrics;

/// The ServiceAccount whose tokens a Pet's writes carry, in each namespace
/// that has Pets on a store that checks tenants. The operator's RBAC may
/// mint tokens for this name only.
pub const TENANT_SERVICE_ACCOUNT: &str = "petstore-tenant";

/// How long a minted token lasts: the API server's minimum is 10 minutes.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(600);

/// The operator's own ServiceAccount: the identity its change-feed reads
/// carry (`--service-account` in the namespace `--lease-namespace` names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObserverAccount {
    pub namespace: String,
    pub name: String,
}

impl ObserverAccount {
    /// The subject a store's `--observer` names it by.
    pub fn subject(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Key {
    namespace: String,
    service_account: String,
    audience: String,
}

struct Minted {
    header: HeaderValue,
    renew_at: Instant,
}

/// Mints and keeps tokens; one per process.
pub struct TokenMinter {
    client: kube::Client,
    metrics: StoreCallMetrics,
    lifetime: Duration,
    cache: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<Option<Minted>>>>>,
}

impl TokenMinter {
    pub fn new(client: kube::Client, metrics: StoreCallMetrics) -> Self {
        Self {
            client,
            metrics,
            lifetime: TOKEN_LIFETIME,
            cache: Mutex::default(),
        }
    }

    fn slot(&self, key: &Key) -> Arc<tokio::sync::Mutex<Option<Minted>>> {
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(cache.entry(key.clone()).or_default())
    }

    /// The `Bearer` header for `key`, minted if none is kept or it is due
    /// for renewal. Concurrent callers for one key wait for one mint.
    async fn header(&self, key: &Key) -> Result<HeaderValue, String> {
        let slot = self.slot(key);
        let mut minted = slot.lock().await;
        if let Some(kept) = minted.as_ref()
            && Instant::now() < kept.renew_at
        {
            return Ok(kept.header.clone());
        }
        let fresh = self.mint(key).await;
        self.metrics
            .token_request(key.service_account == TENANT_SERVICE_ACCOUNT, fresh.is_ok());
        let fresh = fresh?;
        let header = fresh.header.clone();
        *minted = Some(fresh);
        Ok(header)
    }

    fn forget(&self, key: &Key) {
        let slot = self.slot(key);
        if let Ok(mut minted) = slot.try_lock() {
            *minted = None;
        }
    }

    async fn mint(&self, key: &Key) -> Result<Minted, String> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &key.namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![key.audience.clone()],
                expiration_seconds: Some(self.lifetime.as_secs() as i64),
                bound_object_ref: None,
            },
            ..TokenRequest::default()
        };
        let asked = Instant::now();
        let answer = api
            .create_token_request(&key.service_account, &PostParams::default(), &request)
            .await
            .map_err(|error| mint_error(key, &error))?;
        let Some(status) = answer.status else {
            return Err(format!(
                "the API server minted no token for ServiceAccount {}/{}",
                key.namespace, key.service_account
            ));
        };
        // The API server may shorten the lifetime; renew at four fifths of
        // what it granted, measured from before the request.
        let left_ms =
            status.expiration_timestamp.0.as_millisecond() - chrono::Utc::now().timestamp_millis();
        let granted = Duration::from_millis(u64::try_from(left_ms).unwrap_or(0));
        let header = HeaderValue::try_from(format!("Bearer {}", status.token))
            .map_err(|_| "the minted token is not a valid header value".to_owned())?;
        Ok(Minted {
            header,
            renew_at: asked + granted.mul_f64(0.8),
        })
    }
}

/// What a person can act on: the ServiceAccount to create, or the RBAC the
/// operator lacks.
fn mint_error(key: &Key, error: &kube::Error) -> String {
    let (namespace, name) = (&key.namespace, &key.service_account);
    match error {
        kube::Error::Api(status) if status.code == 404 => format!(
            "no ServiceAccount {namespace}/{name} to mint this namespace's store token from; create it (`kubectl create serviceaccount {name} -n {namespace}`)"
        ),
        kube::Error::Api(status) if status.code == 403 => format!(
            "the operator may not mint tokens for ServiceAccount {namespace}/{name}: {}",
            status.message
        ),
        other => format!("minting a token for ServiceAccount {namespace}/{name}: {other}"),
    }
}

/// One ServiceAccount's identity towards one store: a tenant's, which a
/// Pet's calls carry, or the operator's own, which reads the change feed.
pub struct TenantCredentials {
    minter: Arc<TokenMinter>,
    key: Key,
}

impl TenantCredentials {
    /// The identity of `namespace`'s [`TENANT_SERVICE_ACCOUNT`].
    pub fn new(minter: Arc<TokenMinter>, namespace: &str, audience: &str) -> Self {
        Self::of_account(minter, namespace, TENANT_SERVICE_ACCOUNT, audience)
    }

    /// The operator's own identity, for reading the store's change feed as
    /// its observer; never for a write.
    pub fn observer(minter: Arc<TokenMinter>, account: &ObserverAccount, audience: &str) -> Self {
        Self::of_account(minter, &account.namespace, &account.name, audience)
    }

    fn of_account(
        minter: Arc<TokenMinter>,
        namespace: &str,
        service_account: &str,
        audience: &str,
    ) -> Self {
        Self {
            minter,
            key: Key {
                namespace: namespace.to_owned(),
                service_account: service_account.to_owned(),
                audience: audience.to_owned(),
            },
        }
    }
}

#[tonic::async_trait]
impl Credentials for TenantCredentials {
    async fn authorization(&self) -> Result<HeaderValue, String> {
        self.minter.header(&self.key).await
    }

    fn refused(&self) {
        self.minter.forget(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use http::Method;
    use serde_json::json;

    use super::*;
    use crate::api_server::ApiServerVerifier;

    fn minted(token: &str) -> serde_json::Value {
        let expires = chrono::Utc::now() + chrono::Duration::minutes(10);
        json!({
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": []},
            "status": {"token": token, "expirationTimestamp": expires.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)},
        })
    }

    #[tokio::test]
    async fn the_feed_reads_as_the_operator_and_writes_as_the_pets_namespace() {
        let api = ApiServerVerifier::default();
        let token_path = |namespace: &str, account: &str| {
            format!("/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token")
        };
        api.expect(
            Method::POST,
            &token_path("petstore-system", "petstore-operator"),
            201,
            minted("operator"),
        );
        api.expect(
            Method::POST,
            &token_path("team-a", TENANT_SERVICE_ACCOUNT),
            201,
            minted("tenant"),
        );
        let minter = Arc::new(TokenMinter::new(api.start(), StoreCallMetrics::default()));
        let operator = ObserverAccount {
            namespace: "petstore-system".into(),
            name: "petstore-operator".into(),
        };
        assert_eq!(
            operator.subject(),
            "system:serviceaccount:petstore-system:petstore-operator",
            "what the store's --observer names"
        );
        let observer = TenantCredentials::observer(Arc::clone(&minter), &operator, "store-b");
        let tenant = TenantCredentials::new(minter, "team-a", "store-b");
        assert_eq!(
            observer.authorization().await.expect("minted"),
            "Bearer operator"
        );
        assert_eq!(
            tenant.authorization().await.expect("minted"),
            "Bearer tenant"
        );
        // Kept: no second TokenRequest for either.
        assert_eq!(
            observer.authorization().await.expect("kept"),
            "Bearer operator"
        );
        api.verify();
        for call in api.calls(|_| true) {
            assert_eq!(
                call.body["spec"]["audiences"],
                json!(["store-b"]),
                "{call:?}"
            );
        }
    }
}
