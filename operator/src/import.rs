//! `kubectl petstore import`: records already in the store as Pet manifests,
//! after ACK's `adopt` defaults: each manifest adopts its record by ID
//! (`external-id`), keeps it when the Pet is deleted (`Orphan`) and only
//! watches it (`changePolicy: Observe`) until a person switches it to
//! `Automatic`. Pure: the plugin reads the store and the cluster and prints
//! what [`manifests`] makes.

use std::collections::HashSet;

use chrono::NaiveDate;
use petstore_proto::convert::ValidPetType;
use petstore_proto::petstore as pb;
use serde_json::{Value, json};

use crate::crd::{ChangePolicy, EXTERNAL_ID_ANNOTATION, PetType, StoreRef};
use crate::store::{Holder as Held, Record};

/// Who holds a record, as seen from one cluster's installation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// Its key is empty: anyone may adopt it.
    Nobody,
    /// Keyed by a Pet of this installation that this cluster no longer
    /// has: its owner is gone.
    Lost,
    /// Keyed by a live Pet of this cluster: already managed.
    LivePet,
    /// Keyed by another installation (named here).
    Elsewhere(String),
}

/// Who holds `record`: `live_uids` are the UIDs of every Pet in the cluster.
/// A handover to this installation counts as lost: the operator takes it
/// for the Pet of its identity.
pub fn holder(record: &Record, installation: &str, live_uids: &HashSet<String>) -> Holder {
    match record.key.holder(installation, None) {
        Held::Nobody => Holder::Nobody,
        Held::SameInstallation { uid } if live_uids.contains(uid) => Holder::LivePet,
        Held::SameInstallation { .. } | Held::HandedOverHere => Holder::Lost,
        // Seen from no one Pet, never; the safe side is to leave it out.
        Held::ThisPet => Holder::LivePet,
        Held::Elsewhere { installation } | Held::HandedOverByThisPet { to: installation } => {
            Holder::Elsewhere(installation.to_owned())
        }
        Held::Unknown => Holder::Elsewhere(record.key.to_string()),
    }
}

/// Whether an import may adopt a record with this holder. A lost owner's
/// record is adopted only when it carries an identity: that is what lets
/// the operator take it from the lost key ([`crate::decision`]); without
/// one nothing tells it the owner is gone, and the Pet would be held.
pub fn importable(record: &Record, holder: &Holder) -> bool {
    match holder {
        Holder::Nobody => true,
        Holder::Lost => !record.identity.is_empty(),
        Holder::LivePet | Holder::Elsewhere(_) => false,
    }
}

/// The birthday range `--born-from` (inclusive) and `--born-before`
/// (exclusive) select; the store filters by it too.
#[derive(Clone, Copy, Debug, Default)]
pub struct Born {
    pub from: Option<NaiveDate>,
    pub before: Option<NaiveDate>,
}

/// The SearchPets request for the import's filters: the store matches
/// every non-empty one (any of the names, any of the types, born in the
/// range).
pub fn search_request(names: Vec<String>, types: &[PetType], born: Born) -> pb::SearchPetsReq {
    pb::SearchPetsReq {
        names,
        types: types
            .iter()
            .map(|&pet_type| pb::PetType::from(ValidPetType::from(pet_type)) as i32)
            .collect(),
        birthdate_range: (born.from.is_some() || born.before.is_some()).then(|| pb::DateRange {
            start: born.from.map(Into::into),
            end: born.before.map(Into::into),
        }),
    }
}

/// The Pet's namespace and name for a record: those of the Pet it last
/// belonged to (its identity), else a name made from its pet name and the
/// start of its ID (unique, as IDs are) in `namespace`.
pub fn pet_name(record: &Record, namespace: &str) -> (String, String) {
    if let Some((ns, name)) = record.identity.split_once('/') {
        return (ns.to_owned(), name.to_owned());
    }
    let mut base: String = record
        .data
        .name
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(40);
    let base: Vec<&str> = base.split('-').filter(|part| !part.is_empty()).collect();
    let id: String = record
        .id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect::<String>()
        .to_lowercase();
    let name = if base.is_empty() {
        format!("pet-{id}")
    } else {
        format!("{}-{id}", base.join("-"))
    };
    (namespace.to_owned(), name)
}

/// Whether `record` may become a Pet of `namespace` when imported through
/// a store named by `storeRef`: it names no Pet, or a Pet of `namespace`.
/// A `storeRef` means the store of the Pet's own namespace, so a record
/// named after another namespace's Pet is left out rather than put there.
pub fn of_namespace(record: &Record, namespace: &str) -> bool {
    match record.identity.split_once('/') {
        Some((identity_namespace, _)) => identity_namespace == namespace,
        None => true,
    }
}

/// One Pet manifest that adopts `record`, as JSON; with `store_ref`, the
/// Pet names the store the record was read from.
pub fn manifest(
    record: &Record,
    namespace: &str,
    policy: ChangePolicy,
    store_ref: Option<&StoreRef>,
) -> Value {
    let (namespace, name) = pet_name(record, namespace);
    let mut manifest = json!({
        "apiVersion": "petstore.example.com/v1",
        "kind": "Pet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": { EXTERNAL_ID_ANNOTATION: record.id },
        },
        "spec": {
            "name": record.data.name,
            "type": record.data.pet_type.as_str(),
            "birthday": record.data.birthday.format("%Y-%m-%d").to_string(),
            "deletionPolicy": "Orphan",
            "changePolicy": policy.as_str(),
        },
    });
    if let Some(store_ref) = store_ref {
        manifest["spec"]["storeRef"] = json!({
            "kind": store_ref.kind.as_str(),
            "name": store_ref.name,
        });
    }
    manifest
}

/// The manifests as one YAML stream, `---` between documents.
pub fn to_yaml(manifests: &[Value]) -> Result<String, serde_norway::Error> {
    let mut out = String::new();
    for manifest in manifests {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(manifest)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::PetData;

    fn record(id: &str, key: &str, identity: &str) -> Record {
        Record {
            id: id.into(),
            key: crate::store::Owner::parse(key),
            identity: identity.into(),
            data: PetData::named("Rex the 2nd!")
                .of_type(PetType::Cat)
                .born(2019, 5, 6),
        }
    }

    #[test]
    fn the_filters_become_the_stores_own() {
        let date = |y, m, d| NaiveDate::from_ymd_opt(y, m, d).expect("a date");
        let everything = search_request(Vec::new(), &[], Born::default());
        assert_eq!(
            everything,
            pb::SearchPetsReq::default(),
            "no filter: every record"
        );
        let some = search_request(
            vec!["Rex".into()],
            &[PetType::Cat, PetType::Dog],
            Born {
                from: Some(date(2019, 1, 1)),
                before: None,
            },
        );
        assert_eq!(some.names, ["Rex"]);
        assert_eq!(
            some.types,
            [pb::PetType::PtFeline as i32, pb::PetType::PtCanine as i32]
        );
        let range = some.birthdate_range.expect("a range");
        assert_eq!(
            (range.start, range.end),
            (Some(date(2019, 1, 1).into()), None)
        );
    }

    #[test]
    fn who_holds_a_record() {
        let live: HashSet<String> = ["live-uid".to_owned()].into();
        let cases = [
            ("no key", "", "blue", Holder::Nobody),
            ("a lost Pet's", "blue/gone-uid", "blue", Holder::Lost),
            ("a live Pet's", "blue/live-uid", "blue", Holder::LivePet),
            (
                "another installation's",
                "green/live-uid",
                "blue",
                Holder::Elsewhere("green".into()),
            ),
            (
                "the unnamed installation's lost Pet",
                "gone-uid",
                "",
                Holder::Lost,
            ),
            (
                "the unnamed installation's, seen from a named one",
                "gone-uid",
                "blue",
                Holder::Elsewhere(String::new()),
            ),
        ];
        for (name, key, installation, expected) in cases {
            assert_eq!(
                holder(&record("r", key, ""), installation, &live),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn only_records_the_operator_can_take_are_imported() {
        assert!(importable(&record("r", "", ""), &Holder::Nobody));
        assert!(importable(&record("r", "k", "default/rex"), &Holder::Lost));
        assert!(
            !importable(&record("r", "k", ""), &Holder::Lost),
            "no identity"
        );
        assert!(!importable(
            &record("r", "k", "default/rex"),
            &Holder::LivePet
        ));
        assert!(!importable(
            &record("r", "k", "default/rex"),
            &Holder::Elsewhere("green".into())
        ));
    }

    #[test]
    fn a_record_keeps_the_name_of_the_pet_it_had_or_gets_one_from_its_own() {
        assert_eq!(
            pet_name(&record("0b3a5f1e-7c2d", "", "team-a/rex"), "default"),
            ("team-a".into(), "rex".into())
        );
        assert_eq!(
            pet_name(&record("0B3A5F1E-7c2d", "", ""), "imported"),
            ("imported".into(), "rex-the-2nd-0b3a5f1e".into())
        );
        let mut nameless = record("abc", "", "");
        nameless.data.name = "!!!".into();
        assert_eq!(pet_name(&nameless, "default").1, "pet-abc");
    }

    #[test]
    fn a_manifest_adopts_by_id_keeps_the_record_and_observes() {
        let yaml = to_yaml(&[manifest(
            &record("r-1", "", ""),
            "default",
            ChangePolicy::Observe,
            None,
        )])
        .expect("yaml");
        assert_eq!(
            yaml,
            "---\napiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  annotations:\n    petstore.example.com/external-id: r-1\n  name: rex-the-2nd-r1\n  namespace: default\nspec:\n  birthday: 2019-05-06\n  changePolicy: Observe\n  deletionPolicy: Orphan\n  name: Rex the 2nd!\n  type: cat\n"
        );
    }

    /// Read through a store of the namespace: the Pet names that store.
    #[test]
    fn a_manifest_read_through_a_store_names_it() {
        let store_ref: StoreRef = "PetStore/shared".parse().expect("a storeRef");
        let yaml = to_yaml(&[manifest(
            &record("r-1", "", "team-a/rex"),
            "team-a",
            ChangePolicy::Observe,
            Some(&store_ref),
        )])
        .expect("yaml");
        assert!(yaml.contains("  namespace: team-a\n"), "{yaml}");
        assert!(
            yaml.contains("  storeRef:\n    kind: PetStore\n    name: shared\n"),
            "{yaml}"
        );
    }

    #[test]
    fn a_store_import_keeps_to_its_namespace() {
        let cases = [
            ("no identity: named in the namespace", "", true),
            ("a Pet of the namespace", "team-a/rex", true),
            ("another namespace's Pet", "team-b/rex", false),
            (
                "a namespace that only starts the same",
                "team-ab/rex",
                false,
            ),
        ];
        for (why, identity, kept) in cases {
            assert_eq!(
                of_namespace(&record("r", "", identity), "team-a"),
                kept,
                "{why}"
            );
        }
    }
}
