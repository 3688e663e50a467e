//! Tenancy's rules: who a storage call acts for ([`Access`]) and what it
//! may read and write. Every backend applies them, inside the transaction
//! of the write they guard, through the functions here, so all decide the
//! same way. Who the caller is (its verified token) is `crate::auth`'s.

use crate::model::PetRecord;

/// Who a storage call acts for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// Tenancy is off: every record may be read and written, as before
    /// tenancy existed, and new records get no tenant.
    All,
    /// An observer: reads every record, writes none.
    Observer,
    /// A tenant, by its namespace: reads and writes its own records.
    Tenant(String),
}

/// Why a tenant's (or an observer's) write was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Denial {
    /// The record is another tenant's.
    CrossTenant,
    /// The record was made before tenancy, with no identity: only an
    /// import (`SetIdempotencyKeys` giving it an identity in the caller's
    /// namespace) claims it.
    Unclaimed,
    /// Observers read; they do not write records.
    ObserverWrite,
    /// The identity is outside the caller's namespace.
    IdentityNamespace { identity: String },
}

impl Denial {
    /// The `reason` label of `petstore_server_tenant_refusals_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::CrossTenant => "cross_tenant",
            Self::Unclaimed => "unclaimed",
            Self::ObserverWrite => "observer_write",
            Self::IdentityNamespace { .. } => "identity_namespace",
        }
    }
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::CrossTenant => f.write_str("the record belongs to another tenant"),
            Self::Unclaimed => f.write_str(
                "a record made before tenancy is claimed by import: SetIdempotencyKeys with a new_identity in your namespace",
            ),
            Self::ObserverWrite => f.write_str("observers may read every tenant's records but write none"),
            Self::IdentityNamespace { identity } => write!(
                f,
                "identity {identity:?} is outside the tenant's namespace (identities are <namespace>/<name>)"
            ),
        }
    }
}

/// The namespace of an identity `<namespace>/<name>`: the part before the
/// first `/`; `None` for an identity without one, which is in no tenant's
/// namespace.
pub fn identity_namespace(identity: &str) -> Option<&str> {
    identity.split_once('/').map(|(ns, _)| ns)
}

/// Whether `identity` is in `namespace`.
fn in_namespace(identity: &str, namespace: &str) -> bool {
    identity_namespace(identity) == Some(namespace)
}

/// What a permitted write does to the record's tenant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stamp {
    /// Leaves it.
    Keep,
    /// Sets it (the record had none): the first write of its tenant claims
    /// it, once.
    Set(String),
}

impl Stamp {
    /// The tenant to store, if this write sets one.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Self::Keep => None,
            Self::Set(tenant) => Some(tenant),
        }
    }

    /// Applies the stamp to `record`; whether it changed it.
    pub fn apply(&self, record: &mut PetRecord) -> bool {
        match self {
            Self::Set(tenant) if record.tenant != *tenant => {
                record.tenant.clone_from(tenant);
                true
            }
            _ => false,
        }
    }
}

impl Access {
    /// The tenant a record made by this caller gets: empty with tenancy off.
    pub fn new_record_tenant(&self) -> &str {
        match self {
            Self::Tenant(tenant) => tenant,
            Self::All | Self::Observer => "",
        }
    }

    /// The tenant's namespace, for messages; `None` for [`Access::All`].
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Self::Tenant(tenant) => Some(tenant),
            Self::All | Self::Observer => None,
        }
    }

    /// Whether the caller may read `record` (see the module's rules).
    pub fn may_read(&self, record: &PetRecord) -> bool {
        match self {
            Self::All | Self::Observer => true,
            Self::Tenant(tenant) => {
                record.tenant == *tenant
                    || (record.tenant.is_empty()
                        && record
                            .identity
                            .as_deref()
                            .is_none_or(|identity| in_namespace(identity, tenant)))
            }
        }
    }

    /// Whether the caller may write at all; observers may not.
    pub fn check_writer(&self) -> Result<(), Denial> {
        match self {
            Self::Observer => Err(Denial::ObserverWrite),
            Self::All | Self::Tenant(_) => Ok(()),
        }
    }

    /// Whether the caller may give a record `identity`: a tenant only in
    /// its own namespace.
    pub fn check_identity(&self, identity: &str) -> Result<(), Denial> {
        match self {
            Self::Tenant(tenant) if !in_namespace(identity, tenant) => {
                Err(Denial::IdentityNamespace {
                    identity: identity.to_owned(),
                })
            }
            Self::Observer => Err(Denial::ObserverWrite),
            _ => Ok(()),
        }
    }

    /// Whether the caller may write the stored `record` (an update, a
    /// delete or a key change that gives it no identity), and what the
    /// write does to its tenant: a record without a tenant whose identity
    /// is in the caller's namespace becomes the caller's.
    pub fn check_write(&self, record: &PetRecord) -> Result<Stamp, Denial> {
        self.check_claim(record, None)
    }

    /// [`Self::check_write`] for a key change that gives the record
    /// `new_identity` (already checked with [`Self::check_identity`]): a
    /// record from before tenancy without an identity is claimed by the
    /// tenant whose namespace the new identity is in (the import path).
    pub fn check_claim(
        &self,
        record: &PetRecord,
        new_identity: Option<&str>,
    ) -> Result<Stamp, Denial> {
        let tenant = match self {
            Self::All => return Ok(Stamp::Keep),
            Self::Observer => return Err(Denial::ObserverWrite),
            Self::Tenant(tenant) => tenant,
        };
        if record.tenant == *tenant {
            return Ok(Stamp::Keep);
        }
        if !record.tenant.is_empty() {
            return Err(Denial::CrossTenant);
        }
        match record.identity.as_deref() {
            Some(identity) if in_namespace(identity, tenant) => Ok(Stamp::Set(tenant.clone())),
            Some(_) => Err(Denial::CrossTenant),
            None if new_identity.is_some_and(|new| in_namespace(new, tenant)) => {
                Ok(Stamp::Set(tenant.clone()))
            }
            None => Err(Denial::Unclaimed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PetFields, ValidPetType};

    fn record(tenant: &str, identity: Option<&str>) -> PetRecord {
        PetRecord {
            id: "id".into(),
            fields: PetFields {
                name: "Thor".into(),
                pet_type: ValidPetType::Canine,
                birthday: chrono::NaiveDate::from_ymd_opt(2021, 4, 1).expect("date"),
            },
            idempotency_key: None,
            identity: identity.map(str::to_owned),
            tenant: tenant.into(),
        }
    }

    fn a() -> Access {
        Access::Tenant("a".into())
    }

    #[test]
    fn a_tenant_reads_its_own_and_unowned_records_in_its_namespace() {
        assert!(a().may_read(&record("a", Some("b/x"))));
        assert!(a().may_read(&record("", None)));
        assert!(a().may_read(&record("", Some("a/x"))));
        assert!(!a().may_read(&record("", Some("b/x"))));
        assert!(!a().may_read(&record("b", Some("a/x"))));
        assert!(!a().may_read(&record("b", None)));
        assert!(Access::Observer.may_read(&record("b", None)));
        assert!(Access::All.may_read(&record("b", None)));
    }

    #[test]
    fn writes_keep_stamp_or_refuse() {
        assert_eq!(a().check_write(&record("a", None)), Ok(Stamp::Keep));
        assert_eq!(
            a().check_write(&record("", Some("a/x"))),
            Ok(Stamp::Set("a".into()))
        );
        assert_eq!(
            a().check_write(&record("", Some("b/x"))),
            Err(Denial::CrossTenant)
        );
        assert_eq!(
            a().check_write(&record("b", Some("a/x"))),
            Err(Denial::CrossTenant)
        );
        assert_eq!(a().check_write(&record("", None)), Err(Denial::Unclaimed));
        assert_eq!(
            a().check_claim(&record("", None), Some("a/thor")),
            Ok(Stamp::Set("a".into()))
        );
        assert_eq!(
            a().check_claim(&record("", None), Some("b/thor")),
            Err(Denial::Unclaimed)
        );
        assert_eq!(
            Access::Observer.check_write(&record("", None)),
            Err(Denial::ObserverWrite)
        );
        assert_eq!(Access::All.check_write(&record("b", None)), Ok(Stamp::Keep));
    }

    #[test]
    fn identities_stay_in_the_tenants_namespace() {
        assert_eq!(a().check_identity("a/thor"), Ok(()));
        assert!(matches!(
            a().check_identity("ab/thor"),
            Err(Denial::IdentityNamespace { .. })
        ));
        assert!(a().check_identity("a").is_err(), "no namespace");
        assert_eq!(Access::All.check_identity("b/thor"), Ok(()));
        assert_eq!(identity_namespace("ns/name/more"), Some("ns"));
        assert_eq!(identity_namespace("ns"), None);
    }
}
