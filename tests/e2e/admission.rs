//! config/admission on the real API server: the ValidatingAdmissionPolicy
//! refuses a Pet whose annotations the operator would not accept, naming
//! the annotation and its allowed values, in every served version; accepts
//! every value the operator accepts; refuses on UPDATE only a bad value
//! that the update adds or changes (ratcheting); and keeps a Pet's deletion
//! policy fixed once it is being deleted, but for a change to Orphan, which
//! is how a deletion waiting on the book's store is let go. A protected
//! Pet is refused deletion, by name, in bulk and by its namespace's
//! deletion, and its record stays until the annotation goes.

use std::time::Duration;

use fixtures::env::pet_metadata;
use fixtures::{ControlPlane, Env, Storage, repo_root, wait_for};
use serde_json::{Value, json};

use crate::typed;

const PAUSED: &str = "petstore.example.com/paused";
const DELETION_POLICY: &str = "petstore.example.com/deletion-policy";
const EXTERNAL_ID: &str = "petstore.example.com/external-id";
const APPROVE_PLAN: &str = "petstore.example.com/approve-plan";
const HAND_OVER_TO: &str = "petstore.example.com/hand-over-to";
const PROTECTED: &str = "petstore.example.com/protected";
/// An ID as the store mints them.
const RECORD_ID: &str = "0b3a5f1e-7c2d-4e8f-9a6b-1c2d3e4f5a6b";
/// A finalizer of the test's own, which keeps a deleted Pet in view.
const HOLD: &str = "test.petstore.example.com/hold";
/// How long the API server may take to start enforcing a new policy.
const POLICY_ACTIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// A JSON patch that drops every finalizer.
const REMOVE_FINALIZERS: &str = r#"[{"op":"remove","path":"/metadata/finalizers"}]"#;

fn pet_yaml(name: &str, annotations: &[(&str, &str)], finalizers: &[&str]) -> String {
    let mut yaml = pet_metadata("v1alpha1", name, annotations);
    if !finalizers.is_empty() {
        yaml.push_str("  finalizers:\n");
        for finalizer in finalizers {
            yaml.push_str(&format!("    - {finalizer}\n"));
        }
    }
    yaml.push_str("spec:\n  name: Thor\n  type: dog\n  birthday: 2021-04-01T00:00:00Z\n");
    yaml
}

/// Installs config/admission and waits until the API server enforces it.
fn install_policy(cp: &ControlPlane) -> fixtures::Result<()> {
    let admission = repo_root().join("config/admission");
    cp.kubectl(&["apply", "-k", &admission.to_string_lossy()])?;
    // The API server enforces a new policy once its informer has it; a
    // server-side dry run stores nothing while the probe waits.
    // In this process: it polls.
    let probe: serde_json::Value =
        serde_norway::from_str(&pet_yaml("probe", &[(PAUSED, "yes")], &[]))
            .expect("the probe Pet is YAML");
    let namespace = probe["metadata"]["namespace"].as_str().unwrap_or("default");
    let pets = format!("/apis/petstore.example.com/v1alpha1/namespaces/{namespace}/pets");
    wait_for(POLICY_ACTIVE_TIMEOUT, "the policy to be enforced", || {
        cp.dry_run_create(&pets, &probe)
            .ok()
            .flatten()
            .filter(|refusal| refusal.contains(PAUSED))
    })?;
    Ok(())
}

/// `kubectl patch pet <pet> --type=<kind> -p <patch>` in default.
fn patch(cp: &ControlPlane, pet: &str, kind: &str, patch: &str) -> fixtures::Result<String> {
    cp.patch_pet("default", pet, &[&format!("--type={kind}"), "-p", patch])
}

fn patch_spec(cp: &ControlPlane, pet: &str, spec: &str) -> fixtures::Result<String> {
    patch(cp, pet, "merge", &format!(r#"{{"spec":{spec}}}"#))
}

/// The refusal's message, or a panic if `result` was accepted.
fn refusal(case: &str, result: fixtures::Result<String>) -> String {
    match result {
        Ok(out) => panic!("{case}: accepted ({out})"),
        Err(err) => err.to_string(),
    }
}

/// Asserts that `result` was refused with a message naming every fragment.
fn assert_refused(case: &str, result: fixtures::Result<String>, fragments: &[&str]) {
    assert_names(case, &refusal(case, result), fragments);
}

fn assert_names(case: &str, message: &str, fragments: &[&str]) {
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "{case}: {fragment:?} not in {message}"
        );
    }
}

/// Waits until the operator has taken its finalizer off the Pet, leaving
/// only the test's [`HOLD`].
fn wait_only_held(cp: &ControlPlane, name: &str) -> fixtures::Result<()> {
    wait_for(
        POLICY_ACTIVE_TIMEOUT,
        "the operator's finalizer to go",
        || {
            let pet = cp.pet("default", name).ok()?;
            (pet["metadata"]["finalizers"] == json!([HOLD])).then_some(())
        },
    )
}

fn annotate(cp: &ControlPlane, pet: &str, key: &str, value: &str) -> fixtures::Result<String> {
    cp.annotate_pet("default", pet, &["--overwrite", &format!("{key}={value}")])
}

#[test]
fn the_policy_refuses_annotation_typos_on_create_and_new_ones_on_update() -> fixtures::Result<()> {
    // An operator serves the conversion webhook: the v1alpha1 Pets below
    // are stored as v1 through it.
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;
    let cp = &env.cp;
    // Made before the policy exists: a Pet that already carries bad values
    // and a finalizer, as a cluster upgraded to the policy may hold.
    cp.apply(&pet_yaml(
        "legacy",
        &[(PAUSED, "yes"), (DELETION_POLICY, "Orphna")],
        &[HOLD],
    ))?;
    cp.apply(&pet_yaml(
        "legacy-leaving",
        &[(DELETION_POLICY, "Orphna")],
        &[HOLD],
    ))?;

    install_policy(cp)?;

    let bad: [(&str, &str, &str, &[&str]); 11] = [
        (
            "handover-upper",
            HAND_OVER_TO,
            "Green",
            &["--installation", "lowercase DNS label", "\"Green\""],
        ),
        (
            "handover-slash",
            HAND_OVER_TO,
            "green/",
            &["lowercase DNS label"],
        ),
        (
            "paused-yes",
            PAUSED,
            "yes",
            &["\"true\" or \"false\"", "\"yes\""],
        ),
        ("paused-empty", PAUSED, "", &["\"true\" or \"false\""]),
        (
            "policy-typo",
            DELETION_POLICY,
            "Orphna",
            &["\"Delete\" or \"Orphan\"", "\"Orphna\""],
        ),
        (
            "policy-retain",
            DELETION_POLICY,
            "Retain",
            &["\"Delete\" or \"Orphan\""],
        ),
        (
            "id-word",
            EXTERNAL_ID,
            "rex",
            &["lowercase UUID", "\"rex\""],
        ),
        (
            "id-upper",
            EXTERNAL_ID,
            "0B3A5F1E-7C2D-4E8F-9A6B-1C2D3E4F5A6B",
            &["lowercase UUID"],
        ),
        (
            "id-short",
            EXTERNAL_ID,
            "0b3a5f1e-7c2d-4e8f-9a6b",
            &["lowercase UUID"],
        ),
        (
            "plan-word",
            APPROVE_PLAN,
            "yes",
            &["status.plan.hash", "16 lowercase hex digits", "\"yes\""],
        ),
        (
            "plan-upper",
            APPROVE_PLAN,
            "3F2A9C0D1E4B5A67",
            &["16 lowercase hex digits"],
        ),
    ];
    for (name, key, value, allowed) in bad {
        let fragments = [&[key][..], allowed].concat();
        assert_refused(
            name,
            cp.apply(&pet_yaml(name, &[(key, value)], &[])),
            &fragments,
        );
        assert!(cp.kubectl(&["get", "pet", name]).is_err(), "{name} stored");
    }

    // The change policy is refused by the CRD's schema, naming the three
    // allowed values.
    let sometimes = pet_yaml("policy-sometimes", &[], &[])
        .replace("spec:\n", "spec:\n  changePolicy: Sometimes\n");
    assert_refused(
        "change-policy",
        cp.apply(&sometimes),
        &[
            "changePolicy",
            "\"Sometimes\"",
            "Automatic",
            "Approve",
            "Observe",
        ],
    );

    // Exactly what the operator accepts: any case, and for the ID,
    // surrounding spaces and a blank value (none).
    let spaced_id = format!(" {RECORD_ID} ");
    let good: [(&str, &[(&str, &str)]); 5] = [
        (
            "good-lower",
            &[
                (PAUSED, "false"),
                (DELETION_POLICY, "orphan"),
                (EXTERNAL_ID, RECORD_ID),
                (APPROVE_PLAN, "3f2a9c0d1e4b5a67"),
                (HAND_OVER_TO, "green-2"),
            ],
        ),
        (
            "good-cased",
            &[(PAUSED, "True"), (DELETION_POLICY, "Delete")],
        ),
        (
            "good-shouting",
            &[(PAUSED, "FALSE"), (DELETION_POLICY, "ORPHAN")],
        ),
        ("good-spaced-id", &[(EXTERNAL_ID, spaced_id.as_str())]),
        ("good-blank-id", &[(EXTERNAL_ID, "")]),
    ];
    for (name, annotations) in good {
        cp.apply(&pet_yaml(name, annotations, &[]))
            .unwrap_or_else(|err| panic!("{name} refused: {err}"));
    }

    // Every served version is covered: a bad Pet made from a good one read
    // in that version (so its spec fits that version's schema).
    let crd = cp.kubectl_json(&["get", "crd", "pets.petstore.example.com"])?;
    let served: Vec<&str> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["served"] == true)
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert!(!served.is_empty(), "{crd}");
    for version in served {
        let mut pet: Value = cp.kubectl_json(&[
            "get",
            &format!("pets.{version}.petstore.example.com"),
            "good-cased",
            "-n",
            "default",
        ])?;
        pet["metadata"] = json!({
            "name": format!("bad-in-{version}"),
            "namespace": "default",
            "annotations": { PAUSED: "maybe" },
        });
        if let Some(object) = pet.as_object_mut() {
            object.remove("status");
        }
        let case = format!("a bad Pet in {version}");
        assert_refused(
            &case,
            cp.kubectl_stdin(&["create", "-f", "-"], &pet.to_string()),
            &[PAUSED, "\"true\" or \"false\""],
        );
    }

    // UPDATE, ratcheting: the bad values the Pet already had do not block
    // other changes, fixing them, or removing the finalizer...
    cp.kubectl(&["label", "pet", "legacy", "-n", "default", "tier=gold"])?;
    patch_spec(cp, "legacy", r#"{"name":"Thorbert"}"#)?;
    patch(cp, "legacy", "json", REMOVE_FINALIZERS)?;
    let legacy = cp.pet("default", "legacy")?;
    assert!(legacy["metadata"].get("finalizers").is_none(), "{legacy}");
    assert_eq!(legacy["metadata"]["annotations"][PAUSED], "yes");
    // ...but a changed bad value, or a new one, is refused.
    let refused: [(&str, &str, &str, &str, &[&str]); 3] = [
        (
            "paused changed to another bad value",
            "legacy",
            PAUSED,
            "maybe",
            &[PAUSED, "\"true\" or \"false\""],
        ),
        (
            "a bad external-id added",
            "legacy",
            EXTERNAL_ID,
            "rex",
            &[EXTERNAL_ID, "lowercase UUID"],
        ),
        (
            "a good Pet given a bad value",
            "good-lower",
            DELETION_POLICY,
            "Keep",
            &[DELETION_POLICY, "\"Delete\" or \"Orphan\""],
        ),
    ];
    for (case, pet, key, value, fragments) in refused {
        assert_refused(case, annotate(cp, pet, key, value), fragments);
    }
    annotate(cp, "legacy", PAUSED, "false")?;
    annotate(cp, "legacy", DELETION_POLICY, "Orphan")?;
    let legacy = cp.pet("default", "legacy")?;
    assert_eq!(legacy["metadata"]["annotations"][PAUSED], "false");
    assert_eq!(legacy["metadata"]["annotations"][DELETION_POLICY], "Orphan");

    // Once a Pet is being deleted its deletion policy is fixed, in the spec
    // and in the annotation, but for a change to Orphan (which only keeps
    // more), while other changes still go through...
    const FIXED: &str = "cannot change once the Pet is being deleted";
    cp.apply(&pet_yaml("leaving", &[], &[HOLD]))?;
    cp.kubectl(&["delete", "pet", "leaving", "-n", "default", "--wait=false"])?;
    assert_refused(
        "the annotation set to Delete while deleting",
        annotate(cp, "leaving", DELETION_POLICY, "Delete"),
        &[FIXED],
    );
    patch_spec(cp, "leaving", r#"{"deletionPolicy":"Orphan"}"#)?;
    assert_refused(
        "spec.deletionPolicy changed from Orphan while deleting",
        patch_spec(cp, "leaving", r#"{"deletionPolicy":"Delete"}"#),
        &[FIXED],
    );
    // Orphan wins if either says so: an annotation that keeps it Orphan is
    // no change of policy, one that says Orphan is allowed too.
    annotate(cp, "leaving", DELETION_POLICY, "Orphan")?;
    assert_refused(
        "both set back to Delete while deleting",
        patch(
            cp,
            "leaving",
            "merge",
            &json!({"metadata": {"annotations": {DELETION_POLICY: null}},
                    "spec": {"deletionPolicy": "Delete"}})
            .to_string(),
        ),
        &[FIXED],
    );
    cp.kubectl(&["label", "pet", "leaving", "-n", "default", "tier=gold"])?;
    // ...except that a misspelled annotation, which holds the deletion, can
    // still be corrected; once corrected, it is fixed too.
    cp.kubectl(&[
        "delete",
        "pet",
        "legacy-leaving",
        "-n",
        "default",
        "--wait=false",
    ])?;
    annotate(cp, "legacy-leaving", DELETION_POLICY, "Orphan")?;
    assert_refused(
        "a corrected annotation changed again while deleting",
        annotate(cp, "legacy-leaving", DELETION_POLICY, "Delete"),
        &[FIXED],
    );
    // Once the operator is done with them (the record deleted for one,
    // released for the other), releasing the test's finalizer, a change
    // that keeps the policy, lets both go.
    for name in ["leaving", "legacy-leaving"] {
        wait_only_held(cp, name)?;
        patch(
            cp,
            name,
            "json",
            &json!([
                {"op": "test", "path": "/metadata/finalizers", "value": [HOLD]},
                {"op": "remove", "path": "/metadata/finalizers"},
            ])
            .to_string(),
        )?;
    }
    for name in ["leaving", "legacy-leaving"] {
        env.wait_gone("default", name, POLICY_ACTIVE_TIMEOUT)?;
    }
    Ok(())
}

/// The way out a waiting deletion names is one the policy lets through.
/// Pointed at the book's store (no extensions), a Pet deleted under the
/// default policy waits, and its Synced message says to change the deletion
/// policy to Orphan, in the spec or the annotation. With config/admission
/// installed both are accepted while the Pet is being deleted, and the
/// operator lets the Pet go; a change back to Delete is still refused.
#[test]
fn a_deletion_waiting_on_the_books_store_is_let_go_as_its_message_says() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let (legacy, _operator) = env.start_operator_on_legacy_store("operator")?;
    let cp = &env.cp;
    install_policy(cp)?;

    let names = ["by-spec", "by-annotation"];
    for name in names {
        // The test's own finalizer keeps the Pet in view once the
        // operator has let it go.
        cp.apply(&pet_yaml(name, &[], &[HOLD]))?;
    }
    // Deleted once the operator has its finalizer on them and has found
    // the store without the extensions.
    for name in names {
        let what = "Synced StoreLacksExtensions";
        typed::wait_pet(cp, "default", name, POLICY_ACTIVE_TIMEOUT, what, |pet| {
            (pet.condition("Synced")?.reason == "StoreLacksExtensions").then_some(())
        })?;
        cp.kubectl(&["delete", "pet", name, "-n", "default", "--wait=false"])?;
    }
    for name in names {
        let timeout = POLICY_ACTIVE_TIMEOUT;
        let message = typed::wait_deleting(cp, "default", name, timeout, |synced| {
            synced.reason == "StoreLacksExtensions"
        })?;
        assert_names(
            name,
            &message,
            &[
                "spec.deletionPolicy: Orphan",
                &format!("{DELETION_POLICY}: Orphan"),
                "allowed while it is being deleted",
            ],
        );
        let pet = env.pet("default", name)?;
        let finalizers = pet["metadata"]["finalizers"].to_string();
        assert!(
            finalizers.contains("pet.petstore.example.com"),
            "{name} waits on the operator: {finalizers}"
        );
    }

    // As the message says, either way: the operator lets both go.
    patch_spec(cp, "by-spec", r#"{"deletionPolicy":"Orphan"}"#)?;
    annotate(cp, "by-annotation", DELETION_POLICY, "Orphan")?;
    for name in names {
        wait_only_held(cp, name)?;
    }
    // A change back to Delete is still refused.
    let changed_back = [
        patch_spec(cp, "by-spec", r#"{"deletionPolicy":"Delete"}"#),
        annotate(cp, "by-annotation", DELETION_POLICY, "Delete"),
    ];
    for (name, result) in names.iter().zip(changed_back) {
        assert_refused(
            name,
            result,
            &["cannot change once the Pet is being deleted"],
        );
    }
    for name in names {
        patch(cp, name, "json", REMOVE_FINALIZERS)?;
    }
    for name in names {
        env.wait_gone("default", name, POLICY_ACTIVE_TIMEOUT)?;
    }
    assert!(legacy.ids().is_empty(), "nothing was created or kept");
    Ok(())
}

#[test]
fn a_protected_pet_and_its_record_stay_until_the_annotation_goes() -> fixtures::Result<()> {
    let env = Env::start(Storage::Durable)?;
    let _operator = env.start_operator("operator")?;
    let cp = &env.cp;
    install_policy(cp)?;
    let timeout = Duration::from_secs(60);

    assert_refused(
        "protected: yes",
        cp.apply(&pet_yaml("unsure", &[(PROTECTED, "yes")], &[])),
        &[PROTECTED, r#""true""#, r#""false""#, r#"not "yes""#],
    );
    cp.apply(&pet_yaml("guarded", &[(PROTECTED, "True")], &[]))?;
    let id = env.wait_ready("default", "guarded", timeout)?;
    // The API server enforces a new policy once its informer has it; a
    // server-side dry run deletes nothing while the probe waits.
    let message = wait_for(POLICY_ACTIVE_TIMEOUT, "the protection enforced", || {
        let dry_run = [
            "delete",
            "pet",
            "guarded",
            "-n",
            "default",
            "--dry-run=server",
        ];
        cp.kubectl(&dry_run)
            .err()
            .map(|err| err.to_string())
            .filter(|message| message.contains(PROTECTED))
    })?;
    assert_names(
        "delete",
        &message,
        &[
            "Pet default/guarded is protected",
            "petstore.example.com/protected=true",
            "kubectl annotate pet guarded -n default petstore.example.com/protected-",
        ],
    );
    let writes = env.store.writes()?;
    // As docs/upgrading.md quotes it.
    assert_refused(
        "delete by name",
        cp.kubectl(&["delete", "pet", "guarded", "-n", "default", "--wait=false"]),
        &[
            r#"Error from server (Forbidden): pets.petstore.example.com "guarded" is forbidden: ValidatingAdmissionPolicy 'petstore-pet-protection' with binding 'petstore-pet-protection' denied request: Pet default/guarded is protected"#,
        ],
    );
    assert_refused(
        "delete --all",
        cp.kubectl(&["delete", "pets", "--all", "-n", "default", "--wait=false"]),
        &[PROTECTED],
    );
    // A namespace's deletion cannot take it either: the namespace waits.
    cp.ensure_namespace("kept")?;
    cp.apply(
        &pet_yaml("guarded", &[(PROTECTED, "true")], &[])
            .replace("namespace: default", "namespace: kept"),
    )?;
    env.wait_ready("kept", "guarded", timeout)?;
    let writes = writes + 1.0; // its create
    cp.kubectl(&["delete", "namespace", "kept", "--wait=false"])?;
    let refused = wait_for(timeout, "the namespace's deletion to be refused", || {
        let namespace = cp.get("/api/v1/namespaces/kept").ok()?;
        namespace["status"]["conditions"]
            .as_array()?
            .iter()
            .filter_map(|c| c["message"].as_str())
            .find(|message| message.contains(PROTECTED))
            .map(str::to_owned)
    })?;
    assert_names("namespace", &refused, &["Pet kept/guarded is protected"]);
    for namespace in ["default", "kept"] {
        let pet = env.pet(namespace, "guarded")?;
        assert!(
            pet["metadata"]["deletionTimestamp"].is_null(),
            "{namespace}: {pet}"
        );
    }
    assert_eq!(env.store.writes()?, writes, "the store was written");
    let record_kept = || -> fixtures::Result<bool> {
        Ok(env.store.all_pets()?.iter().any(|r| r["id"] == id.as_str()))
    };
    assert!(record_kept()?, "the record went");
    let set_protected = |namespace: &str, value: &str| {
        let annotation = match value {
            "" => format!("{PROTECTED}-"),
            value => format!("{PROTECTED}={value}"),
        };
        cp.annotate_pet(namespace, "guarded", &[&annotation, "--overwrite"])
    };

    // Lifted: the deletion proceeds, and deletes the record.
    set_protected("default", "")?;
    cp.kubectl(&["delete", "pet", "guarded", "-n", "default", "--wait=false"])?;
    env.wait_gone("default", "guarded", timeout)?;
    assert!(!record_kept()?, "the record stayed");
    // "false" protects nothing.
    set_protected("kept", "false")?;
    env.wait_gone("kept", "guarded", timeout)?;
    Ok(())
}
