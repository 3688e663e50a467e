//! The conversion webhook: every replica serves `POST /convert` over HTTPS
//! (leader or not), so the API server can read and write v1alpha1 Pets
//! while only v1 is stored.
//!
//! - this module: the `ConversionReview` in, `ConversionReview` out, as a
//!   pure function ([`review`]) over [`crate::crd::conversion`];
//! - [`server`]: the HTTPS listener, whose certificate can be swapped
//!   without a restart;
//! - [`certs`]: the CA and serving certificate, kept in a Secret that all
//!   replicas share, and the CA bundle in the CRD;
//! - [`cert_files`]: or the serving certificate from files
//!   (`--webhook-cert-dir`, cert-manager's), followed as they change;
//! - [`guard`]: the same server's second route, which refuses to delete the
//!   Pet CRD while Pets exist unless the deletion is confirmed;
//! - [`store_guard`]: its third, which refuses to delete a PetStore or
//!   ClusterPetStore while Pets use it.

pub mod cert_files;
pub mod certs;
pub mod guard;
pub mod server;
pub mod store_guard;

use kube::api::{ListParams, ObjectList};
use kube::core::Status;
use kube::core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::crd::conversion::{self, ConversionError};

/// Answers one `ConversionReview` body. Never fails: what cannot be read
/// or converted is answered with `result.status: Failure` and a message
/// the API server passes on to the user.
pub fn review(body: &[u8]) -> ConversionReview {
    let review: ConversionReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(err) => {
            return invalid(format!("the body is not a ConversionReview: {err}"));
        }
    };
    let mut request = match ConversionRequest::from_review(review) {
        Ok(request) => request,
        Err(err) => return invalid(err.to_string()),
    };
    let desired = request.desired_api_version.clone();
    if desired != conversion::V1 && desired != conversion::V1ALPHA1 {
        let message = ConversionError::UnknownTargetVersion(desired).to_string();
        tracing::warn!(%message, "conversion refused");
        return ConversionResponse::for_request(request)
            .failure(Status::failure(&message, "ConversionFailed"))
            .into_review();
    }
    // The response needs only the request's uid: the objects move out.
    let objects = std::mem::take(&mut request.objects);
    let response = ConversionResponse::for_request(request);
    let response = match convert_all(objects, &desired) {
        Ok(converted) => response.success(converted),
        Err(message) => {
            tracing::warn!(%message, %desired, "conversion refused");
            response.failure(Status::failure(&message, "ConversionFailed"))
        }
    };
    response.into_review()
}

fn invalid(message: String) -> ConversionReview {
    tracing::warn!(%message, "malformed ConversionReview");
    ConversionResponse::invalid(Status::failure(&message, "BadRequest")).into_review()
}

/// Converts every object, or names the first that cannot be: the API
/// server needs them all or none.
fn convert_all(objects: Vec<Value>, desired: &str) -> Result<Vec<Value>, String> {
    objects
        .into_iter()
        .map(|object| {
            let name = describe(&object);
            conversion::convert(object, desired)
                .map_err(|err: ConversionError| format!("Pet {name}: {err}"))
        })
        .collect()
}

/// `namespace/name` of an object, for messages.
fn describe(object: &Value) -> String {
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or("(unnamed)");
    match metadata["namespace"].as_str() {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

/// The request of one `AdmissionReview` body, as the deletion guard reads
/// it; or, when the body is no `AdmissionReview`, the refusal to answer.
fn admission_request<R: DeserializeOwned>(body: &[u8]) -> Result<R, Value> {
    #[derive(Deserialize)]
    struct Review<R> {
        request: R,
    }
    serde_json::from_slice::<Review<R>>(body)
        .map(|review| review.request)
        .map_err(|err| {
            tracing::warn!(error = %err, "malformed AdmissionReview");
            admission_answer(
                "",
                Err(format!("the body is not an AdmissionReview: {err}")),
            )
        })
}

/// Lists Pets from the API server itself, not a cache (a Pet created a
/// moment ago counts), a page at a time: `list` reads the page `params`
/// asks for, and `each` is handed its items.
async fn pets_by_page<T: Clone, F>(
    mut list: impl FnMut(ListParams) -> F,
    mut each: impl FnMut(Vec<T>),
) -> Result<(), String>
where
    F: Future<Output = Result<ObjectList<T>, kube::Error>>,
{
    let mut params = ListParams::default().limit(500);
    loop {
        let page = list(params.clone())
            .await
            .map_err(|err| format!("listing Pets: {err}"))?;
        each(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(()),
        }
    }
}

/// The `AdmissionReview` answer of the deletion guards: allowed, or
/// refused (403) with the message a person reads in kubectl.
fn admission_answer(uid: &str, verdict: Result<(), String>) -> Value {
    let response = match verdict {
        Ok(()) => json!({ "uid": uid, "allowed": true }),
        Err(message) => json!({
            "uid": uid,
            "allowed": false,
            "status": { "code": 403, "reason": "Forbidden", "message": message },
        }),
    };
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

#[cfg(test)]
mod tests {
    use kube::core::response::StatusSummary;
    use serde_json::json;

    use super::*;
    use crate::crd::conversion::{V1, V1ALPHA1};

    fn request(desired: &str, objects: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "ConversionReview",
            "request": {"uid": "req-1", "desiredAPIVersion": desired, "objects": objects},
        }))
        .expect("serialisable")
    }

    /// A review asking for these v1alpha1 Pets, by name and birthday, in v1.
    fn alpha_pets_to_v1(pets: &[(&str, &str)]) -> Vec<u8> {
        let objects: Vec<Value> = pets
            .iter()
            .map(|(name, birthday)| {
                json!({
                    "apiVersion": V1ALPHA1, "kind": "Pet",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"name": "Thor", "type": "dog", "birthday": birthday},
                })
            })
            .collect();
        request(V1, Value::Array(objects))
    }

    /// The response as the API server reads it.
    fn answer(body: &[u8]) -> Value {
        serde_json::to_value(review(body)).expect("serialisable")
    }

    #[test]
    fn converts_every_object_and_echoes_the_uid() {
        let body = alpha_pets_to_v1(&[
            ("a", "2021-04-01T00:00:00Z"),
            ("b", "2021-04-01T23:30:00-05:00"),
        ]);
        let answer = answer(&body);
        assert_eq!(answer["apiVersion"], "apiextensions.k8s.io/v1");
        assert_eq!(answer["kind"], "ConversionReview");
        let response = &answer["response"];
        assert_eq!(response["uid"], "req-1");
        assert_eq!(response["result"]["status"], "Success");
        let converted = response["convertedObjects"].as_array().expect("objects");
        assert_eq!(converted.len(), 2);
        assert_eq!(converted[0]["apiVersion"], V1);
        assert_eq!(converted[1]["spec"]["birthday"], "2021-04-01");
        assert_eq!(converted[1]["metadata"]["name"], "b");
    }

    #[test]
    fn an_object_that_cannot_be_converted_fails_the_review_with_its_name() {
        let body = alpha_pets_to_v1(&[("fine", "2021-04-01T00:00:00Z"), ("odd", "next tuesday")]);
        let review = review(&body);
        let response = review.response.expect("a response");
        assert_eq!(response.uid, "req-1");
        assert_eq!(response.result.status, Some(StatusSummary::Failure));
        assert!(
            response.result.message.contains("default/odd")
                && response.result.message.contains("next tuesday"),
            "{}",
            response.result.message
        );
        assert!(response.converted_objects.is_empty());
    }

    #[test]
    fn malformed_reviews_get_a_failure_not_a_panic() {
        let no_request = serde_json::to_vec(&json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview"
        }))
        .expect("serialisable");
        let unknown_version = request("petstore.example.com/v2", json!([]));
        let not_a_pet = request(V1, json!([{"apiVersion": "v1", "kind": "ConfigMap"}]));
        let objects_not_a_list = request(V1, json!({"a": 1}));
        for (what, body) in [
            ("empty", Vec::new()),
            ("not JSON", b"{\"kind\": ".to_vec()),
            ("a JSON string", b"\"hello\"".to_vec()),
            ("no request", no_request),
            ("unknown target version", unknown_version),
            ("not a Pet", not_a_pet),
            ("objects not a list", objects_not_a_list),
            ("binary", vec![0xff, 0xfe, 0x00]),
        ] {
            let answer = answer(&body);
            assert_eq!(
                answer["response"]["result"]["status"], "Failure",
                "{what}: {answer}"
            );
            assert!(
                answer["response"]["result"]["message"]
                    .as_str()
                    .is_some_and(|m| !m.is_empty()),
                "{what}: {answer}"
            );
            assert_eq!(answer["kind"], "ConversionReview", "{what}");
        }
    }
}
