//! Many stores, one operator: `PetStore` and `ClusterPetStore` name the
//! stores, and each Pet's record goes to the store its `storeRef` names,
//! or its namespace's default, or the operator's own, as docs/tenancy.md
//! says. A Pet that names a store it may not use, or one that does not
//! exist, is held within 2 s with a condition that says why, and writes
//! nothing anywhere; it becomes Ready as soon as it is allowed. Every count
//! is the stores' own.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fixtures::{ControlPlane, Env, PetStoreServer, Storage, TenancyFlags};
use petstore_operator::crd::Pet;
use serde_json::Value;

use crate::typed::{self, is_ready, wait_pet};

const TIMEOUT: Duration = Duration::from_secs(90);
/// How soon a Pet that may not write must show why: the issue's bound.
const HELD_WITHIN: Duration = Duration::from_secs(2);
/// How soon a held Pet is Ready once allowed: a watch event away, with
/// room for a machine twice as slow under the suite's load.
const ALLOWED_WITHIN: Duration = Duration::from_secs(15);

const TENANTS: [&str; 3] = ["team-a", "team-b", "team-c"];

fn pet(namespace: &str, name: &str, store_ref: Option<(&str, &str)>) -> String {
    let store_ref = store_ref
        .map(|(kind, store)| format!("\n  storeRef: {{kind: {kind}, name: {store}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  name: {name}\n  type: dog\n  birthday: \"2021-04-01\"{store_ref}\n"
    )
}

fn pet_store(namespace: &str, name: &str, store: &PetStoreServer) -> String {
    format!(
        "apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  address: http://{}\n  audience: petstore\n",
        store.addr
    )
}

fn cluster_pet_store(name: &str, store: &PetStoreServer, admits: &[&str]) -> String {
    format!(
        "apiVersion: petstore.example.com/v1\nkind: ClusterPetStore\nmetadata:\n  name: {name}\nspec:\n  address: http://{}\n  audience: petstore\n  allowedNamespaces:\n    names: [{}]\n",
        store.addr,
        admits.join(", ")
    )
}

/// Each tenant namespace, with the ServiceAccount whose tokens its Pets'
/// writes carry.
fn tenant_namespaces(cp: &ControlPlane) -> fixtures::Result<()> {
    for namespace in TENANTS {
        cp.ensure_namespace(namespace)?;
        cp.apply(&format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: petstore-tenant\n  namespace: {namespace}\n"
        ))?;
    }
    Ok(())
}

/// The record names in a store, sorted.
fn names(store: &PetStoreServer) -> fixtures::Result<Vec<String>> {
    let mut names: Vec<String> = store
        .all_pets()?
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// Waits for the Pet's Ready condition to say `reason`; how long it took
/// from `since`.
fn wait_reason(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    reason: &str,
    since: Instant,
) -> fixtures::Result<(Duration, String)> {
    let what = format!("held with {reason}");
    wait_pet(cp, namespace, name, TIMEOUT, &what, |pet| {
        let ready = pet.condition("Ready")?;
        (ready.reason == reason).then(|| (since.elapsed(), ready.message.clone()))
    })
}

fn wait_ready(cp: &ControlPlane, namespace: &str, name: &str) -> fixtures::Result<Pet> {
    wait_pet(cp, namespace, name, TIMEOUT, "Ready", |pet| {
        is_ready(pet).then(|| pet.clone())
    })
}

#[test]
fn each_pet_writes_to_the_store_it_may_use_and_nowhere_else() -> fixtures::Result<()> {
    let env = Env::start(Storage::Memory)?;
    let cp = &env.cp;
    let store_a =
        PetStoreServer::start_in(&cp.dir().join("store-a"), Storage::Memory, &[] as &[&str])?;
    let store_b =
        PetStoreServer::start_in(&cp.dir().join("store-b"), Storage::Memory, &[] as &[&str])?;
    tenant_namespaces(cp)?;
    cp.apply(&pet_store("team-a", "default", &store_a))?;
    cp.apply(&pet_store("team-b", "shared", &store_b))?;
    cp.apply(&cluster_pet_store("cluster-b", &store_b, &["team-c"]))?;
    let operator = env.start_operator("tenancy")?;

    // Each Pet in its store: the namespace's default, a named PetStore, a
    // ClusterPetStore that admits it, and the operator's own. All are
    // applied before any is waited for.
    let placed = [
        ("team-a", "rex", None),
        ("team-b", "fido", Some(("PetStore", "shared"))),
        ("team-c", "tom", Some(("ClusterPetStore", "cluster-b"))),
        ("default", "own", None),
    ];
    for (namespace, name, store_ref) in placed {
        cp.apply(&pet(namespace, name, store_ref))?;
    }
    let mut shown = BTreeMap::new();
    for (namespace, name, _) in placed {
        let ready = wait_ready(cp, namespace, name)?;
        shown.insert(name, ready.status.and_then(|status| status.store));
    }
    assert_eq!(names(&store_a)?, ["rex"]);
    assert_eq!(names(&store_b)?, ["fido", "tom"]);
    assert_eq!(names(&env.store)?, ["own"]);
    // Pinning status.store and then adding the finalizer are two writes of
    // one reconcile: the second carries the first's resourceVersion.
    assert!(
        !operator.log_contains("the object has been modified"),
        "a write of the operator's own reconcile conflicted with its previous one"
    );
    assert_eq!(
        shown,
        BTreeMap::from([
            ("rex", Some("PetStore/default".to_owned())),
            ("fido", Some("PetStore/shared".to_owned())),
            ("tom", Some("ClusterPetStore/cluster-b".to_owned())),
            ("own", None),
        ]),
        "status.store names each Pet's store; the operator's own is unset"
    );

    // A Pet that names another namespace's PetStore finds none of its own;
    // one that names a ClusterPetStore that does not admit its namespace is
    // refused. Both are held at once, and write nothing anywhere.
    let writes_before = [store_a.writes()?, store_b.writes()?, env.store.writes()?];
    let applied = Instant::now();
    cp.apply(&pet("team-b", "thief", Some(("PetStore", "default"))))?;
    cp.apply(&pet(
        "team-a",
        "intruder",
        Some(("ClusterPetStore", "cluster-b")),
    ))?;
    for (namespace, name, reason, says, why) in [
        (
            "team-b",
            "thief",
            "StoreNotFound",
            "no PetStore \"default\" in namespace team-b",
            "names what is missing",
        ),
        (
            "team-a",
            "intruder",
            "StoreNotAllowed",
            "does not admit namespace team-a",
            "says why",
        ),
    ] {
        let (took, message) = wait_reason(cp, namespace, name, reason, applied)?;
        assert!(
            took <= HELD_WITHIN,
            "{name} held after {took:?}, not within {HELD_WITHIN:?}"
        );
        assert!(message.contains(says), "the condition {why}: {message}");
    }
    // The operator's reads of a held Pet touch no store either: a held
    // Pet's reconciles ran (its condition) and wrote nothing.
    assert_eq!(
        [store_a.writes()?, store_b.writes()?, env.store.writes()?],
        writes_before,
        "a held Pet writes to no store"
    );
    for store in [&store_a, &store_b, &env.store] {
        let names = names(store)?;
        assert!(
            !names.iter().any(|n| n == "thief" || n == "intruder"),
            "{names:?}"
        );
    }

    // Once allowed, Ready: the ClusterPetStore's change wakes it, not its
    // backoff.
    let allowed = Instant::now();
    cp.apply(&cluster_pet_store(
        "cluster-b",
        &store_b,
        &["team-c", "team-a"],
    ))?;
    wait_ready(cp, "team-a", "intruder")?;
    let took = allowed.elapsed();
    assert!(
        took <= ALLOWED_WITHIN,
        "intruder Ready {took:?} after it was allowed"
    );
    assert_eq!(names(&store_b)?, ["fido", "intruder", "tom"]);

    // And the missing store, once made in its own namespace.
    cp.apply(&pet_store("team-b", "default", &store_a))?;
    wait_ready(cp, "team-b", "thief")?;
    assert_eq!(names(&store_a)?, ["rex", "thief"]);

    // Deleting the Pets deletes each record from its own store.
    for (namespace, name) in [
        ("team-a", "rex"),
        ("team-a", "intruder"),
        ("team-b", "fido"),
        ("team-b", "thief"),
        ("team-c", "tom"),
        ("default", "own"),
    ] {
        cp.kubectl(&["delete", "pet", name, "-n", namespace, "--wait=true"])?;
    }
    for store in [&store_a, &store_b, &env.store] {
        assert_eq!(names(store)?, Vec::<String>::new());
    }
    Ok(())
}

/// grpcurl against `store` as `token` (none: no header), answering the
/// messages or the error's text.
fn grpcurl_as(
    store: &PetStoreServer,
    token: Option<&str>,
    method: &str,
    data: &str,
) -> Result<Vec<Value>, String> {
    let method = format!("petstore.PetStore/{method}");
    match token {
        Some(token) => fixtures::petstore::grpcurl_with_token(&store.addr, token, &method, data),
        None => fixtures::petstore::grpcurl(&store.addr, &method, data),
    }
    .map_err(|error| error.to_string())
}

fn record_names(messages: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = messages
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_store_keeps_each_namespace_to_its_own_records() -> fixtures::Result<()> {
    let env = Env::start(Storage::Memory)?;
    let cp = &env.cp;
    let issuer = cp.token_issuer_flag()?;
    let tenancy = |audience: &str| TenancyFlags::new(&issuer, audience).args();
    let store = PetStoreServer::start_in(
        &cp.dir().join("shared"),
        Storage::Memory,
        &tenancy("shared"),
    )?;
    let other =
        PetStoreServer::start_in(&cp.dir().join("other"), Storage::Memory, &tenancy("other"))?;
    tenant_namespaces(cp)?;
    cp.apply(&format!(
        "apiVersion: petstore.example.com/v1\nkind: ClusterPetStore\nmetadata:\n  name: shared\nspec:\n  address: http://{}\n  audience: shared\n  allowedNamespaces:\n    names: [team-a, team-b]\n",
        store.addr
    ))?;
    let _operator = env.start_operator("tenancy-enforced")?;
    cp.apply(&pet("team-a", "rex", Some(("ClusterPetStore", "shared"))))?;
    cp.apply(&pet("team-b", "fido", Some(("ClusterPetStore", "shared"))))?;
    let rex = wait_ready(cp, "team-a", "rex")?;
    wait_ready(cp, "team-b", "fido")?;
    let rex_id = typed::id(&rex).unwrap_or_default().to_owned();

    // Each namespace reads its own records only.
    let team_a = cp.tenant_token("team-a", "shared")?;
    let team_b = cp.tenant_token("team-b", "shared")?;
    let search = |token: Option<&str>| grpcurl_as(&store, token, "SearchPets", "{}");
    assert_eq!(
        search(Some(&team_a)).map(|m| record_names(&m)),
        Ok(vec!["rex".to_owned()])
    );
    assert_eq!(
        search(Some(&team_b)).map(|m| record_names(&m)),
        Ok(vec!["fido".to_owned()])
    );
    // Without a token, with an expired-looking one, with one for another
    // store (its audience): refused, by the store.
    let for_other_store = cp.tenant_token("team-b", "other")?;
    for (what, token) in [
        ("no token", None),
        ("a forged token", Some("eyJhbGciOiJFUzI1NiJ9.e30.c2ln")),
        ("another store's token", Some(for_other_store.as_str())),
    ] {
        let answer = search(token);
        assert!(
            answer
                .as_ref()
                .is_err_and(|error| error.contains("Unauthenticated")),
            "{what}: {answer:?}"
        );
    }
    // The other store takes its own audience only.
    let other_token = for_other_store.clone();
    assert!(grpcurl_as(&other, Some(&other_token), "SearchPets", "{}").is_ok());
    assert!(grpcurl_as(&other, Some(&team_a), "SearchPets", "{}").is_err());

    // team-b writes to team-a's record directly: refused, record unchanged.
    let get_rex = |token: &str| {
        grpcurl_as(
            &store,
            Some(token),
            "GetPets",
            &format!("{{\"ids\":[\"{rex_id}\"]}}"),
        )
    };
    let before = get_rex(&team_a);
    for (method, data) in [
        (
            "UpdatePets",
            format!(
                "{{\"pets\":[{{\"id\":\"{rex_id}\",\"name\":\"stolen\",\"type\":\"PTCanine\",\"birthday\":{{\"year\":2021,\"month\":4,\"day\":1}}}}]}}"
            ),
        ),
        ("DeletePets", format!("{{\"ids\":[\"{rex_id}\"]}}")),
        (
            "SetIdempotencyKeys",
            format!(
                "{{\"changes\":[{{\"id\":\"{rex_id}\",\"expectedKey\":\"\",\"newKey\":\"x\"}}]}}"
            ),
        ),
    ] {
        let answer = grpcurl_as(&store, Some(&team_b), method, &data);
        assert!(
            answer
                .as_ref()
                .is_err_and(|error| error.contains("PermissionDenied")),
            "{method} by team-b on team-a's record: {answer:?}"
        );
    }
    let hidden =
        get_rex(&team_b).map_err(|error| fixtures::Error::Timeout(Duration::ZERO, error))?;
    assert_eq!(
        hidden[0]["missingIds"][0],
        rex_id.as_str(),
        "team-a's record is invisible to team-b"
    );
    assert_eq!(get_rex(&team_a), before, "team-a's record is unchanged");

    // A Pet of team-b that names team-a's record for adoption: the store
    // shows it no such record, so it is held, and writes nothing to it.
    let applied = Instant::now();
    cp.apply(&format!(
        "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: taker\n  namespace: team-b\n  annotations:\n    petstore.example.com/external-id: \"{rex_id}\"\nspec:\n  name: taker\n  type: dog\n  birthday: \"2021-04-01\"\n  storeRef: {{kind: ClusterPetStore, name: shared}}\n"
    ))?;
    let (took, message) = wait_reason(cp, "team-b", "taker", "RecordNotFound", applied)?;
    assert!(took <= HELD_WITHIN, "taker held after {took:?}: {message}");
    assert_eq!(get_rex(&team_a), before, "team-a's record is unchanged");
    Ok(())
}

/// A store that held records before tenancy is restarted with it, and the
/// operator given its audience (`--petstore-audience`): each Pet keeps its
/// record and ID, the upgrade writes nothing, and a Pet's first write
/// after it is one write (its tenant is stamped in the same
/// compare-and-set). A record made without an identity is every tenant's
/// to read and none's to write until one claims it, by the documented
/// import (an `external-id` Pet); from then on it is that tenant's alone.
#[test]
fn records_made_before_tenancy_keep_their_ids_and_take_their_tenant_on_the_first_write()
-> fixtures::Result<()> {
    let mut env = Env::start(Storage::Durable)?;
    tenant_namespaces(&env.cp)?;
    let operator = env.start_operator("before-tenancy")?;
    env.cp.apply(&pet("team-a", "rex", None))?;
    env.cp.apply(&pet("team-b", "fido", None))?;
    let ids: Vec<String> = [("team-a", "rex"), ("team-b", "fido")]
        .iter()
        .map(|(namespace, name)| {
            wait_ready(&env.cp, namespace, name)
                .map(|pet| typed::id(&pet).unwrap_or_default().to_owned())
        })
        .collect::<Result<_, _>>()?;
    let stray = env.store.add_unowned("stray")?;
    drop(operator);

    let issuer = env.cp.token_issuer_flag()?;
    env.store.set_restart_args(
        TenancyFlags::new(&issuer, "petstore")
            .operator_observer()
            .os_args(),
    );
    env.store.restart(Storage::Durable)?;
    let writes_before = env.store.writes()?;
    let mut options = env.operator_options("with-tenancy");
    options
        .extra_args
        .extend(["--petstore-audience".into(), "petstore".into()]);
    let operator = env.start_operator_with(&options)?;
    let cp = &env.cp;
    // Every Pet read again, and nothing written.
    operator.wait_reads_settled(Duration::from_secs(3), TIMEOUT)?;
    for ((namespace, name), id) in [("team-a", "rex"), ("team-b", "fido")].iter().zip(&ids) {
        let pet = wait_ready(cp, namespace, name)?;
        assert_eq!(typed::id(&pet), Some(id.as_str()), "{name} keeps its ID");
    }
    assert_eq!(
        env.store.writes()?,
        writes_before,
        "the upgrade wrote nothing"
    );

    // The first change of rex: one write.
    cp.patch_pet(
        "team-a",
        "rex",
        &["--type=merge", "-p", r#"{"spec":{"name":"rex-2"}}"#],
    )?;
    wait_pet(
        cp,
        "team-a",
        "rex",
        TIMEOUT,
        "Ready at generation 2",
        |pet| (is_ready(pet) && typed::observed_generation(pet) == Some(2)).then_some(()),
    )?;
    assert_eq!(env.store.writes()?, writes_before + 1.0, "one write");
    let team_a = cp.tenant_token("team-a", "petstore")?;
    let team_b = cp.tenant_token("team-b", "petstore")?;
    let get_ids = |token: &str, id: &str| {
        grpcurl_as(
            &env.store,
            Some(token),
            "GetPets",
            &format!("{{\"ids\":[\"{id}\"]}}"),
        )
    };
    assert_eq!(
        get_ids(&team_a, &ids[0]).map(|m| m[0]["pets"][0]["name"].clone()),
        Ok("rex-2".into())
    );
    assert!(
        get_ids(&team_b, &ids[0]).is_ok_and(|m| m[0]["missingIds"][0] == ids[0].as_str()),
        "team-a's record is not team-b's to read"
    );

    // kubectl petstore reads the own store as the Pet's namespace too,
    // given the operator's audience; without it the store refuses it.
    let rex_now = "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: rex\n  namespace: team-a\nspec:\n  name: rex-2\n  type: dog\n  birthday: \"2021-04-01\"\n";
    let addr: Vec<std::ffi::OsString> =
        vec!["--petstore-addr".into(), env.store.addr.clone().into()];
    let with_audience = [
        addr.clone(),
        vec!["--petstore-audience".into(), "petstore".into()],
    ]
    .concat();
    let planned = env.kubectl_petstore_plan(rex_now, &with_audience)?;
    assert_eq!(
        planned.code,
        Some(0),
        "nothing to change: {}",
        planned.stderr
    );
    let refused = env.kubectl_petstore_plan(rex_now, &addr)?;
    assert_eq!(
        refused.code,
        Some(1),
        "no token, refused: {}",
        refused.stderr
    );

    // The record without an identity: any tenant reads it, none writes it
    // directly, and the import claims it for its namespace.
    assert!(
        get_ids(&team_b, &stray).is_ok_and(|m| m[0]["pets"][0]["id"] == stray.as_str()),
        "an unclaimed record is readable"
    );
    let update = format!(
        "{{\"pets\":[{{\"id\":\"{stray}\",\"name\":\"mine\",\"type\":\"PTFeline\",\"birthday\":{{\"year\":2019,\"month\":5,\"day\":6}}}}]}}"
    );
    let refused = grpcurl_as(&env.store, Some(&team_b), "UpdatePets", &update);
    assert!(
        refused
            .as_ref()
            .is_err_and(|error| error.contains("PermissionDenied") && error.contains("import")),
        "{refused:?}"
    );
    cp.apply(&format!(
        "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata:\n  name: stray\n  namespace: team-a\n  annotations:\n    petstore.example.com/external-id: \"{stray}\"\nspec:\n  name: stray\n  type: cat\n  birthday: \"2019-05-06\"\n"
    ))?;
    let claimed = wait_ready(cp, "team-a", "stray")?;
    assert_eq!(typed::id(&claimed), Some(stray.as_str()));
    assert!(
        get_ids(&team_b, &stray).is_ok_and(|m| m[0]["missingIds"][0] == stray.as_str()),
        "once claimed, the record is team-a's alone"
    );
    Ok(())
}
