//! The guard on the Pet CRD's deletion (`POST /guard-crd-deletion`, named
//! by `config/operator/crd-guard.yaml`): deleting the CRD deletes every
//! Pet, and a Pet deleted under the Delete policy takes its store record
//! with it. So the deletion is refused while Pets exist, unless the CRD
//! carries [`CONFIRM_DELETE_PETS_ANNOTATION`] with the number of Pets there
//! are now (a confirmation given for fewer Pets does not pass), and always
//! while a protected Pet exists.
//!
//! A webhook, not a ValidatingAdmissionPolicy: a policy cannot count
//! objects. Its `failurePolicy: Fail` keeps the CRD when no operator
//! answers. Only the fields read are parsed, so a review from a newer API
//! server still reads.

use std::future::Future;

use kube::ResourceExt;
use kube::api::Api;
use serde::Deserialize;
use serde_json::Value;

use super::{admission_answer as answer, admission_request, pets_by_page};
use crate::crd::{CONFIRM_DELETE_PETS_ANNOTATION, CRD_NAME, PROTECTED_ANNOTATION, Pet};

/// The Pets there are, and how many of them are protected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PetCount {
    pub pets: usize,
    pub protected: usize,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    uid: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    old_object: Option<Value>,
}

/// Answers one `AdmissionReview` body; `count` is called only for a
/// deletion of the Pet CRD. Never fails: a body that cannot be read is
/// refused with the reason, which the API server passes on to the user.
pub async fn review<F>(body: &[u8], count: impl FnOnce() -> F) -> Value
where
    F: Future<Output = Result<PetCount, String>>,
{
    let request: Request = match admission_request(body) {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    if request.name != CRD_NAME || request.operation != "DELETE" {
        return answer(&request.uid, Ok(()));
    }
    let confirmation = request
        .old_object
        .as_ref()
        .and_then(|crd| crd["metadata"]["annotations"][CONFIRM_DELETE_PETS_ANNOTATION].as_str())
        .map(str::to_owned);
    let verdict = match count().await {
        Ok(count) => judge(confirmation.as_deref(), count),
        Err(err) => Err(format!(
            "refusing to delete the Pet CRD {CRD_NAME}: the Pets could not be counted ({err}), and deleting the CRD deletes every Pet"
        )),
    };
    match &verdict {
        Ok(()) => tracing::warn!(
            crd = CRD_NAME,
            confirmation,
            "the Pet CRD may be deleted: allowed"
        ),
        Err(message) => tracing::info!(crd = CRD_NAME, %message, "refused to delete the Pet CRD"),
    }
    answer(&request.uid, verdict)
}

/// Whether a deletion of the CRD that carries `confirmation` may go on;
/// `Err` says why not and what to do.
pub fn judge(confirmation: Option<&str>, count: PetCount) -> Result<(), String> {
    let PetCount { pets, protected } = count;
    if pets == 0 {
        return Ok(());
    }
    let refusing = format!("refusing to delete the Pet CRD {CRD_NAME}: {pets} Pets exist");
    if protected > 0 {
        return Err(format!(
            "{refusing}, {protected} of them protected ({PROTECTED_ANNOTATION}: \"true\"), and deleting the CRD deletes every Pet. Remove that annotation from them first (kubectl get pets -A shows which are there)"
        ));
    }
    let how = format!(
        "To keep the store records, delete the Pets with spec.deletionPolicy: Orphan first (see the README's uninstall section). To delete the Pets and, under their Delete policy, their records, confirm the number: kubectl annotate crd {CRD_NAME} {CONFIRM_DELETE_PETS_ANNOTATION}={pets} --overwrite, then delete the CRD again"
    );
    match confirmation {
        None => Err(format!(
            "{refusing}, and deleting the CRD deletes every one of them and the store records of those whose deletion policy is Delete. {how}"
        )),
        Some(given) if given.trim().parse::<usize>() == Ok(pets) => Ok(()),
        Some(given) => Err(format!(
            "{refusing}, but the confirmation {CONFIRM_DELETE_PETS_ANNOTATION} says {given:?}. {how}"
        )),
    }
}

/// Counts the Pets in every namespace from the API server itself (a page
/// of metadata at a time), not a cache: a Pet created a moment ago counts.
pub async fn count(pets: Api<Pet>) -> Result<PetCount, String> {
    let (pets, mut count) = (&pets, PetCount::default());
    pets_by_page(
        |params| async move { pets.list_metadata(&params).await },
        |page| {
            count.pets += page.len();
            count.protected += page
                .iter()
                .filter(|pet| {
                    pet.annotations()
                        .get(PROTECTED_ANNOTATION)
                        .is_some_and(|value| value.eq_ignore_ascii_case("true"))
                })
                .count();
        },
    )
    .await?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deletion(annotations: Value) -> Vec<u8> {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "name": CRD_NAME,
                "operation": "DELETE",
                "oldObject": {"metadata": {"name": CRD_NAME, "annotations": annotations}},
            },
        })
        .to_string()
        .into_bytes()
    }

    fn counted(pets: usize, protected: usize) -> Result<PetCount, String> {
        Ok(PetCount { pets, protected })
    }

    /// Name, the CRD's annotations, the count, allowed, and what a refusal says.
    type Case = (
        &'static str,
        Value,
        Result<PetCount, String>,
        bool,
        &'static str,
    );

    #[tokio::test]
    async fn refuses_unless_the_confirmation_names_the_number_of_pets_there_are() {
        let confirm = |n: &str| json!({ CONFIRM_DELETE_PETS_ANNOTATION: n });
        let cases: Vec<Case> = vec![
            ("no Pets", json!({}), counted(0, 0), true, ""),
            (
                "Pets, no confirmation",
                json!({}),
                counted(200, 0),
                false,
                "=200",
            ),
            ("the right count", confirm("200"), counted(200, 0), true, ""),
            (
                "a stale count",
                confirm("150"),
                counted(200, 0),
                false,
                "says \"150\"",
            ),
            ("not a number", confirm("all"), counted(3, 0), false, "=3"),
            (
                "a protected Pet, even confirmed",
                confirm("3"),
                counted(3, 1),
                false,
                "1 of them protected",
            ),
            (
                "Pets not countable",
                json!({}),
                Err("timeout".into()),
                false,
                "could not be counted (timeout)",
            ),
        ];
        for (name, annotations, count, allowed, says) in cases {
            let answer = review(&deletion(annotations), || async { count }).await;
            let response = &answer["response"];
            assert_eq!(response["uid"], "u-1", "{name}");
            assert_eq!(response["allowed"], allowed, "{name}: {answer}");
            if !allowed {
                let message = response["status"]["message"].as_str().unwrap_or_default();
                assert!(message.contains(says), "{name}: {message}");
                assert_eq!(response["status"]["code"], 403, "{name}");
            }
        }
    }

    #[tokio::test]
    async fn counts_only_for_a_deletion_of_the_pet_crd() {
        for (name, operation) in [(CRD_NAME, "UPDATE"), ("other.example.com", "DELETE")] {
            let body = json!({"request": {"uid": "u-2", "name": name, "operation": operation}});
            let answer = review(body.to_string().as_bytes(), || async {
                panic!("counted Pets for {name} {operation}")
            })
            .await;
            assert_eq!(answer["response"]["allowed"], true, "{name} {operation}");
        }
    }

    #[tokio::test]
    async fn a_malformed_review_is_refused_not_a_panic() {
        let answer = review(b"{not json", || async { counted(0, 0) }).await;
        assert_eq!(answer["response"]["allowed"], false);
        assert!(
            answer["response"]["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("not an AdmissionReview"))
        );
    }
}
