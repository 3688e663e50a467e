//! Who owns a store record: its idempotency key as one typed value. The
//! key is parsed here, once, where a record comes off the wire, and
//! formatted here when a write sets it; no other code splits a key.
//!
//! The wire forms, every one of which a store may already hold:
//!
//! | key | owner |
//! | --- | --- |
//! | `""` | nobody: released, or made outside Kubernetes |
//! | `<uid>` | a Pet of the unnamed installation (every key before installations) |
//! | `<installation>/<uid>` | a Pet of that installation |
//! | `<installation>/from:<uid>` | handed over to that installation by the Pet with that UID |
//! | `<installation>/` | handed over to that installation (an operator before per-handover keys) |
//!
//! A handover names its releaser so that each has a key of its own (the
//! store's keys are unique, and a Pet's key names one record), and so that
//! the Pet that released it can take it back. At most 63 + 6 + 36
//! characters, within the store's 128.

use std::fmt;

/// What marks a handover key's releaser.
const FROM: &str = "from:";

/// The owner a record's idempotency key names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Owner {
    /// Empty key: anyone may adopt the record.
    #[default]
    Nobody,
    /// A Pet: its installation (empty for the unnamed one) and UID.
    Pet { installation: String, uid: String },
    /// Released to the installation `to`, waiting for a Pet there with the
    /// record's identity; `from` is the releasing Pet's UID (`None` for a
    /// key written before handovers named it).
    HandedOver { to: String, from: Option<String> },
    /// A key this operator never writes (`/x`: a slash with nothing
    /// before it), kept exactly so a compare-and-set can name it.
    Other(String),
}

/// Who holds a record, seen from one Pet (its installation and UID) or,
/// with no UID, from its installation as a whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder<'a> {
    /// Nobody: a Pet may take it.
    Nobody,
    /// This Pet.
    ThisPet,
    /// Another Pet of this installation. Within one installation a
    /// namespace and name is one live Pet, so if the record carries this
    /// Pet's identity, that Pet is gone.
    SameInstallation { uid: &'a str },
    /// Handed over to this installation, waiting to be taken.
    HandedOverHere,
    /// Handed over by this very Pet to `to`, not yet taken: it may take it
    /// back (cancel).
    HandedOverByThisPet { to: &'a str },
    /// A Pet of another installation, or a handover to another one.
    Elsewhere { installation: &'a str },
    /// A key no operator writes.
    Unknown,
}

impl Owner {
    /// The Pet with this UID in this installation.
    pub fn pet(installation: &str, uid: &str) -> Self {
        Owner::Pet {
            installation: installation.to_owned(),
            uid: uid.to_owned(),
        }
    }

    /// Handed over to `to` by the Pet with UID `from`.
    pub fn handed_over(to: &str, from: &str) -> Self {
        Owner::HandedOver {
            to: to.to_owned(),
            from: Some(from.to_owned()),
        }
    }

    /// The owner a wire key names; every string parses, and
    /// [`Display`](fmt::Display) gives it back unchanged.
    pub fn parse(key: &str) -> Self {
        if key.is_empty() {
            return Owner::Nobody;
        }
        let Some((installation, rest)) = key.rsplit_once('/') else {
            return Owner::pet("", key);
        };
        if installation.is_empty() {
            return Owner::Other(key.to_owned());
        }
        if rest.is_empty() {
            return Owner::HandedOver {
                to: installation.to_owned(),
                from: None,
            };
        }
        match rest.strip_prefix(FROM) {
            Some(from) => Owner::handed_over(installation, from),
            None => Owner::pet(installation, rest),
        }
    }

    pub fn is_nobody(&self) -> bool {
        *self == Owner::Nobody
    }

    /// The UID of the Pet that owns the record, in whichever installation:
    /// UIDs are unique across clusters, so it alone names the Pet.
    pub fn pet_uid(&self) -> Option<&str> {
        match self {
            Owner::Pet { uid, .. } => Some(uid),
            _ => None,
        }
    }

    /// Who holds the record, seen from the Pet `uid` of `installation`, or
    /// (with `None`) from the installation alone.
    pub fn holder(&self, installation: &str, uid: Option<&str>) -> Holder<'_> {
        match self {
            Owner::Nobody => Holder::Nobody,
            Owner::Pet {
                installation: of,
                uid: owner,
            } if of == installation => {
                if uid == Some(owner.as_str()) {
                    Holder::ThisPet
                } else {
                    Holder::SameInstallation { uid: owner }
                }
            }
            Owner::Pet {
                installation: of, ..
            } => Holder::Elsewhere { installation: of },
            Owner::HandedOver { to, .. } if to == installation => Holder::HandedOverHere,
            Owner::HandedOver { to, from } => match (from.as_deref(), uid) {
                (Some(from), Some(uid)) if from == uid => Holder::HandedOverByThisPet { to },
                _ => Holder::Elsewhere { installation: to },
            },
            Owner::Other(_) => Holder::Unknown,
        }
    }
}

impl fmt::Display for Owner {
    /// The wire key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::Nobody => Ok(()),
            Owner::Pet { installation, uid } if installation.is_empty() => f.write_str(uid),
            Owner::Pet { installation, uid } => write!(f, "{installation}/{uid}"),
            Owner::HandedOver { to, from: None } => write!(f, "{to}/"),
            Owner::HandedOver {
                to,
                from: Some(from),
            } => write!(f, "{to}/{FROM}{from}"),
            Owner::Other(key) => f.write_str(key),
        }
    }
}

impl From<&str> for Owner {
    fn from(key: &str) -> Self {
        Owner::parse(key)
    }
}

/// Tests compare a record's owner with the key they wrote.
#[cfg(test)]
impl PartialEq<&str> for Owner {
    fn eq(&self, key: &&str) -> bool {
        *self == Owner::parse(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_parses_and_formats_back_unchanged() {
        let cases = [
            ("", Owner::Nobody),
            ("uid-1", Owner::pet("", "uid-1")),
            ("blue/uid-1", Owner::pet("blue", "uid-1")),
            (
                "green/",
                Owner::HandedOver {
                    to: "green".into(),
                    from: None,
                },
            ),
            ("green/from:uid-1", Owner::handed_over("green", "uid-1")),
            ("/uid-1", Owner::Other("/uid-1".into())),
            ("/", Owner::Other("/".into())),
            ("a/b/uid-1", Owner::pet("a/b", "uid-1")),
            (
                "petstore-operator-probe",
                Owner::pet("", "petstore-operator-probe"),
            ),
        ];
        for (key, owner) in cases {
            assert_eq!(Owner::parse(key), owner, "{key:?} parses");
            assert_eq!(owner.to_string(), key, "{key:?} formats back");
        }
    }

    #[test]
    fn a_handover_key_fits_the_stores_limit() {
        let longest = Owner::handed_over(&"x".repeat(63), &"u".repeat(36)).to_string();
        assert!(longest.chars().count() <= 128, "{}", longest.len());
    }

    #[test]
    fn who_holds_a_record() {
        let me = Some("me");
        let same = |uid| Holder::SameInstallation { uid };
        let elsewhere = |installation| Holder::Elsewhere { installation };
        let cases: [(&str, &str, Option<&str>, Holder<'_>); 16] = [
            ("", "blue", me, Holder::Nobody),
            ("blue/me", "blue", me, Holder::ThisPet),
            ("me", "", me, Holder::ThisPet),
            ("blue/gone", "blue", me, same("gone")),
            ("gone", "", me, same("gone")),
            ("blue/me", "blue", None, same("me")),
            ("green/me", "blue", me, elsewhere("green")),
            ("me", "blue", me, elsewhere("")),
            ("blue/", "blue", me, Holder::HandedOverHere),
            ("blue/from:other", "blue", me, Holder::HandedOverHere),
            ("blue/from:me", "blue", None, Holder::HandedOverHere),
            (
                "green/from:me",
                "blue",
                me,
                Holder::HandedOverByThisPet { to: "green" },
            ),
            ("green/from:other", "blue", me, elsewhere("green")),
            ("green/", "blue", me, elsewhere("green")),
            ("green/from:me", "blue", None, elsewhere("green")),
            ("/me", "", me, Holder::Unknown),
        ];
        for (key, installation, uid, expected) in cases {
            assert_eq!(
                Owner::parse(key).holder(installation, uid),
                expected,
                "{key:?} seen from {installation:?}/{uid:?}"
            );
        }
    }
}
