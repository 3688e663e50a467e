//! Scenarios 6 and 8: the API server rejects bad Pets with messages that name
//! the field, and deleting a namespace full of Pets completes. And
//! `kubectl wait --for=condition=Ready` after an update waits for it.

use std::time::Duration;

use fixtures::{Env, Storage, wait_for};

use crate::typed;

const TIMEOUT: Duration = Duration::from_secs(60);

fn pet_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: petstore.example.com/v1alpha1\nkind: Pet\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n{spec}"
    )
}

#[test]
fn invalid_pets_are_rejected_with_the_field_named_and_reach_nothing() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;
    let long_name = "x".repeat(129);
    let cases: Vec<(&str, String, &[&str])> = vec![
        (
            "fish",
            "  name: Nemo\n  type: fish\n  birthday: 2021-04-01T00:00:00Z\n".into(),
            &["spec.type", "Unsupported value: \"fish\"", "\"dog\""],
        ),
        (
            "empty-name",
            "  name: \"\"\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n".into(),
            &["spec.name"],
        ),
        (
            "blank-name",
            "  name: \"   \"\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n".into(),
            &["spec.name"],
        ),
        (
            "long-name",
            format!("  name: {long_name}\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n"),
            &["spec.name", "128"],
        ),
        (
            "no-birthday",
            "  name: Thor\n  type: dog\n".into(),
            &["spec.birthday", "Required value"],
        ),
        (
            "bad-birthday",
            "  name: Thor\n  type: dog\n  birthday: next tuesday\n".into(),
            &["spec.birthday", "date-time"],
        ),
        (
            "no-type",
            "  name: Thor\n  birthday: 2021-04-01T00:00:00Z\n".into(),
            &["spec.type", "Required value"],
        ),
        (
            "typed-name",
            "  name: 42\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n".into(),
            &["spec.name", "string"],
        ),
        (
            "date-only-birthday",
            "  name: Thor\n  type: dog\n  birthday: 2021-04-01\n".into(),
            &["spec.birthday", "date-time"],
        ),
        (
            // The schema's date-time format takes year 0; no store keeps it.
            "year-zero",
            "  name: Thor\n  type: dog\n  birthday: 0000-06-01T00:00:00Z\n".into(),
            &["spec.birthday", "year 1 or later"],
        ),
        (
            "capital-type",
            "  name: Thor\n  type: Dog\n  birthday: 2021-04-01T00:00:00Z\n".into(),
            &["spec.type", "Unsupported value: \"Dog\""],
        ),
        (
            "typed-type",
            "  name: Thor\n  type: [dog]\n  birthday: 2021-04-01T00:00:00Z\n".into(),
            &["spec.type", "string"],
        ),
        (
            "unknown-field",
            "  name: Thor\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n  colour: brown\n".into(),
            &["colour"],
        ),
    ];
    for (name, spec, expected) in cases {
        let err = match env.cp.apply(&pet_yaml(name, &spec)) {
            Ok(out) => panic!("{name}: accepted ({out})"),
            Err(err) => err.to_string(),
        };
        for fragment in expected {
            assert!(err.contains(fragment), "{name}: {fragment:?} not in {err}");
        }
        assert!(
            env.cp.kubectl(&["get", "pet", name]).is_err(),
            "{name} stored"
        );
    }
    // The same rule in v1, whose birthday is a date.
    let err = env
        .cp
        .apply("apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: year-zero-v1\n  namespace: default\nspec:\n  name: Thor\n  type: dog\n  birthday: \"0000-12-31\"\n")
        .expect_err("year 0 in v1");
    assert!(
        err.to_string().contains("spec.birthday") && err.to_string().contains("year 1 or later"),
        "{err}"
    );
    // A Pet without any spec.
    let err = env
        .cp
        .apply("apiVersion: petstore.example.com/v1alpha1\nkind: Pet\nmetadata:\n  name: no-spec\n")
        .expect_err("no spec");
    assert!(err.to_string().contains("spec: Required value"), "{err}");

    // Without strict field validation, unknown fields are pruned, never stored.
    env.cp.kubectl_stdin(
        &["apply", "--validate=false", "-f", "-"],
        &pet_yaml(
            "pruned",
            "  name: Thor\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n  colour: brown\n",
        ),
    )?;
    let stored = env.pet("default", "pruned")?;
    assert!(stored["spec"].get("colour").is_none(), "{stored}");
    env.cp
        .kubectl(&["delete", "pet", "pruned", "--wait=true", "--timeout=60s"])?;

    // A valid Pet still works, so the rejections were about the input.
    env.cp.apply(&pet_yaml(
        "valid",
        "  name: Thor\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n",
    ))?;
    env.wait_ready("default", "valid", TIMEOUT)?;
    let pets = env.store_pets()?;
    assert_eq!(pets.len(), 1, "only the valid Pet reached the store");
    Ok(())
}

#[test]
fn deleting_a_namespace_full_of_pets_completes_and_empties_the_store() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;
    env.cp.ensure_namespace("zoo")?;
    let mut yaml = String::new();
    for n in 0..5 {
        yaml.push_str(&format!(
            "---\napiVersion: petstore.example.com/v1alpha1\nkind: Pet\nmetadata:\n  name: pet-{n}\n  namespace: zoo\nspec:\n  name: Animal {n}\n  type: bird\n  birthday: 2020-01-0{}T00:00:00Z\n",
            n + 1
        ));
    }
    env.cp.apply(&yaml)?;
    for n in 0..5 {
        env.wait_ready("zoo", &format!("pet-{n}"), TIMEOUT)?;
    }
    // One Pet outside the namespace must survive.
    env.cp.apply(&pet_yaml(
        "bystander",
        "  name: Rex\n  type: reptile\n  birthday: 2019-05-05T00:00:00Z\n",
    ))?;
    env.wait_ready("default", "bystander", TIMEOUT)?;
    assert_eq!(env.store_pets()?.len(), 6);

    env.cp
        .kubectl(&["delete", "namespace", "zoo", "--wait=true", "--timeout=90s"])?;
    wait_for(TIMEOUT, "namespace zoo to disappear", || {
        matches!(env.cp.get_if_found("/api/v1/namespaces/zoo"), Ok(None)).then_some(())
    })?;
    let left = env.store_pets()?;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["name"], "Rex");
    Ok(())
}

/// `kubectl wait --for=condition=Ready` right after an update waits for
/// that update: Ready carries the `observedGeneration` it was set for, and
/// kubectl does not take a condition of an older generation. With the
/// operator stopped, the wait times out on the Ready of the previous
/// generation; once it runs, the wait returns with the record renamed.
#[test]
fn kubectl_wait_for_ready_waits_for_the_update_just_made() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let mut operator = env.start_operator("operator")?;
    env.cp.apply(&pet_yaml(
        "rex",
        "  name: Rex\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n",
    ))?;
    let id = env.wait_ready("default", "rex", TIMEOUT)?;
    let wait = |timeout: &str| {
        env.cp.kubectl(&[
            "wait",
            "--for=condition=Ready",
            "pet/rex",
            "-n",
            "default",
            &format!("--timeout={timeout}"),
        ])
    };
    wait("5s")?;

    operator.kill();
    env.rename("default", "rex", "Rexford")?;
    let pet = typed::pet(&env.cp, "default", "rex")?;
    let shown = typed::shown(&pet);
    let ready = pet.condition("Ready").expect("a Ready condition");
    assert_eq!(ready.status, "True", "the previous generation's: {shown}");
    assert_eq!(ready.observed_generation, Some(1), "{shown}");
    let early = wait("5s");
    assert!(
        early
            .as_ref()
            .is_err_and(|err| err.to_string().contains("timed out")),
        "kubectl wait took generation 1's Ready for generation 2's: {early:?}"
    );

    let _operator = env.start_operator("operator-2")?;
    wait("60s")?;
    let record = env.store.grpcurl(
        "petstore.PetStore/GetPets",
        &format!(r#"{{"ids":["{id}"]}}"#),
    )?;
    assert_eq!(record[0]["pets"][0]["name"], "Rexford", "{record:?}");
    Ok(())
}
