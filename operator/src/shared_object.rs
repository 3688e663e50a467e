//! One object that every replica writes alike (a certificate Secret, the
//! published token issuer): each reads it, decides what it should hold, and
//! writes that with the API server's optimistic concurrency, so replicas
//! racing at start end with one object and a second replica writes nothing.

use std::fmt::Debug;
use std::str::FromStr;

use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The labels of every object the operator makes itself.
pub fn labels() -> std::collections::BTreeMap<String, String> {
    std::collections::BTreeMap::from([(
        "app.kubernetes.io/name".to_owned(),
        "petstore-operator".to_owned(),
    )])
}

/// Why an object could not be made what it should be.
#[derive(Debug, thiserror::Error)]
pub enum SharedObjectError {
    /// What it should hold could not be made (a certificate, say).
    #[error(transparent)]
    Decide(Box<dyn std::error::Error + Send + Sync>),
    #[error("{action} ({kind} {namespace}/{name}): {source}")]
    Api {
        kind: String,
        namespace: String,
        name: String,
        action: &'static str,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("the {kind} {name} kept changing under us; giving up for now")]
    Contended { kind: String, name: String },
}

/// What [`ensure`] does with the object it read.
pub enum Wanted<T, K> {
    /// It holds what is wanted.
    Keep(T),
    /// Replace it (or create it, when absent) with this.
    Write(T, Box<K>),
}

pub(crate) fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// Reads object `name`, asks `decide` what it should hold (given what it
/// holds now, `None` when absent), and writes that: create-if-absent, or
/// replace at the resourceVersion read. On a conflict (another replica
/// wrote first) it reads again and decides again.
pub async fn ensure<K, T, E>(
    api: &Api<K>,
    name: &str,
    mut decide: impl FnMut(Option<&K>) -> Result<Wanted<T, K>, E>,
) -> Result<T, SharedObjectError>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let kind = K::kind(&()).into_owned();
    let api_error = |action: &'static str| {
        let kind = kind.clone();
        let namespace = api.namespace().unwrap_or_default().to_owned();
        move |source: kube::Error| SharedObjectError::Api {
            kind,
            namespace,
            name: name.to_owned(),
            action,
            source: Box::new(source),
        }
    };
    for _ in 0..5 {
        let existing = api.get_opt(name).await.map_err(api_error("reading"))?;
        let (value, mut replacement) =
            match decide(existing.as_ref()).map_err(|err| SharedObjectError::Decide(err.into()))? {
                Wanted::Keep(value) => return Ok(value),
                Wanted::Write(value, replacement) => (value, replacement),
            };
        let written = match &existing {
            None => api
                .create(&PostParams::default(), &replacement)
                .await
                .map_err(|err| (err, "creating")),
            Some(existing) => {
                // Replace only what we read: a replica that wrote meanwhile wins.
                replacement.meta_mut().resource_version = existing.resource_version();
                api.replace(name, &PostParams::default(), &replacement)
                    .await
                    .map_err(|err| (err, "replacing"))
            }
        };
        match written {
            Ok(_) => {
                let verb = if existing.is_none() {
                    "created"
                } else {
                    "replaced"
                };
                tracing::info!("{verb} the shared {kind} {name}");
                return Ok(value);
            }
            Err((err, _)) if is_conflict(&err) => continue,
            Err((err, action)) => return Err(api_error(action)(err)),
        }
    }
    Err(SharedObjectError::Contended {
        kind,
        name: name.to_owned(),
    })
}

/// An object's `<namespace>/<name>`, as flags name one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespacedName {
    pub namespace: String,
    pub name: String,
}

impl FromStr for NamespacedName {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!(
                "{text:?} is not <namespace>/<name> (e.g. petstore/petstore-tls)"
            )),
        }
    }
}

impl std::fmt::Display for NamespacedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_named_namespace_slash_name() {
        assert_eq!(
            "petstore/petstore-tls".parse::<NamespacedName>(),
            Ok(NamespacedName {
                namespace: "petstore".into(),
                name: "petstore-tls".into()
            })
        );
        for bad in ["petstore-tls", "/x", "x/", "a/b/c", ""] {
            let err = bad.parse::<NamespacedName>().expect_err(bad);
            assert!(err.contains("<namespace>/<name>"), "{err}");
        }
    }
}
