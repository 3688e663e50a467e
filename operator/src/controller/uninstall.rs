//! Whether the installation is going away: the Pet CRD being deleted
//! without its confirmation, or the operator's own namespace being deleted.
//! A Pet deleted then keeps its record ([`Uninstall`]).
//!
//! Read from the API server, not a watch cache, and only when a deletion
//! is about to delete a record: the CRD's deletion timestamp is set before
//! the API server deletes a single Pet, so a fresh read cannot miss it,
//! where a second watch could lag the Pets' own. A deletion timestamp is
//! never cleared, so once seen it is remembered and not read again.

use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tracing::warn;

use crate::Error;
use crate::crd::{CONFIRM_DELETE_PETS_ANNOTATION, CRD_NAME};
use crate::decision::Uninstall;

pub struct UninstallProbe {
    crds: Api<CustomResourceDefinition>,
    namespaces: Api<Namespace>,
    namespace: String,
    seen: OnceLock<Uninstall>,
}

impl UninstallProbe {
    /// `namespace`: the operator's own.
    pub fn new(client: Client, namespace: String) -> Self {
        Self {
            crds: Api::all(client.clone()),
            namespaces: Api::all(client),
            namespace,
            seen: OnceLock::new(),
        }
    }

    /// Reads both. An error is returned, never taken as "not uninstalling":
    /// when in doubt, nothing is deleted.
    pub async fn check(&self) -> Result<Option<Uninstall>, Error> {
        if let Some(why) = self.seen.get() {
            return Ok(Some(*why));
        }
        let (crd, namespace) = tokio::join!(
            self.crds.get_opt(CRD_NAME),
            self.namespaces.get_opt(&self.namespace)
        );
        let crd = crd.map_err(|source| Error::ReadInstallation {
            what: format!("the CRD {CRD_NAME}"),
            source,
        })?;
        let namespace = namespace.map_err(|source| Error::ReadInstallation {
            what: format!("the operator's namespace {}", self.namespace),
            source,
        })?;
        let Some(why) = judge(crd.as_ref(), namespace.as_ref()) else {
            return Ok(None);
        };
        if self.seen.set(why).is_ok() {
            // Said once, for every Pet the uninstall takes.
            warn!(
                ?why,
                crd = CRD_NAME,
                namespace = %self.namespace,
                "the installation is being removed: Pets deleted from now on keep their store records (released, not deleted)"
            );
        }
        Ok(Some(why))
    }
}

/// The pure part. A CRD that is gone cannot be serving the Pet being
/// reconciled, so its absence counts as its deletion. A namespace that is
/// not there (an operator run outside the cluster names one that need not
/// exist) says nothing.
pub fn judge(
    crd: Option<&CustomResourceDefinition>,
    namespace: Option<&Namespace>,
) -> Option<Uninstall> {
    let crd_unconfirmed = match crd {
        None => true,
        Some(crd) => {
            crd.metadata.deletion_timestamp.is_some()
                && !crd
                    .annotations()
                    .contains_key(CONFIRM_DELETE_PETS_ANNOTATION)
        }
    };
    if crd_unconfirmed {
        return Some(Uninstall::CrdDeleting);
    }
    namespace
        .is_some_and(|ns| ns.metadata.deletion_timestamp.is_some())
        .then_some(Uninstall::NamespaceDeleting)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn deleting<K: kube::Resource>(mut object: K) -> K {
        object.meta_mut().deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        object
    }

    fn confirmed(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
        crd.annotations_mut()
            .insert(CONFIRM_DELETE_PETS_ANNOTATION.into(), "3".into());
        crd
    }

    type Case = (
        &'static str,
        Option<CustomResourceDefinition>,
        Option<Namespace>,
        Option<Uninstall>,
    );

    #[test]
    fn only_an_unconfirmed_crd_deletion_or_the_namespace_going_keeps_records() {
        let crd = CustomResourceDefinition::default();
        let namespace = Namespace::default();
        let cases: Vec<Case> = vec![
            (
                "installed",
                Some(crd.clone()),
                Some(namespace.clone()),
                None,
            ),
            (
                "run outside the cluster, no namespace",
                Some(crd.clone()),
                None,
                None,
            ),
            (
                "a confirmation alone deletes nothing",
                Some(confirmed(crd.clone())),
                Some(namespace.clone()),
                None,
            ),
            (
                "CRD deleted unconfirmed",
                Some(deleting(crd.clone())),
                Some(namespace.clone()),
                Some(Uninstall::CrdDeleting),
            ),
            (
                "CRD already gone",
                None,
                Some(namespace.clone()),
                Some(Uninstall::CrdDeleting),
            ),
            (
                "CRD deleted with the confirmation",
                Some(deleting(confirmed(crd.clone()))),
                Some(namespace.clone()),
                None,
            ),
            (
                "namespace going",
                Some(crd.clone()),
                Some(deleting(namespace.clone())),
                Some(Uninstall::NamespaceDeleting),
            ),
            (
                "namespace going outranks a confirmation",
                Some(deleting(confirmed(crd.clone()))),
                Some(deleting(namespace.clone())),
                Some(Uninstall::NamespaceDeleting),
            ),
        ];
        for (name, crd, namespace, expected) in cases {
            assert_eq!(judge(crd.as_ref(), namespace.as_ref()), expected, "{name}");
        }
    }
}
