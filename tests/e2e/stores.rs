//! PetStores and ClusterPetStores on the real API server: their schemas'
//! rules, a Pet's `spec.storeRef` fixed once the Pet has a record (the
//! CRD's CEL rule, in both versions), the operator's admission webhook
//! refusing to delete a store that Pets use, naming them: a PetStore counts
//! only its own namespace's Pets, a ClusterPetStore every namespace's; and
//! each store's status (does it answer, its extensions, its Pets), as
//! kubectl and kstatus read it.

use std::time::Duration;

use fixtures::env::{condition, install_store_guard};
use fixtures::health::kstatus;
use fixtures::{ControlPlane, Env, Storage, wait_for};
use serde_json::Value;

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
    cp.patch_pet(namespace, name, &[&format!("--type={kind}"), "-p", body])
}

/// Points the Pet at the store `kind`/`store` with a merge patch.
fn set_store_ref(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    kind: &str,
    store: &str,
) -> fixtures::Result<String> {
    patch(
        cp,
        namespace,
        name,
        "merge",
        &format!(r#"{{"spec":{{"storeRef":{{"kind":"{kind}","name":"{store}"}}}}}}"#),
    )
}

/// Takes the Pet's storeRef out with a JSON patch.
fn remove_store_ref(cp: &ControlPlane, namespace: &str, name: &str) -> fixtures::Result<String> {
    patch(
        cp,
        namespace,
        name,
        "json",
        r#"[{"op":"remove","path":"/spec/storeRef"}]"#,
    )
}

/// Gives the Pet a record, as the operator would: `status.id`.
fn set_status(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    status: &str,
) -> fixtures::Result<String> {
    cp.patch_pet(
        namespace,
        name,
        &[
            "--subresource=status",
            "--type=merge",
            "-p",
            &format!(r#"{{"status":{status}}}"#),
        ],
    )
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
    let cp = fixtures::env::start_installed(ControlPlane::builder())?;
    let ns = "default";

    // Before the record: storeRef may be set, changed and removed.
    cp.apply(&pet(ns, "rex", Some("{kind: PetStore, name: a}"), false))?;
    set_store_ref(&cp, ns, "rex", "PetStore", "b")?;
    remove_store_ref(&cp, ns, "rex")?;
    set_store_ref(&cp, ns, "rex", "ClusterPetStore", "c")?;
    // An empty status.id is no record either.
    set_status(&cp, ns, "rex", r#"{"id":""}"#)?;
    set_store_ref(&cp, ns, "rex", "ClusterPetStore", "d")?;

    // With a record: not changed, not removed.
    set_status(&cp, ns, "rex", r#"{"id":"r-1"}"#)?;
    let field = "spec.storeRef";
    assert_refused(
        "change the name",
        set_store_ref(&cp, ns, "rex", "ClusterPetStore", "e"),
        &[field, IMMUTABLE],
    );
    assert_refused(
        "change the kind",
        set_store_ref(&cp, ns, "rex", "PetStore", "d"),
        &[IMMUTABLE],
    );
    assert_refused("remove", remove_store_ref(&cp, ns, "rex"), &[IMMUTABLE]);
    // Everything else still changes, and so does the status.
    patch(&cp, ns, "rex", "merge", r#"{"spec":{"name":"Rexy"}}"#)?;
    cp.kubectl(&["label", "pet", "rex", "-n", ns, "team=blue"])?;
    set_status(&cp, ns, "rex", r#"{"store":"ClusterPetStore/d"}"#)?;
    let stored = crate::typed::pet(&cp, ns, "rex")?;
    let store_ref = stored.spec.store_ref.as_ref().map(|r| r.name.as_str());
    assert_eq!(store_ref, Some("d"), "{stored:?}");
    let status_store = stored.status.as_ref().and_then(|s| s.store.as_deref());
    assert_eq!(status_store, Some("ClusterPetStore/d"), "{stored:?}");

    // A Pet with a record and no storeRef cannot be given one.
    cp.apply(&pet(ns, "tom", None, false))?;
    set_status(&cp, ns, "tom", r#"{"id":"r-2"}"#)?;
    assert_refused(
        "set",
        set_store_ref(&cp, ns, "tom", "PetStore", "a"),
        &[IMMUTABLE],
    );
    // The schema checks the reference itself.
    assert_refused(
        "an unknown kind",
        set_store_ref(&cp, ns, "rex", "Store", "d"),
        &["spec.storeRef.kind", "Unsupported value"],
    );

    // The stores' own rules, with messages a person can act on.
    let store =
        |kind: &str, namespace: Option<&str>, spec: &str| store_object(kind, namespace, "s", spec);
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
    assert_columns(&cp.kubectl(&["get", "ps", "-n", ns])?);
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
    // The stores' addresses are loopback ports where nothing listens: the
    // operator checks each store it sees.
    let _operator = env.start_operator("operator")?;
    for ns in ["team-a", "team-b"] {
        cp.ensure_namespace(ns)?;
        cp.apply(&format!(
            "apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata:\n  name: shared\n  namespace: {ns}\nspec:\n  address: https://127.0.0.1:1\n"
        ))?;
    }
    cp.apply("apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata:\n  name: other\n  namespace: team-b\nspec:\n  address: https://127.0.0.1:1\n")?;
    cp.apply("apiVersion: petstore.example.com/v1\nkind: ClusterPetStore\nmetadata:\n  name: global\nspec:\n  address: https://127.0.0.1:1\n  allowedNamespaces: {names: [team-b]}\n")?;
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
        // In this process: it polls.
        cp.delete("/apis/petstore.example.com/v1/namespaces/team-a/petstores/shared?dryRun=All")
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

/// How often the operator under test checks each store again.
const STATUS_INTERVAL: &str = "1s";
/// How long a store's status may take to show what is so: a few
/// intervals, with room for a machine twice as slow under the suite's load.
const STATUS_TIMEOUT: Duration = Duration::from_secs(60);
/// What a store of this project serves beyond the book's RPCs.
const EXTENSIONS: [&str; 4] = [
    "GetPets",
    "SetIdempotencyKeys",
    "WatchPets",
    "ClaimInstallation",
];
/// The operator's debug line for each probe of a store.
const PROBED: &str = "store probed";

/// A store object of `kind`, in `namespace` if namespaced; `spec` indented
/// under `spec:`.
fn store_object(kind: &str, namespace: Option<&str>, name: &str, spec: &str) -> String {
    let namespace = namespace
        .map(|ns| format!("\n  namespace: {ns}"))
        .unwrap_or_default();
    format!(
        "apiVersion: petstore.example.com/v1\nkind: {kind}\nmetadata:\n  name: {name}{namespace}\nspec:\n{spec}"
    )
}

/// `kubectl get <plural> <name> [-n <namespace>] -o json`.
fn get_store(
    cp: &ControlPlane,
    plural: &str,
    namespace: Option<&str>,
    name: &str,
) -> Option<Value> {
    let mut args = vec!["get", plural, name];
    if let Some(namespace) = namespace {
        args.extend(["-n", namespace]);
    }
    cp.kubectl_json(&args).ok()
}

/// Waits until the store's status describes its current generation and
/// `check` holds of it; the store as it then is.
fn wait_store(
    cp: &ControlPlane,
    (plural, namespace, name): (&str, Option<&str>, &str),
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> fixtures::Result<Value> {
    wait_for(STATUS_TIMEOUT, &format!("{plural} {name}: {what}"), || {
        get_store(cp, plural, namespace, name).filter(|store| {
            store["status"]["observedGeneration"] == store["metadata"]["generation"] && check(store)
        })
    })
}

/// The status and reason of the store's condition `type_`.
fn shows(store: &Value, type_: &str) -> (String, String) {
    condition(store, type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .unwrap_or_default()
}

/// Each `(type, status, reason)` is what the store's condition of that
/// type shows.
#[track_caller]
fn assert_shows(store: &Value, expected: &[(&str, &str, &str)]) {
    for &(type_, status, reason) in expected {
        assert_eq!(
            shows(store, type_),
            (status.to_owned(), reason.to_owned()),
            "{type_}"
        );
    }
}

/// The message of the store's Ready condition, as JSON text.
fn ready_message(store: &Value) -> String {
    condition(store, "Ready")
        .map(|c| c["message"].to_string())
        .unwrap_or_default()
}

/// kstatus's verdict on each object, in order, is `expected`.
#[track_caller]
fn assert_kstatus(objects: &[Value], expected: &[&str]) -> fixtures::Result<()> {
    let verdicts = kstatus(objects)?;
    let statuses: Vec<&str> = verdicts.iter().map(|(status, _)| status.as_str()).collect();
    assert_eq!(statuses, expected, "{verdicts:?}");
    Ok(())
}

fn ready_with_pets(pets: i64) -> impl Fn(&Value) -> bool {
    move |store| shows(store, "Ready").0 == "True" && store["status"]["pets"] == pets
}

fn not_ready(store: &Value) -> bool {
    shows(store, "Ready").0 == "False"
}

/// The writes (PATCH, PUT) to the store kinds' status the API server has
/// served, by its own metrics: a write that changes nothing counts too.
fn status_writes(cp: &ControlPlane) -> fixtures::Result<f64> {
    let metrics = cp.kubectl(&["get", "--raw", "/metrics"])?;
    Ok(metrics
        .lines()
        .filter(|line| {
            line.starts_with("apiserver_request_total{")
                && (line.contains(r#"resource="petstores""#)
                    || line.contains(r#"resource="clusterpetstores""#))
                && line.contains(r#"subresource="status""#)
                && (line.contains(r#"verb="PATCH""#) || line.contains(r#"verb="PUT""#))
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// The store kinds' columns in `kubectl get`'s header.
#[track_caller]
fn assert_columns(out: &str) {
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "ADDRESS", "READY", "PETS", "AGE"], "{out}");
}

/// The row `name` of [`table`] shows READY `ready` and PETS `pets`.
#[track_caller]
fn assert_row(
    rows: &std::collections::BTreeMap<String, (String, String)>,
    name: &str,
    ready: &str,
    pets: &str,
) {
    assert_eq!(
        rows.get(name),
        Some(&(ready.to_owned(), pets.to_owned())),
        "{rows:?}"
    );
}

/// The rows of `kubectl get` as NAME -> (READY, PETS), checking the header.
fn table(out: &str) -> std::collections::BTreeMap<String, (String, String)> {
    assert_columns(out);
    out.lines()
        .skip(1)
        .map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            let cell = |i: usize| cells.get(i).copied().unwrap_or_default().to_owned();
            (cell(0), (cell(2), cell(3)))
        })
        .collect()
}

#[test]
fn a_stores_status_says_whether_it_answers_its_extensions_and_the_pets_that_use_it()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Memory)?;
    let cp = &env.cp;
    let mut accounts = Vec::new();
    for ns in ["team-a", "team-b"] {
        cp.ensure_namespace(ns)?;
        accounts.push(format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: petstore-tenant\n  namespace: {ns}\n"
        ));
    }
    cp.apply(&accounts.join("---\n"))?;
    // One running store behind three objects; nothing listens at `nowhere`.
    let running = format!("  address: http://{}\n", env.store.addr);
    let nowhere = format!("http://127.0.0.1:{}", fixtures::free_port()?);
    let untrusted = format!(
        "  address: https://127.0.0.1:{}\n  tls:\n    ca:\n      configMapKeyRef: {{name: missing-ca, key: ca.crt}}\n",
        fixtures::free_port()?
    );
    cp.apply(
        &[
            store_object("PetStore", Some("team-a"), "near", &running),
            store_object("PetStore", Some("team-b"), "near", &running),
            store_object(
                "ClusterPetStore",
                None,
                "shared",
                &format!("{running}  allowedNamespaces: {{names: [team-a, team-b]}}\n"),
            ),
            store_object(
                "ClusterPetStore",
                None,
                "far",
                &format!("  address: {nowhere}\n"),
            ),
            store_object("PetStore", Some("team-a"), "untrusted", &untrusted),
        ]
        .join("---\n"),
    )?;
    let mut options = env.operator_options("store-status");
    options
        .extra_args
        .push(format!("--store-status-interval={STATUS_INTERVAL}").into());
    let mut operator = env.start_operator_with(&options)?;
    let pets = [
        ("team-a", "rex", "PetStore", "near"),
        ("team-a", "fido", "PetStore", "near"),
        ("team-b", "max", "PetStore", "near"),
        ("team-a", "tom", "ClusterPetStore", "shared"),
        ("team-b", "kit", "ClusterPetStore", "shared"),
    ];
    let manifests: Vec<String> = pets
        .iter()
        .map(|(ns, name, kind, store)| {
            format!(
                "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  name: {name}\n  type: dog\n  birthday: \"2021-04-01\"\n  storeRef: {{kind: {kind}, name: {store}}}\n"
            )
        })
        .collect();
    cp.apply(&manifests.join("---\n"))?;
    for (ns, name, _, _) in pets {
        env.wait_ready(ns, name, STATUS_TIMEOUT)?;
    }

    // A PetStore counts its own namespace's Pets, a ClusterPetStore every
    // namespace's; each lists the extensions the running store serves.
    let near_a = ("petstores", Some("team-a"), "near");
    let near_b = ("petstores", Some("team-b"), "near");
    let shared = ("clusterpetstores", None, "shared");
    let far = ("clusterpetstores", None, "far");
    let untrusted = ("petstores", Some("team-a"), "untrusted");
    cp.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "petstores/near",
        "-n",
        "team-a",
        "--timeout=60s",
    ])?;
    let reachable = wait_store(cp, near_a, "Ready with 2 Pets", ready_with_pets(2))?;
    assert_shows(
        &reachable,
        &[
            ("Ready", "True", "Available"),
            ("Reachable", "True", "Available"),
        ],
    );
    assert_eq!(
        reachable["status"]["extensions"],
        serde_json::json!(EXTENSIONS),
        "{reachable}"
    );
    wait_store(cp, near_b, "Ready with 1 Pet", ready_with_pets(1))?;
    wait_store(cp, shared, "Ready with 2 Pets", ready_with_pets(2))?;

    // Nothing listens: not Ready, and why, re-checked (Reconciling).
    let unreachable = wait_store(cp, far, "not Ready", not_ready)?;
    assert_shows(
        &unreachable,
        &[
            ("Ready", "False", "StoreUnavailable"),
            ("Reachable", "False", "StoreUnavailable"),
            ("Reconciling", "True", "StoreUnavailable"),
        ],
    );
    let message = ready_message(&unreachable);
    assert!(
        message.contains(&format!("no answer from {nowhere}"))
            && message.contains("Connection refused"),
        "{message}"
    );
    assert_eq!(unreachable["status"]["pets"], 0, "{unreachable}");
    assert!(
        unreachable["status"].get("extensions").is_none(),
        "{unreachable}"
    );
    // Its CA cannot be read: nothing tried, and only a person can help.
    let distrusted = wait_store(cp, untrusted, "held on its trust", not_ready)?;
    assert_shows(
        &distrusted,
        &[
            ("Ready", "False", "StoreTrustMissing"),
            ("Stalled", "True", "StoreTrustMissing"),
        ],
    );
    let message = ready_message(&distrusted);
    assert!(message.contains("team-a/missing-ca"), "{message}");

    // kstatus: the one that answers is Current, the others are not.
    assert_kstatus(
        &[reachable.clone(), unreachable, distrusted],
        &["Current", "InProgress", "Failed"],
    )?;

    // kubectl's columns.
    let rows = table(&cp.kubectl(&["get", "ps", "-n", "team-a"])?);
    assert_row(&rows, "near", "True", "2");
    assert_row(&rows, "untrusted", "False", "0");
    let rows = table(&cp.kubectl(&["get", "cps"])?);
    assert_row(&rows, "shared", "True", "2");
    assert_row(&rows, "far", "False", "0");

    // Nothing changes: every store probed three times more, and not one
    // status write, by the API server's count and by the resourceVersions.
    let all = [near_a, near_b, shared, far, untrusted];
    let versions = |cp: &ControlPlane| -> Vec<Value> {
        all.iter()
            .map(|(plural, ns, name)| {
                get_store(cp, plural, *ns, name)
                    .map(|store| store["metadata"]["resourceVersion"].clone())
                    .unwrap_or_default()
            })
            .collect()
    };
    let log = operator.process().log_path().to_owned();
    let probes = || {
        std::fs::read_to_string(&log)
            .map(|text| text.lines().filter(|line| line.contains(PROBED)).count())
            .unwrap_or_default()
    };
    assert!(status_writes(cp)? >= 5.0, "the count sees the first writes");
    let before = (versions(cp), status_writes(cp)?);
    let probed = probes();
    wait_for(STATUS_TIMEOUT, "three more probes of every store", || {
        (probes() >= probed + 3 * all.len()).then_some(())
    })?;
    assert_eq!(
        (versions(cp), status_writes(cp)?),
        before,
        "no status writes while nothing changes"
    );

    // A changed spec is checked again: `far` now points at the running
    // store. Until its status describes the new generation, kstatus waits.
    let edited = cp.kubectl_json(&[
        "patch",
        "clusterpetstores",
        "far",
        "--type=merge",
        "-p",
        &format!(r#"{{"spec":{{"address":"http://{}"}}}}"#, env.store.addr),
    ])?;
    let moved = wait_store(cp, far, "Ready at its new address", ready_with_pets(0))?;
    assert_kstatus(&[edited, moved.clone()], &["InProgress", "Current"])?;
    assert_eq!(moved["status"]["observedGeneration"], 2, "{moved}");
    assert_eq!(condition(&moved, "Reconciling"), None, "{moved}");

    // The Pets gone, no store counts them.
    for ns in ["team-a", "team-b"] {
        cp.kubectl(&["delete", "pets", "--all", "-n", ns, "--wait=true"])?;
    }
    for store in [near_a, near_b, shared] {
        wait_store(cp, store, "Ready with no Pets", ready_with_pets(0))?;
    }
    Ok(())
}
