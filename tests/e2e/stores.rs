//! PetStores and ClusterPetStores on the real API server: their schemas'
//! rules, a Pet's `spec.storeRef` fixed once the Pet has a record (the
//! CRD's CEL rule, in both versions), and the operator's admission webhook
//! refusing to delete a store that Pets use, naming them: a PetStore counts
//! only its own namespace's Pets, a ClusterPetStore every namespace's.

use std::time::Duration;

use fixtures::env::install_store_guard;
use fixtures::{ControlPlane, Env, Storage, wait_for};

/// The refusal the CRD's rule gives.
const IMMUTABLE: &str = "spec.storeRef cannot change once the Pet has a record (status.id is set); moving records between stores is not supported";
/// How long the API server may take to call a webhook just pointed at.
const GUARD_TIMEOUT: Duration = Duration::from_secs(60);
const PAUSED: &str = "petstore.example.com/paused";

/// A v1 Pet in `namespace`, with `store_ref` (a flow mapping) if any.
fn pet(namespace: &str, name: &str, store_ref: Option<&str>, paused: bool) -> String {
    let mut yaml = format!(
        "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: {name}\n  namespace: {namespace}\n"
    );
    if paused {
        yaml.push_str(&format!("  annotations:\n    {PAUSED}: \"true\"\n"));
    }
    yaml.push_str("spec:\n  name: Rex\n  type: dog\n  birthday: \"2021-04-01\"\n");
    if let Some(store_ref) = store_ref {
        yaml.push_str(&format!("  storeRef: {store_ref}\n"));
    }
    yaml
}

fn patch(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    kind: &str,
    body: &str,
) -> fixtures::Result<String> {
    cp.kubectl(&[
        "patch",
        "pet",
        name,
        "-n",
        namespace,
        &format!("--type={kind}"),
        "-p",
        body,
    ])
}

/// Gives the Pet a record, as the operator would: `status.id`.
fn set_status(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    status: &str,
) -> fixtures::Result<String> {
    cp.kubectl(&[
        "patch",
        "pet",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        &format!(r#"{{"status":{status}}}"#),
    ])
}

/// The refusal's message, or a panic if `result` was accepted.
fn refusal(case: &str, result: fixtures::Result<String>) -> String {
    match result {
        Ok(out) => panic!("{case}: accepted ({out})"),
        Err(err) => err.to_string(),
    }
}

fn assert_refused(case: &str, result: fixtures::Result<String>, fragments: &[&str]) {
    let message = refusal(case, result);
    for fragment in fragments {
        assert!(
            message.contains(fragment),
            "{case}: {fragment:?} not in {message}"
        );
    }
}

#[test]
fn store_ref_is_fixed_once_the_pet_has_a_record_and_stores_are_validated() -> fixtures::Result<()> {
    // No operator: the test writes status.id itself, as the operator would.
    let cp = ControlPlane::start()?;
    fixtures::env::install_crd_and_rbac(&cp)?;
    let ns = "default";

    // Before the record: storeRef may be set, changed and removed.
    cp.apply(&pet(ns, "rex", Some("{kind: PetStore, name: a}"), false))?;
    patch(
        &cp,
        ns,
        "rex",
        "merge",
        r#"{"spec":{"storeRef":{"kind":"PetStore","name":"b"}}}"#,
    )?;
    patch(
        &cp,
        ns,
        "rex",
        "json",
        r#"[{"op":"remove","path":"/spec/storeRef"}]"#,
    )?;
    patch(
        &cp,
        ns,
        "rex",
        "merge",
        r#"{"spec":{"storeRef":{"kind":"ClusterPetStore","name":"c"}}}"#,
    )?;
    // An empty status.id is no record either.
    set_status(&cp, ns, "rex", r#"{"id":""}"#)?;
    patch(
        &cp,
        ns,
        "rex",
        "merge",
        r#"{"spec":{"storeRef":{"kind":"ClusterPetStore","name":"d"}}}"#,
    )?;

    // With a record: not changed, not removed.
    set_status(&cp, ns, "rex", r#"{"id":"r-1"}"#)?;
    let field = "spec.storeRef";
    assert_refused(
        "change the name",
        patch(
            &cp,
            ns,
            "rex",
            "merge",
            r#"{"spec":{"storeRef":{"kind":"ClusterPetStore","name":"e"}}}"#,
        ),
        &[field, IMMUTABLE],
    );
    assert_refused(
        "change the kind",
        patch(
            &cp,
            ns,
            "rex",
            "merge",
            r#"{"spec":{"storeRef":{"kind":"PetStore","name":"d"}}}"#,
        ),
        &[IMMUTABLE],
    );
    assert_refused(
        "remove",
        patch(
            &cp,
            ns,
            "rex",
            "json",
            r#"[{"op":"remove","path":"/spec/storeRef"}]"#,
        ),
        &[IMMUTABLE],
    );
    // Everything else still changes, and so does the status.
    patch(&cp, ns, "rex", "merge", r#"{"spec":{"name":"Rexy"}}"#)?;
    cp.kubectl(&["label", "pet", "rex", "-n", ns, "team=blue"])?;
    set_status(&cp, ns, "rex", r#"{"store":"ClusterPetStore/d"}"#)?;
    let stored = cp.kubectl_json(&["get", "pet", "rex", "-n", ns])?;
    assert_eq!(stored["spec"]["storeRef"]["name"], "d", "{stored}");
    assert_eq!(stored["status"]["store"], "ClusterPetStore/d", "{stored}");

    // A Pet with a record and no storeRef cannot be given one.
    cp.apply(&pet(ns, "tom", None, false))?;
    set_status(&cp, ns, "tom", r#"{"id":"r-2"}"#)?;
    assert_refused(
        "set",
        patch(
            &cp,
            ns,
            "tom",
            "merge",
            r#"{"spec":{"storeRef":{"kind":"PetStore","name":"a"}}}"#,
        ),
        &[IMMUTABLE],
    );
    // The schema checks the reference itself.
    assert_refused(
        "an unknown kind",
        patch(
            &cp,
            ns,
            "rex",
            "merge",
            r#"{"spec":{"storeRef":{"kind":"Store","name":"d"}}}"#,
        ),
        &["spec.storeRef.kind", "Unsupported value"],
    );

    // The stores' own rules, with messages a person can act on.
    let store = |kind: &str, namespace: Option<&str>, spec: &str| {
        let metadata = match namespace {
            Some(ns) => format!("  name: s\n  namespace: {ns}\n"),
            None => "  name: s\n".to_owned(),
        };
        format!(
            "apiVersion: petstore.example.com/v1\nkind: {kind}\nmetadata:\n{metadata}spec:\n{spec}"
        )
    };
    assert_refused(
        "no scheme",
        cp.apply(&store("PetStore", Some(ns), "  address: petstore:6742\n")),
        &["spec.address", "https://host:port"],
    );
    assert_refused(
        "a path",
        cp.apply(&store(
            "PetStore",
            Some(ns),
            "  address: https://petstore:6742/v1\n",
        )),
        &["https://host:port"],
    );
    assert_refused(
        "two CA sources",
        cp.apply(&store(
            "PetStore",
            Some(ns),
            "  address: https://petstore:6742\n  tls:\n    ca:\n      secretKeyRef: {name: ca, key: ca.crt}\n      configMapKeyRef: {name: ca, key: ca.crt}\n",
        )),
        &["exactly one of secretKeyRef or configMapKeyRef"],
    );
    assert_refused(
        "a cluster store's CA without its namespace",
        cp.apply(&store(
            "ClusterPetStore",
            None,
            "  address: https://petstore:6742\n  tls:\n    ca:\n      secretKeyRef: {name: ca, key: ca.crt}\n",
        )),
        &["spec.tls.ca.secretKeyRef.namespace", "Required value"],
    );
    assert_refused(
        "In without values",
        cp.apply(&store(
            "ClusterPetStore",
            None,
            "  address: https://petstore:6742\n  allowedNamespaces:\n    selector:\n      matchExpressions: [{key: tier, operator: In}]\n",
        )),
        &["values must be non-empty for In and NotIn"],
    );
    cp.apply(&store(
        "PetStore",
        Some(ns),
        "  address: https://petstore.petstore.svc:6742\n  tls:\n    ca:\n      configMapKeyRef: {name: ca, key: ca.crt}\n    serverName: petstore\n",
    ))?;
    cp.apply(&store(
        "ClusterPetStore",
        None,
        "  address: http://petstore:6742\n  tls:\n    ca:\n      secretKeyRef: {namespace: petstore, name: ca, key: ca.crt}\n  allowedNamespaces:\n    names: [team-a]\n    selector:\n      matchExpressions: [{key: tier, operator: In, values: [gold]}]\n",
    ))?;
    // `petstore` alone is the category (Pets and both store kinds), which
    // kubectl expands before it reads a resource name: the plural names
    // the kind.
    let stored = cp.kubectl_json(&["get", "petstores", "s", "-n", ns])?;
    assert_eq!(
        stored["spec"]["audience"], "petstore",
        "defaulted: {stored}"
    );
    let table = cp.kubectl(&["get", "ps", "-n", ns])?;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "ADDRESS", "READY", "PETS", "AGE"],
        "{table}"
    );
    assert!(
        cp.kubectl(&["get", "cps"])?
            .contains("http://petstore:6742")
    );
    let category = cp.kubectl(&["get", "petstore", "-n", ns, "-o", "name"])?;
    for object in [
        "pet.petstore.example.com/rex",
        "petstore.petstore.example.com/s",
        "clusterpetstore.petstore.example.com/s",
    ] {
        assert!(category.contains(object), "{object} in:\n{category}");
    }
    Ok(())
}

#[test]
fn deleting_a_store_in_use_is_refused_naming_its_pets() -> fixtures::Result<()> {
    let env = Env::start(Storage::Memory)?;
    let cp = &env.cp;
    // Installed before the operator starts, which points it at itself.
    install_store_guard(cp)?;
    let _operator = env.start_operator("operator")?;
    for ns in ["team-a", "team-b"] {
        cp.ensure_namespace(ns)?;
        cp.apply(&format!(
            "apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata:\n  name: shared\n  namespace: {ns}\nspec:\n  address: https://petstore.{ns}.svc:6742\n"
        ))?;
    }
    cp.apply("apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata:\n  name: other\n  namespace: team-b\nspec:\n  address: https://other:6742\n")?;
    cp.apply("apiVersion: petstore.example.com/v1\nkind: ClusterPetStore\nmetadata:\n  name: global\nspec:\n  address: https://global:6742\n  allowedNamespaces: {names: [team-b]}\n")?;
    // Paused: the operator (which does not resolve stores yet) leaves them
    // and their records alone.
    cp.apply(&pet(
        "team-a",
        "rex",
        Some("{kind: PetStore, name: shared}"),
        true,
    ))?;
    cp.apply(&pet(
        "team-b",
        "max",
        Some("{kind: ClusterPetStore, name: global}"),
        true,
    ))?;
    // Uses team-b/other through the store the operator resolved only.
    cp.apply(&pet("team-b", "kit", None, true))?;
    set_status(cp, "team-b", "kit", r#"{"store":"PetStore/other"}"#)?;

    // The operator pointed the guard at itself; the API server calls it a
    // moment later. A server-side dry run deletes nothing meanwhile.
    let in_use = "PetStore team-a/shared is used by 1 Pet (team-a/rex)";
    wait_for(GUARD_TIMEOUT, "the store guard to answer", || {
        cp.kubectl(&[
            "delete",
            "petstores",
            "shared",
            "-n",
            "team-a",
            "--dry-run=server",
        ])
        .err()
        .filter(|err| err.to_string().contains(in_use))
    })?;
    assert_refused(
        "a PetStore in use",
        cp.kubectl(&["delete", "petstores", "shared", "-n", "team-a"]),
        &[
            "store-guard.petstore.example.com",
            in_use,
            "delete them or change their storeRef first",
        ],
    );
    // The same name in another namespace is another store, unused.
    cp.kubectl(&["delete", "petstores", "shared", "-n", "team-b"])?;
    assert_refused(
        "a PetStore named only in a Pet's status",
        cp.kubectl(&["delete", "petstores", "other", "-n", "team-b"]),
        &["PetStore team-b/other is used by 1 Pet (team-b/kit)"],
    );
    assert_refused(
        "a ClusterPetStore in use from another namespace",
        cp.kubectl(&["delete", "clusterpetstores", "global"]),
        &["ClusterPetStore global is used by 1 Pet (team-b/max)"],
    );
    // In bulk too: each store is judged on its own.
    assert_refused(
        "--all",
        cp.kubectl(&["delete", "petstores", "--all", "-n", "team-a"]),
        &[in_use],
    );

    // The Pet read and written back as v1alpha1 keeps its storeRef; the
    // rule holds there too once it has a record.
    let mut alpha = cp.kubectl_json(&[
        "get",
        "pets.v1alpha1.petstore.example.com",
        "rex",
        "-n",
        "team-a",
    ])?;
    assert_eq!(alpha["spec"]["storeRef"]["kind"], "PetStore", "{alpha}");
    // Unconditionally: the operator writes the paused Pet's status meanwhile.
    if let Some(metadata) = alpha["metadata"].as_object_mut() {
        metadata.remove("resourceVersion");
    }
    cp.kubectl_stdin(&["replace", "-f", "-"], &alpha.to_string())?;
    set_status(cp, "team-a", "rex", r#"{"id":"r-1"}"#)?;
    assert_refused(
        "v1alpha1",
        cp.kubectl(&[
            "patch",
            "pets.v1alpha1.petstore.example.com",
            "rex",
            "-n",
            "team-a",
            "--type=merge",
            "-p",
            r#"{"spec":{"storeRef":{"kind":"PetStore","name":"other"}}}"#,
        ]),
        &[IMMUTABLE],
    );
    let v1 = env.pet("team-a", "rex")?;
    assert_eq!(v1["spec"]["storeRef"]["name"], "shared", "{v1}");

    // Once unused, each store goes.
    for (namespace, name) in [("team-a", "rex"), ("team-b", "max"), ("team-b", "kit")] {
        cp.kubectl(&["delete", "pet", name, "-n", namespace, "--wait=true"])?;
    }
    cp.kubectl(&["delete", "petstores", "shared", "-n", "team-a"])?;
    cp.kubectl(&["delete", "petstores", "other", "-n", "team-b"])?;
    cp.kubectl(&["delete", "clusterpetstores", "global"])?;
    Ok(())
}
