//! petstore-operator: reconciles `Pet` resources into the gRPC pet store.
//!
//! - [`crd`]: the `Pet` custom resource: its versions (v1 stored, v1alpha1
//!   deprecated) and the conversion between them.
//! - [`webhook`]: the conversion webhook every replica serves over HTTPS,
//!   and its certificates.
//! - [`certs`]: certificates the operator makes itself (a CA and a leaf in
//!   a Secret): the webhook's, and the store channel's mutual TLS.
//! - [`decision`]: the pure decision step (desired vs observed -> plan).
//! - [`status`]: the pure status and condition rules.
//! - [`store`]: the external-client contract and its gRPC implementation.
//! - [`controller`]: the Kubernetes glue: watch, finalizer, status, events.
//! - [`events`]: the Event writer and its background queue.
//! - [`leader`]: Lease-based leader election.
//! - [`claim`]: the cluster's claim on its installation's name in the store.
//! - [`metrics`]: Prometheus metrics and health endpoints.
//! - [`migration`]: rewrites stored Pets in the storage version after an upgrade.
//! - [`cli`] and [`app`]: the command line, and the wiring of all the above.

pub mod app;
pub mod certs;
pub mod claim;
pub mod cli;
pub mod controller;
pub mod crd;
pub mod decision;
pub mod events;
pub mod import;
pub mod leader;
pub mod metrics;
pub mod migration;
pub mod shared_object;
pub mod status;
pub mod store;
pub mod stores;
pub mod webhook;

/// `Display` as the type's `as_str`, for the label-like enums.
macro_rules! display_as_str {
    ($($t:ty),+ $(,)?) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}

display_as_str!(decision::Cause, store::Operation, status::Reason);

#[cfg(test)]
mod api_server;
#[cfg(test)]
mod fixtures;

use status::Reason;

/// Faults for the end-to-end crash tests. The release binary's command line
/// cannot set one (a test checks that it has no such flag); only the tests'
/// own operator binary passes one to [`app::run`]. No cargo feature gates
/// this: a feature turned on by the test crate would be unified into every
/// workspace build, release binary included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// After a successful create, hang before the ID reaches status, so a
    /// test can `kill -9` the operator at the worst moment.
    HangAfterCreate,
    /// After a successful release (a handover's, or a Pet deleted with
    /// Orphan), hang before the status or Event says so.
    HangAfterRelease,
    /// Hang before every claim's compare-and-set: a handed-over record
    /// waits under its handover key.
    HangBeforeClaim,
    /// Let this many claims through, then hang: the last of them after its
    /// compare-and-set (before its update and status), every later one
    /// before its own. A claim that fails still uses up its turn.
    HangAfterClaims(u32),
}
use store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] StoreError),

    #[error("writing the status of Pet {name}: {}", api_message(.source))]
    WriteStatus {
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("adding the finalizer to Pet {name}: {}", api_message(.source))]
    AddFinalizer {
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error("removing the finalizer from Pet {name}: {}", api_message(.source))]
    RemoveFinalizer {
        name: String,
        #[source]
        source: kube::Error,
    },

    /// Whether the installation is being removed could not be read, so a
    /// deletion does not delete its record yet.
    #[error("reading {what}, to tell whether the installation is being removed: {}", api_message(.source))]
    ReadInstallation {
        what: String,
        #[source]
        source: kube::Error,
    },

    #[error("Pet {0} has no namespace or UID")]
    MalformedPet(String),

    /// The decision step held the Pet with this reason and will retry.
    #[error("{1}")]
    Held(Reason, String),
}

/// A kube error's text with the API server's message once: kube's own
/// Display prints the Status twice (as text, then as debug).
fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!(
            "{} ({}, HTTP {})",
            status.message, status.reason, status.code
        ),
        other => other.to_string(),
    }
}

impl Error {
    /// How long the store asked to wait before the next attempt, if it did.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Store(StoreError::Unavailable { retry_after, .. }) => *retry_after,
            _ => None,
        }
    }

    /// The reason for conditions, the Warning Event and the errors metric.
    pub fn reason(&self) -> Reason {
        match self {
            Error::Store(StoreError::Unavailable { .. }) => Reason::StoreUnavailable,
            Error::Store(StoreError::Rejected { .. }) => Reason::InvalidSpec,
            Error::Store(StoreError::Unimplemented { .. }) => Reason::StoreLacksExtensions,
            Error::Store(StoreError::Denied { .. }) => Reason::StoreAccessDenied,
            Error::Held(reason, _) => *reason,
            _ => Reason::ReconcileError,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_error_prints_the_servers_message_once() {
        let status =
            kube::core::Status::failure("the object has been modified", "Conflict").with_code(409);
        let error = Error::WriteStatus {
            name: "thor".into(),
            source: kube::Error::Api(status.boxed()),
        };
        let text = error.to_string();
        assert_eq!(
            text.matches("the object has been modified").count(),
            1,
            "{text}"
        );
        assert!(text.contains("Conflict") && text.contains("409"), "{text}");
    }
}
