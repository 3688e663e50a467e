//! Publishes this cluster's ServiceAccount token issuer, its name and its
//! keys (JWKS), to a ConfigMap beside the store (`--publish-token-issuer`),
//! so that a store with `--tenancy` checks tokens offline with what its Pod
//! mounts, as `config/` runs it. The API server serves both to every
//! ServiceAccount (OIDC discovery); a key rotation reaches the store within
//! [`REFRESH_INTERVAL`] and the kubelet's sync, while the old key, still
//! listed, keeps checking the tokens it signed.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::core::ObjectMeta;
use tokio_util::sync::CancellationToken;

use crate::shared_object::{NamespacedName, SharedObjectError, Wanted, ensure};

/// The issuer's name, as tokens carry it in `iss`.
pub const ISSUER_KEY: &str = "issuer";
/// The issuer's keys, as `/openid/v1/jwks` serves them.
pub const JWKS_KEY: &str = "jwks.json";
/// How often every replica reads the issuer again.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(60);

const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
const JWKS_PATH: &str = "/openid/v1/jwks";

#[derive(Debug, thiserror::Error)]
pub enum IssuerError {
    #[error(
        "reading {path} from the API server (may this account get it? config/'s ClusterRole grants it): {source}"
    )]
    Read {
        path: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{DISCOVERY_PATH} names no issuer: {0}")]
    NoIssuer(String),
    #[error(transparent)]
    ConfigMap(#[from] SharedObjectError),
}

/// The token issuer as the API server describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenIssuer {
    pub issuer: String,
    pub jwks: String,
}

impl TokenIssuer {
    /// The issuer from its OIDC discovery document (`issuer`) and its keys.
    pub fn from_documents(discovery: &str, jwks: String) -> Result<Self, IssuerError> {
        let issuer = serde_json::from_str::<serde_json::Value>(discovery)
            .ok()
            .and_then(|doc| doc.get("issuer")?.as_str().map(str::to_owned))
            .filter(|issuer| !issuer.is_empty())
            .ok_or_else(|| IssuerError::NoIssuer(discovery.chars().take(200).collect()))?;
        Ok(Self { issuer, jwks })
    }

    fn config_map(&self, name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(crate::shared_object::labels()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([
                (ISSUER_KEY.to_owned(), self.issuer.clone()),
                (JWKS_KEY.to_owned(), self.jwks.clone()),
            ])),
            ..ConfigMap::default()
        }
    }

    fn is_in(&self, config_map: &ConfigMap) -> bool {
        let data = config_map.data.as_ref();
        let value = |key| data.and_then(|data| data.get(key)).map(String::as_str);
        value(ISSUER_KEY) == Some(self.issuer.as_str()) && value(JWKS_KEY) == Some(&self.jwks)
    }
}

async fn get_text(client: &kube::Client, path: &'static str) -> Result<String, IssuerError> {
    let read = |source| IssuerError::Read {
        path,
        source: Box::new(source),
    };
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|err| read(kube::Error::HttpError(err)))?;
    client.request_text(request).await.map_err(read)
}

/// Reads the issuer from the API server.
pub async fn read(client: &kube::Client) -> Result<TokenIssuer, IssuerError> {
    let discovery = get_text(client, DISCOVERY_PATH).await?;
    let jwks = get_text(client, JWKS_PATH).await?;
    TokenIssuer::from_documents(&discovery, jwks)
}

/// Writes `issuer` to the ConfigMap `target` unless it holds it already.
pub async fn publish(
    client: &kube::Client,
    target: &NamespacedName,
    issuer: &TokenIssuer,
) -> Result<(), IssuerError> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &target.namespace);
    Ok(ensure(&config_maps, &target.name, |existing| {
        Ok::<_, IssuerError>(match existing {
            Some(config_map) if issuer.is_in(config_map) => Wanted::Keep(()),
            _ => Wanted::Write((), Box::new(issuer.config_map(&target.name))),
        })
    })
    .await?)
}

/// Reads and publishes once; errors are logged.
async fn refresh(client: &kube::Client, target: &NamespacedName) {
    let published = async { publish(client, target, &read(client).await?).await }.await;
    match published {
        Ok(()) => tracing::debug!(config_map = %target, "the token issuer is published"),
        Err(err) => {
            tracing::warn!(error = %err, config_map = %target, "cannot publish the token issuer; retrying every minute")
        }
    }
}

/// At once, then every [`REFRESH_INTERVAL`] until `stop`.
pub async fn keep_published(client: kube::Client, target: NamespacedName, stop: CancellationToken) {
    loop {
        refresh(&client, &target).await;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(REFRESH_INTERVAL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issuer_comes_from_the_discovery_document() {
        let issuer = TokenIssuer::from_documents(
            r#"{"issuer":"https://kubernetes.default.svc.cluster.local","jwks_uri":"https://x/openid/v1/jwks"}"#,
            r#"{"keys":[]}"#.into(),
        )
        .expect("an issuer");
        assert_eq!(
            issuer.issuer,
            "https://kubernetes.default.svc.cluster.local"
        );
        for bad in [r#"{"jwks_uri":"x"}"#, r#"{"issuer":""}"#, "not json"] {
            let err = TokenIssuer::from_documents(bad, String::new()).expect_err(bad);
            assert!(err.to_string().contains("names no issuer"), "{err}");
        }
    }

    #[test]
    fn a_config_map_holding_the_issuer_is_kept_and_any_other_rewritten() {
        let issuer = TokenIssuer {
            issuer: "https://issuer".into(),
            jwks: r#"{"keys":[1]}"#.into(),
        };
        let published = issuer.config_map("petstore-token-issuer");
        assert_eq!(
            published.metadata.name.as_deref(),
            Some("petstore-token-issuer")
        );
        assert!(issuer.is_in(&published));
        let rotated = TokenIssuer {
            jwks: r#"{"keys":[1,2]}"#.into(),
            ..issuer.clone()
        };
        assert!(!rotated.is_in(&published));
        assert!(!issuer.is_in(&ConfigMap::default()));
    }
}
