//! Pets read as the operator's own type. A status field the tests read is
//! then one the operator writes: renamed or retyped, the tests stop
//! compiling, where a raw JSON read would quietly see null.

use std::time::{Duration, Instant};

use fixtures::{ControlPlane, Error, Result};
use petstore_operator::crd::{Condition, Pet, PetStatus};
use serde_json::Value;

/// How often [`wait_pet`] reads the Pet, as `fixtures::wait_for` polls.
const POLL: Duration = Duration::from_millis(200);

/// The Pet as the API server serves it in v1, the version the tests write.
pub fn pet(cp: &ControlPlane, namespace: &str, name: &str) -> Result<Pet> {
    from_value(cp.pet(namespace, name)?)
}

/// A Pet the test already holds as JSON (from a list, or a patch's answer).
pub fn from_value(value: Value) -> Result<Pet> {
    serde_json::from_value(value).map_err(|e| Error::Api(format!("not a v1 Pet: {e}")))
}

/// Every Pet in `namespace` (all namespaces when `None`), in v1.
pub fn pets(cp: &ControlPlane, namespace: Option<&str>) -> Result<Vec<Pet>> {
    let path = match namespace {
        Some(ns) => format!("/apis/petstore.example.com/v1/namespaces/{ns}/pets"),
        None => "/apis/petstore.example.com/v1/pets".to_owned(),
    };
    let mut list = cp.get(&path)?;
    match list["items"].take() {
        Value::Array(items) => items.into_iter().map(from_value).collect(),
        other => Err(Error::Api(format!("{path}: no items: {other}"))),
    }
}

/// Ready=True for the Pet's current generation, with an ID in status.
pub fn is_ready(pet: &Pet) -> bool {
    status_is_ready(pet.status.as_ref(), pet.metadata.generation)
}

/// [`is_ready`] for a status read in any version (v1alpha1 has the same
/// status), of an object at `generation`.
pub fn status_is_ready(status: Option<&PetStatus>, generation: Option<i64>) -> bool {
    status.is_some_and(|status| {
        status.id.is_some()
            && status
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .is_some_and(|c| c.status == "True" && c.observed_generation == generation)
    })
}

/// `status.id`, when set. Unlike `Pet::status_id`, an empty ID is shown as
/// it is: a test that wants no ID must not pass on one written empty.
pub fn id(pet: &Pet) -> Option<&str> {
    pet.status.as_ref()?.id.as_deref()
}

/// `status.observedGeneration`, when set.
pub fn observed_generation(pet: &Pet) -> Option<i64> {
    pet.status.as_ref()?.observed_generation
}

/// Reads the Pet until `check` returns `Some`, and returns that. After
/// `timeout` it fails, naming `what` and showing the last Pet read (or why
/// none could be), so a failed wait says where the Pet got stuck.
pub fn wait_pet<T>(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    timeout: Duration,
    what: &str,
    mut check: impl FnMut(&Pet) -> Option<T>,
) -> Result<T> {
    let read = || cp.pet(namespace, name);
    poll(read, &subject(namespace, name), timeout, what, |pet, _| {
        check(pet)
    })
}

/// As [`wait_pet`] with a yes-or-no check, returning the Pet as the API
/// server served it: for tests that hand the object itself to another tool.
pub fn wait_pet_served(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    timeout: Duration,
    what: &str,
    mut accept: impl FnMut(&Pet) -> bool,
) -> Result<Value> {
    let read = || cp.pet(namespace, name);
    poll(
        read,
        &subject(namespace, name),
        timeout,
        what,
        |pet, served| accept(pet).then(|| served.clone()),
    )
}

fn subject(namespace: &str, name: &str) -> String {
    format!("Pet {namespace}/{name}")
}

/// The loop of the waits: `read` serves the Pet as JSON, `check` sees it
/// typed and as served.
fn poll<T>(
    mut read: impl FnMut() -> Result<Value>,
    subject: &str,
    timeout: Duration,
    what: &str,
    mut check: impl FnMut(&Pet, &Value) -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let read = read().and_then(|served| Ok((from_value(served.clone())?, served)));
        let last = match read {
            Ok((pet, served)) => match check(&pet, &served) {
                Some(value) => return Ok(value),
                None => shown(&pet),
            },
            Err(e) => format!("no Pet read: {e}"),
        };
        if Instant::now() >= deadline {
            return Err(Error::Timeout(
                timeout,
                format!("{subject} {what}; last seen: {last}"),
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Waits until the Pet is Ready for its current generation, and returns its
/// ID.
pub fn wait_ready(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<String> {
    wait_pet(cp, namespace, name, timeout, "Ready", |pet| {
        is_ready(pet).then(|| id(pet).map(str::to_owned))?
    })
}

/// Waits until the Pet is being deleted and its Synced condition, of the
/// current generation, passes `accept`; returns the condition's message.
pub fn wait_deleting(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    timeout: Duration,
    accept: impl Fn(&Condition) -> bool,
) -> Result<String> {
    let what = "deleting, Synced as expected";
    wait_pet(cp, namespace, name, timeout, what, |pet| {
        let synced = pet.condition("Synced")?;
        // Setting deletionTimestamp bumps the generation: a condition of
        // the generation before is the one from before the deletion.
        let current = synced.observed_generation == pet.metadata.generation;
        (pet.metadata.deletion_timestamp.is_some() && current && accept(synced))
            .then(|| synced.message.clone())
    })
}

/// The parts of a Pet a failed wait needs: generation, deletion, status.
pub fn shown(pet: &Pet) -> String {
    let status = serde_json::to_string(&pet.status).unwrap_or_else(|e| e.to_string());
    format!(
        "generation {:?}, deleting {}, status {status}",
        pet.metadata.generation,
        pet.metadata.deletion_timestamp.is_some()
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A Pet at generation 2 whose Ready condition is `ready` for
    /// `observed`, with `id` in its status.
    fn served(ready: &str, observed: i64, id: Option<&str>) -> Value {
        json!({
            "apiVersion": "petstore.example.com/v1",
            "kind": "Pet",
            "metadata": {"name": "rex", "namespace": "default", "generation": 2},
            "spec": {"name": "Rex", "type": "dog", "birthday": "2021-04-01"},
            "status": {
                "id": id,
                "conditions": [{
                    "type": "Ready",
                    "status": ready,
                    "reason": if ready == "True" { "ReconcileSuccess" } else { "StoreUnavailable" },
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                    "observedGeneration": observed,
                }],
            },
        })
    }

    #[test]
    fn ready_means_ready_true_for_the_current_generation_with_an_id() -> Result<()> {
        assert!(is_ready(&from_value(served("True", 2, Some("r-1")))?));
        assert!(
            !is_ready(&from_value(served("True", 1, Some("r-1")))?),
            "an older generation's"
        );
        assert!(!is_ready(&from_value(served("True", 2, None))?), "no ID");
        assert!(!is_ready(&from_value(served("False", 2, Some("r-1")))?));
        Ok(())
    }

    #[test]
    fn a_wait_that_times_out_shows_the_last_pet_it_read() {
        let pet = served("False", 2, Some("r-1"));
        let waited = poll(
            || Ok(pet.clone()),
            "Pet default/rex",
            Duration::ZERO,
            "Ready",
            |pet, _| is_ready(pet).then_some(()),
        );
        let message = waited.map_err(|e| e.to_string()).expect_err("never Ready");
        assert!(
            message.contains("Pet default/rex Ready; last seen: generation Some(2)")
                && message.contains("StoreUnavailable"),
            "{message}"
        );
        let unread: Result<()> = poll(
            || Err(Error::Api("not found".into())),
            "Pet default/rex",
            Duration::ZERO,
            "Ready",
            |_, _| Some(()),
        );
        let message = unread.map_err(|e| e.to_string()).expect_err("nothing read");
        assert!(
            message.contains("no Pet read: API server: not found"),
            "{message}"
        );
    }
}
