//! Validation at the edge: turns wire messages into domain values, or into an
//! `INVALID_ARGUMENT` status that names the field and the pet. Answers go
//! the other way through `wire`.

use chrono::NaiveDate;
use petstore_proto::google::r#type::Date;
use petstore_proto::petstore::{self as pb, PetType, SamplerType};
use petstore_telemetry::SamplerSetting;
use tonic::Status;

use crate::model::{
    InstallationClaim, KeyChange, MAX_BATCH, MAX_CLAIM_CHARS, MAX_CLAIM_TTL_SECONDS,
    MAX_IDENTITY_CHARS, MAX_KEY_CHARS, MAX_NAME_CHARS, NewPet, PetFields, PetUpdate, SearchFilter,
    ValidPetType,
};

/// Where in a request a problem was found, used to build messages such as
/// `pets[1].name: must not be blank (pet #1 "  ")`.
struct At<'a> {
    path: String,
    pet: Option<(usize, &'a str)>,
}

impl<'a> At<'a> {
    /// `pets[index].field`, naming the pet.
    fn pet_field(index: usize, pet: &'a pb::Pet, field: &str) -> Self {
        At {
            path: format!("pets[{index}].{field}"),
            pet: Some((index, pet.name.as_str())),
        }
    }

    fn invalid(&self, problem: impl std::fmt::Display) -> Status {
        let message = match self.pet {
            Some((index, name)) => format!("{}: {problem} (pet #{index} {name:?})", self.path),
            None => format!("{}: {problem}", self.path),
        };
        Status::invalid_argument(message)
    }
}

fn check_batch_size(field: &str, len: usize) -> Result<(), Status> {
    if len > MAX_BATCH {
        return Err(Status::invalid_argument(format!(
            "{field}: at most {MAX_BATCH} entries per request, got {len}"
        )));
    }
    Ok(())
}

/// A required date, named by `at` when it is missing or not a real date.
fn date(at: &At<'_>, value: Option<&Date>) -> Result<NaiveDate, Status> {
    let value = value.ok_or_else(|| at.invalid("is required"))?;
    value.to_naive().map_err(|problem| at.invalid(problem))
}

/// The name, type and birthday of `pets[index]`, validated.
fn pet_fields(index: usize, pet: &pb::Pet) -> Result<PetFields, Status> {
    let at = |field: &str| At::pet_field(index, pet, field);
    let name_chars = pet.name.chars().count();
    if pet.name.trim().is_empty() {
        return Err(at("name").invalid("must not be empty or only whitespace"));
    }
    if name_chars > MAX_NAME_CHARS {
        return Err(at("name").invalid(format!(
            "must be at most {MAX_NAME_CHARS} characters, got {name_chars}"
        )));
    }
    let pet_type = ValidPetType::from_wire(pet.r#type).ok_or_else(|| {
        at("type").invalid(format!(
            "must be PTCanine, PTFeline, PTBird or PTReptile, got {}",
            PetType::try_from(pet.r#type)
                .map(|t| t.as_str_name().to_owned())
                .unwrap_or_else(|_| pet.r#type.to_string())
        ))
    })?;
    let birthday = date(&at("birthday"), pet.birthday.as_ref())?;
    Ok(PetFields {
        name: pet.name.clone(),
        pet_type,
        birthday,
    })
}

/// Refuses `value`, naming `at`, when it is longer than `max` characters.
fn at_most(at: &At<'_>, value: &str, max: usize) -> Result<(), Status> {
    let chars = value.chars().count();
    if chars > max {
        return Err(at.invalid(format!("must be at most {max} characters, got {chars}")));
    }
    Ok(())
}

/// An optional string field of `pets[index]`: `None` when empty.
fn optional(
    index: usize,
    pet: &pb::Pet,
    field: &str,
    value: &str,
    max: usize,
) -> Result<Option<String>, Status> {
    if value.is_empty() {
        return Ok(None);
    }
    at_most(&At::pet_field(index, pet, field), value, max)?;
    Ok(Some(value.to_owned()))
}

/// A batch of pets within the size limit, each checked by `check`.
fn each_pet<T>(
    pets: &[pb::Pet],
    check: impl Fn(usize, &pb::Pet) -> Result<T, Status>,
) -> Result<Vec<T>, Status> {
    check_batch_size("pets", pets.len())?;
    pets.iter()
        .enumerate()
        .map(|(index, pet)| check(index, pet))
        .collect()
}

pub fn add_request(req: &pb::AddPetsReq) -> Result<Vec<NewPet>, Status> {
    each_pet(&req.pets, |index, pet| {
        if !pet.id.is_empty() {
            return Err(
                At::pet_field(index, pet, "id").invalid("must be empty: the store assigns IDs")
            );
        }
        Ok(NewPet {
            fields: pet_fields(index, pet)?,
            idempotency_key: optional(
                index,
                pet,
                "idempotency_key",
                &pet.idempotency_key,
                MAX_KEY_CHARS,
            )?,
            identity: optional(index, pet, "identity", &pet.identity, MAX_IDENTITY_CHARS)?,
        })
    })
}

pub fn update_request(req: &pb::UpdatePetsReq) -> Result<Vec<PetUpdate>, Status> {
    each_pet(&req.pets, |index, pet| {
        if pet.id.trim().is_empty() {
            return Err(At::pet_field(index, pet, "id").invalid("is required to update a pet"));
        }
        Ok(PetUpdate {
            id: pet.id.clone(),
            fields: pet_fields(index, pet)?,
        })
    })
}

/// Validates SetIdempotencyKeys: IDs required, keys and identities within
/// their limits, and no pet, new key or new identity named twice (the
/// outcome would depend on order).
pub fn set_keys_request(req: &pb::SetIdempotencyKeysReq) -> Result<Vec<KeyChange>, Status> {
    check_batch_size("changes", req.changes.len())?;
    let mut ids = std::collections::HashSet::new();
    let mut new_keys = std::collections::HashSet::new();
    let mut new_identities = std::collections::HashSet::new();
    req.changes
        .iter()
        .enumerate()
        .map(|(index, change)| {
            let at = |field: &str| At {
                path: format!("changes[{index}].{field}"),
                pet: None,
            };
            if change.id.trim().is_empty() {
                return Err(at("id").invalid("is required"));
            }
            if !ids.insert(change.id.as_str()) {
                return Err(at("id").invalid(format!(
                    "pet {:?} appears more than once in this request",
                    change.id
                )));
            }
            for (field, key) in [
                ("expected_key", &change.expected_key),
                ("new_key", &change.new_key),
            ] {
                at_most(&at(field), key, MAX_KEY_CHARS)?;
            }
            if !change.new_key.is_empty() && !new_keys.insert(change.new_key.as_str()) {
                return Err(at("new_key").invalid(format!(
                    "key {:?} is given to more than one pet in this request",
                    change.new_key
                )));
            }
            if let Some(identity) = change.new_identity.as_deref() {
                at_most(&at("new_identity"), identity, MAX_IDENTITY_CHARS)?;
                if !identity.is_empty() && !new_identities.insert(identity) {
                    return Err(at("new_identity").invalid(format!(
                        "identity {identity:?} is given to more than one pet in this request"
                    )));
                }
            }
            Ok(KeyChange {
                id: change.id.clone(),
                expected_key: change.expected_key.clone(),
                new_key: change.new_key.clone(),
                new_identity: change.new_identity.clone(),
            })
        })
        .collect()
}

pub fn ids(field: &str, ids: &[String]) -> Result<(), Status> {
    check_batch_size(field, ids.len())
}

/// Validates GetPets: each list within the batch size, each identity within
/// its limit. IDs and keys are not checked, as before identities: one longer
/// than any stored simply matches nothing.
pub fn get_request(req: &pb::GetPetsReq) -> Result<(), Status> {
    check_batch_size("ids", req.ids.len())?;
    check_batch_size("idempotency_keys", req.idempotency_keys.len())?;
    check_batch_size("identities", req.identities.len())?;
    for (index, identity) in req.identities.iter().enumerate() {
        let at = At {
            path: format!("identities[{index}]"),
            pet: None,
        };
        at_most(&at, identity, MAX_IDENTITY_CHARS)?;
    }
    Ok(())
}

pub fn search_request(req: &pb::SearchPetsReq) -> Result<SearchFilter, Status> {
    check_batch_size("names", req.names.len())?;
    check_batch_size("types", req.types.len())?;
    let types = req
        .types
        .iter()
        .enumerate()
        .map(|(index, &value)| {
            ValidPetType::from_wire(value).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "types[{index}]: must be PTCanine, PTFeline, PTBird or PTReptile, got {value}"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let bound = |field: &str, value: &Option<Date>| {
        value
            .as_ref()
            .map(|d| {
                date(
                    &At {
                        path: format!("birthdate_range.{field}"),
                        pet: None,
                    },
                    Some(d),
                )
            })
            .transpose()
    };
    let range = req.birthdate_range.unwrap_or_default();
    Ok(SearchFilter {
        names: req.names.clone(),
        types,
        born_on_or_after: bound("start", &range.start)?,
        born_before: bound("end", &range.end)?,
    })
}

/// The sampler a ChangeSampler request asks for.
pub fn change_sampler_request(req: &pb::ChangeSamplerReq) -> Result<SamplerSetting, Status> {
    let at = |path: &str| At {
        path: path.to_owned(),
        pet: None,
    };
    let sampler = req
        .sampler
        .as_ref()
        .ok_or_else(|| at("sampler").invalid("is required"))?;
    match SamplerType::try_from(sampler.r#type) {
        Ok(SamplerType::StNever) => Ok(SamplerSetting::Never),
        Ok(SamplerType::StAlways) => Ok(SamplerSetting::Always),
        Ok(SamplerType::StFloat) if SamplerSetting::is_valid_ratio(sampler.float_value) => {
            Ok(SamplerSetting::Ratio(sampler.float_value))
        }
        Ok(SamplerType::StFloat) => Err(at("sampler.float_value")
            .invalid(format!("must be in (0, 1], got {}", sampler.float_value))),
        Ok(SamplerType::StUnknown) | Err(_) => Err(at("sampler.type").invalid(format!(
            "must be STNever, STAlways or STFloat, got {}",
            SamplerType::try_from(sampler.r#type)
                .map(|t| t.as_str_name().to_owned())
                .unwrap_or_else(|_| sampler.r#type.to_string())
        ))),
    }
}

/// Validates ClaimInstallation: an installation and a holder of 1 to
/// [`MAX_CLAIM_CHARS`] characters, and a TTL of 1 to
/// [`MAX_CLAIM_TTL_SECONDS`] seconds.
pub fn claim_request(req: &pb::ClaimInstallationReq) -> Result<InstallationClaim, Status> {
    let at = |path: &str| At {
        path: path.to_owned(),
        pet: None,
    };
    for (field, value) in [("installation", &req.installation), ("holder", &req.holder)] {
        if value.is_empty() {
            return Err(at(field).invalid("is required"));
        }
        at_most(&at(field), value, MAX_CLAIM_CHARS)?;
    }
    if !(1..=MAX_CLAIM_TTL_SECONDS).contains(&req.ttl_seconds) {
        return Err(at("ttl_seconds").invalid(format!(
            "must be 1 to {MAX_CLAIM_TTL_SECONDS}, got {}",
            req.ttl_seconds
        )));
    }
    Ok(InstallationClaim {
        installation: req.installation.clone(),
        holder: req.holder.clone(),
        ttl_seconds: req.ttl_seconds,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The book's dog, valid as sent; other modules' tests start from it too.
    pub(crate) fn thor() -> pb::Pet {
        pb::Pet {
            name: "Thor".into(),
            r#type: PetType::PtCanine.into(),
            birthday: Some(Date {
                year: 2021,
                month: 4,
                day: 1,
            }),
            ..Default::default()
        }
    }

    fn add_error(pet: pb::Pet) -> String {
        let err = add_request(&pb::AddPetsReq { pets: vec![pet] })
            .expect_err("the pet should be rejected");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        err.message().to_owned()
    }

    #[test]
    fn a_valid_pet_converts() {
        let pets = add_request(&pb::AddPetsReq { pets: vec![thor()] }).expect("valid");
        assert_eq!(pets[0].fields.name, "Thor");
        assert_eq!(pets[0].fields.pet_type, ValidPetType::Canine);
        assert_eq!(
            pets[0].fields.birthday,
            NaiveDate::from_ymd_opt(2021, 4, 1).expect("date")
        );
        assert_eq!(pets[0].idempotency_key, None);
    }

    #[test]
    fn messages_name_the_field_and_the_pet() {
        let msg = add_error(pb::Pet {
            name: "   ".into(),
            ..thor()
        });
        assert!(msg.starts_with("pets[0].name:"), "{msg}");
        assert!(msg.contains("pet #0"), "{msg}");

        let msg = add_error(pb::Pet {
            birthday: Some(Date {
                year: 2021,
                month: 2,
                day: 31,
            }),
            ..thor()
        });
        assert_eq!(
            msg,
            "pets[0].birthday: 2021-02-31 is not a real date (pet #0 \"Thor\")"
        );
    }

    #[test]
    fn out_of_range_date_parts_are_rejected_not_wrapped() {
        for (y, m, d) in [
            (2021, 13, 1),
            (2021, -1, 1),
            (0, 1, 1),
            (2021, 1, 0),
            (10000, 1, 1),
        ] {
            let msg = add_error(pb::Pet {
                birthday: Some(Date {
                    year: y,
                    month: m,
                    day: d,
                }),
                ..thor()
            });
            assert!(msg.contains("birthday"), "{y}-{m}-{d}: {msg}");
        }
    }

    #[test]
    fn unknown_enum_numbers_are_rejected() {
        let msg = add_error(pb::Pet {
            r#type: 42,
            ..thor()
        });
        assert!(msg.contains("pets[0].type") && msg.contains("42"), "{msg}");
    }

    #[test]
    fn name_length_counts_characters_not_bytes() {
        let ok = "é".repeat(MAX_NAME_CHARS);
        assert!(
            add_request(&pb::AddPetsReq {
                pets: vec![pb::Pet {
                    name: ok.clone(),
                    ..thor()
                }]
            })
            .is_ok()
        );
        let msg = add_error(pb::Pet {
            name: format!("{ok}é"),
            ..thor()
        });
        assert!(msg.contains("at most 128"), "{msg}");
    }

    #[test]
    fn identity_is_optional_and_at_most_320_characters() {
        let pets = add_request(&pb::AddPetsReq {
            pets: vec![
                thor(),
                pb::Pet {
                    identity: "é".repeat(MAX_IDENTITY_CHARS),
                    ..thor()
                },
            ],
        })
        .expect("valid");
        assert_eq!(pets[0].identity, None, "empty is none");
        assert_eq!(
            pets[1].identity.as_deref().map(|i| i.chars().count()),
            Some(MAX_IDENTITY_CHARS)
        );
        let msg = add_error(pb::Pet {
            identity: "x".repeat(MAX_IDENTITY_CHARS + 1),
            ..thor()
        });
        assert_eq!(
            msg,
            "pets[0].identity: must be at most 320 characters, got 321 (pet #0 \"Thor\")"
        );
    }

    fn key_change(id: &str, new_identity: Option<&str>) -> pb::KeyChange {
        pb::KeyChange {
            id: id.into(),
            new_identity: new_identity.map(str::to_owned),
            ..Default::default()
        }
    }

    fn set_keys_error(changes: Vec<pb::KeyChange>) -> String {
        let err = set_keys_request(&pb::SetIdempotencyKeysReq { changes })
            .expect_err("the changes should be rejected");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        err.message().to_owned()
    }

    #[test]
    fn new_identities_are_checked_like_new_keys() {
        let changes = set_keys_request(&pb::SetIdempotencyKeysReq {
            changes: vec![
                key_change("a", None),
                key_change("b", Some("")),
                key_change("c", Some("")),
                key_change("d", Some("ns/d")),
            ],
        })
        .expect("unset, cleared twice and set are all valid");
        let identities: Vec<_> = changes.iter().map(|c| c.new_identity.as_deref()).collect();
        assert_eq!(identities, [None, Some(""), Some(""), Some("ns/d")]);

        let msg = set_keys_error(vec![
            key_change("a", None),
            key_change("b", Some(&"x".repeat(MAX_IDENTITY_CHARS + 1))),
        ]);
        assert_eq!(
            msg,
            "changes[1].new_identity: must be at most 320 characters, got 321"
        );
        let msg = set_keys_error(vec![
            key_change("a", Some("ns/x")),
            key_change("b", Some("ns/y")),
            key_change("c", Some("ns/x")),
        ]);
        assert_eq!(
            msg,
            "changes[2].new_identity: identity \"ns/x\" is given to more than one pet in this request"
        );
    }

    #[test]
    fn looked_up_identities_are_checked() {
        let get = |identities: Vec<String>| {
            get_request(&pb::GetPetsReq {
                identities,
                ..Default::default()
            })
        };
        assert!(get(vec![String::new(), "x".repeat(MAX_IDENTITY_CHARS)]).is_ok());
        let mut identities = vec!["ns/a".to_owned(); 3];
        identities.push("x".repeat(MAX_IDENTITY_CHARS + 1));
        let err = get(identities).expect_err("too long");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            err.message(),
            "identities[3]: must be at most 320 characters, got 321"
        );
        let err = get(vec![String::new(); MAX_BATCH + 1]).expect_err("too many");
        assert_eq!(
            err.message(),
            "identities: at most 1000 entries per request, got 1001"
        );
        // Keys are not checked, as before identities existed.
        assert!(
            get_request(&pb::GetPetsReq {
                idempotency_keys: vec!["k".repeat(MAX_KEY_CHARS + 1)],
                ..Default::default()
            })
            .is_ok()
        );
    }

    #[test]
    fn a_claim_names_the_field_it_refuses() {
        let valid = pb::ClaimInstallationReq {
            installation: "blue".into(),
            holder: "5f1c".into(),
            ttl_seconds: 60,
        };
        let claim = claim_request(&valid).expect("valid");
        assert_eq!(
            (
                claim.installation.as_str(),
                claim.holder.as_str(),
                claim.ttl_seconds
            ),
            ("blue", "5f1c", 60)
        );
        let refused = |req: pb::ClaimInstallationReq| {
            let err = claim_request(&req).expect_err("refused");
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            err.message().to_owned()
        };
        for (req, message) in [
            (
                pb::ClaimInstallationReq {
                    installation: String::new(),
                    ..valid.clone()
                },
                "installation: is required",
            ),
            (
                pb::ClaimInstallationReq {
                    holder: String::new(),
                    ..valid.clone()
                },
                "holder: is required",
            ),
            (
                pb::ClaimInstallationReq {
                    holder: "h".repeat(129),
                    ..valid.clone()
                },
                "holder: must be at most 128 characters, got 129",
            ),
            (
                pb::ClaimInstallationReq {
                    installation: "i".repeat(129),
                    ..valid.clone()
                },
                "installation: must be at most 128 characters, got 129",
            ),
            (
                pb::ClaimInstallationReq {
                    ttl_seconds: 0,
                    ..valid.clone()
                },
                "ttl_seconds: must be 1 to 3600, got 0",
            ),
            (
                pb::ClaimInstallationReq {
                    ttl_seconds: 3601,
                    ..valid.clone()
                },
                "ttl_seconds: must be 1 to 3600, got 3601",
            ),
            (
                pb::ClaimInstallationReq {
                    ttl_seconds: -5,
                    ..valid.clone()
                },
                "ttl_seconds: must be 1 to 3600, got -5",
            ),
        ] {
            assert_eq!(refused(req), message);
        }
        // The limits are inclusive.
        for ttl_seconds in [1, 3600] {
            claim_request(&pb::ClaimInstallationReq {
                ttl_seconds,
                holder: "h".repeat(128),
                ..valid.clone()
            })
            .expect("at the limits");
        }
    }
}
