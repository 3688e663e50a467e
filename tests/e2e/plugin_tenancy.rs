//! `kubectl petstore` acts with its caller's rights on a store that checks
//! tenants (docs/tenancy.md): `plan` reads a Pet's record from the store
//! its `storeRef` names, with a token of the Pet's namespace minted as the
//! caller; `import -n team-a --store-ref PetStore/shared` lists team-a's
//! records only, and its manifests put the Pets on that store; and the
//! same import into a namespace where the caller may not mint tokens fails
//! with an error that names the namespace, the ServiceAccount and the RBAC
//! needed, before any call reaches the store (the store's own counters).
//! The caller is a ServiceAccount with a Role in team-a only (and read-only
//! rights in team-b), so RBAC is the API server's, as for any user.

use std::path::Path;
use std::time::Duration;

use fixtures::env::Planned;
use fixtures::petstore::{added_id, grpcurl_with_token};
use fixtures::{ControlPlane, Env, PetStoreServer, Storage, wait_for};
use serde_json::Value;

use crate::typed::{self, is_ready};

const TIMEOUT: Duration = Duration::from_secs(90);
/// The audience the tenancy store's tokens must carry.
const AUDIENCE: &str = "shared";

/// The namespaces, their tenant ServiceAccounts and a PetStore `shared` in
/// each (one store behind both), and in team-a the PetStore `plain`, a
/// store without tenancy; the caller `alice` (a ServiceAccount of
/// namespace `users`) with a Role in team-a that lets her plan and import
/// there, and one in team-b that lets her read Pets and PetStores only.
fn setup(store: &PetStoreServer, plain: &PetStoreServer) -> String {
    let mut yaml = String::from(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: users}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: alice, namespace: users}\n",
    );
    for namespace in ["team-a", "team-b"] {
        yaml.push_str(&format!(
            "---
apiVersion: v1
kind: Namespace
metadata: {{name: {namespace}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: petstore-tenant, namespace: {namespace}}}
---
apiVersion: petstore.example.com/v1
kind: PetStore
metadata: {{name: shared, namespace: {namespace}}}
spec: {{address: \"http://{addr}\", audience: {AUDIENCE}}}
",
            addr = store.addr
        ));
    }
    yaml.push_str(&format!(
        "---\napiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata: {{name: plain, namespace: team-a}}\nspec: {{address: \"http://{}\"}}\n",
        plain.addr
    ));
    let role = |namespace: &str, name: &str, rules: &str| {
        format!(
            "---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}, namespace: {namespace}}}
rules:
{rules}---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}-alice, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}}}
subjects: [{{kind: ServiceAccount, name: alice, namespace: users}}]
"
        )
    };
    let read = "- {apiGroups: [petstore.example.com], resources: [petstores], verbs: [get]}\n";
    yaml.push_str(&role(
        "team-a",
        "petstore-user",
        &format!(
            "- {{apiGroups: [petstore.example.com], resources: [pets], verbs: [get, list, create, patch]}}\n{read}- {{apiGroups: [\"\"], resources: [serviceaccounts/token], resourceNames: [petstore-tenant], verbs: [create]}}\n"
        ),
    ));
    yaml.push_str(&role(
        "team-b",
        "petstore-reader",
        &format!(
            "- {{apiGroups: [petstore.example.com], resources: [pets], verbs: [get, list]}}\n{read}"
        ),
    ));
    yaml
}

/// A Pet on the namespace's PetStore `store`; `more` adds spec fields.
fn pet(namespace: &str, name: &str, pet_name: &str, store: &str, more: &str) -> String {
    format!(
        "apiVersion: petstore.example.com/v1\nkind: Pet\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec: {{name: {pet_name}, type: dog, birthday: \"2021-04-01\", storeRef: {{kind: PetStore, name: {store}}}{more}}}\n"
    )
}

/// Adds a record owned by nobody as `namespace` (the store keeps it that
/// namespace's), as a team adding pets with grpcurl would; its ID.
fn add_record(
    cp: &ControlPlane,
    store: &PetStoreServer,
    namespace: &str,
    name: &str,
) -> fixtures::Result<String> {
    let token = cp.tenant_token(namespace, AUDIENCE)?;
    let reply = grpcurl_with_token(
        &store.addr,
        &token,
        "petstore.PetStore/AddPets",
        &format!(
            r#"{{"pets":[{{"name":"{name}","type":"PTFeline","birthday":{{"year":2019,"month":5,"day":6}}}}]}}"#
        ),
    )?;
    Ok(added_id(&reply).unwrap_or_default().to_owned())
}

/// `kubectl petstore <args>` as the user `kubeconfig` names.
fn kubectl_petstore_as(kubeconfig: &Path, args: &[&str]) -> fixtures::Result<Planned> {
    let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    fixtures::env::kubectl_petstore_as(kubeconfig, &args)
}

/// Every call the store has answered, whatever the answer, and every call
/// its tenancy refused: its own `/metrics`.
fn store_calls(store: &PetStoreServer) -> fixtures::Result<(f64, f64)> {
    let scrape = fixtures::http::scrape(&store.metrics_addr)?;
    Ok((
        fixtures::http::sum_series(&scrape, "petstore_server_rpc_duration_seconds_count", ""),
        fixtures::http::sum_series(&scrape, "petstore_server_tenant_refusals_total", ""),
    ))
}

#[test]
fn the_plugin_reads_a_tenancy_store_as_its_caller_and_only_where_the_caller_may()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Memory)?;
    let cp = &env.cp;
    let issuer = cp.token_issuer_flag()?;
    let store = PetStoreServer::start_in(
        &cp.dir().join("tenancy"),
        Storage::Memory,
        &fixtures::TenancyFlags::new(&issuer, AUDIENCE).args(),
    )?;
    cp.apply(&setup(&store, &env.store))?;
    let alice = cp.service_account_kubeconfig("users", "alice")?;
    let mut operator = env.start_operator("plugin-tenancy")?;
    cp.apply(
        &[
            pet("team-a", "rex", "Rex", "shared", ""),
            pet("team-b", "fido", "Fido", "shared", ""),
        ]
        .join("---\n"),
    )?;
    let rex_id = wait_for(TIMEOUT, "rex and fido Ready", || {
        let rex = typed::pet(cp, "team-a", "rex").ok()?;
        let fido = typed::pet(cp, "team-b", "fido").ok()?;
        (is_ready(&rex) && is_ready(&fido)).then(|| typed::id(&rex).map(str::to_owned))?
    })?;
    let stray_a = add_record(cp, &store, "team-a", "Stray A")?;
    add_record(cp, &store, "team-b", "Stray B")?;

    // (a) plan, as alice: rex's rename, read from the tenancy store with
    // team-a's token, is the plan the operator shows, byte for byte. The
    // own store (--petstore-addr) has no record of rex: read there, the
    // plan would be a create.
    let renamed = pet(
        "team-a",
        "rex",
        "Rexford",
        "shared",
        ", changePolicy: Approve",
    );
    cp.apply(&renamed)?;
    let shown = wait_for(TIMEOUT, "rex's plan: update name", || {
        let rex = cp.pet("team-a", "rex").ok()?;
        (rex["status"]["plan"]["summary"] == "update name").then(|| rex["status"]["plan"].clone())
    })?;
    let own = ["--petstore-addr", env.store.addr.as_str()];
    // `kubectl petstore plan -f <file>` as alice, `manifest` written to
    // `file` first.
    let plan_as_alice = |file: &str, manifest: &str| -> fixtures::Result<Planned> {
        let path = cp.dir().join(file);
        std::fs::write(&path, manifest).map_err(fixtures::io(format!("writing {file}")))?;
        let path = path.to_string_lossy().into_owned();
        kubectl_petstore_as(&alice, &[&["plan", "-f", &path][..], &own].concat())
    };
    let planned = plan_as_alice("rex.yaml", &renamed)?;
    assert_eq!(planned.code, Some(2), "{}", planned.stderr);
    let printed: Value = serde_json::from_str(planned.stdout.trim()).map_err(|error| {
        fixtures::io("the plan printed")(std::io::Error::other(format!(
            "{error}: {}",
            planned.stdout
        )))
    })?;
    assert_eq!(printed, shown, "the plugin's plan is the operator's");
    assert_eq!(
        printed["actions"][0]["recordId"], rex_id,
        "read from the record in the tenancy store: {printed}"
    );
    // A Pet whose store does not exist: named with the operator's reason,
    // the other Pets still planned, and exit 1.
    let ghost = pet("team-a", "ghost", "Ghost", "missing", "");
    let planned = plan_as_alice("both.yaml", &format!("{renamed}---\n{ghost}"))?;
    assert_eq!(planned.code, Some(1), "{}", planned.stderr);
    assert!(
        planned.stderr.contains(
            "pet team-a/ghost: no store it may use: StoreNotFound: no PetStore \"missing\" in namespace team-a"
        ),
        "{}",
        planned.stderr
    );
    assert_eq!(
        planned.stdout.lines().count(),
        1,
        "rex planned: {}",
        planned.stdout
    );

    // (b) import as alice into team-a: team-a's records only (rex's, a
    // live Pet's, left out), never team-b's in the same store; each
    // manifest names the store, so applied, the Pet uses it.
    let imported = kubectl_petstore_as(
        &alice,
        &[
            "import",
            "-n",
            "team-a",
            "--store-ref",
            "PetStore/shared",
            "--change-policy",
            "Automatic",
        ],
    )?;
    assert_eq!(imported.code, Some(0), "{}", imported.stderr);
    assert!(
        imported.stderr.starts_with(
            "1 of 2 records in PetStore team-a/shared, read as namespace team-a, as Pet manifests; left out: 1 owned by Pets of namespace team-a"
        ),
        "{}",
        imported.stderr
    );
    let yaml = &imported.stdout;
    assert_eq!(yaml.matches("kind: Pet\n").count(), 1, "{yaml}");
    assert!(
        yaml.contains("name: Stray A")
            && yaml.contains("namespace: team-a")
            && yaml.contains("storeRef:\n    kind: PetStore\n    name: shared"),
        "{yaml}"
    );
    for theirs in ["Stray B", "Fido", "team-b"] {
        assert!(!yaml.contains(theirs), "team-b's {theirs} listed: {yaml}");
    }
    cp.apply(yaml)?;
    let adopted = wait_for(TIMEOUT, "the imported Pet Ready", || {
        typed::pets(cp, Some("team-a"))
            .ok()?
            .into_iter()
            .find(|pet| pet.spec.name == "Stray A" && is_ready(pet))
    })?;
    let status = adopted.status.as_ref();
    assert_eq!(typed::id(&adopted), Some(stray_a.as_str()));
    assert_eq!(
        status.and_then(|s| s.store.as_deref()),
        Some("PetStore/shared")
    );
    // A store without tenancy shows every record: one named after a Pet of
    // team-b is left out of team-a's import, not put in team-b.
    env.store.grpcurl(
        "petstore.PetStore/AddPets",
        r#"{"pets":[{"name":"Local","type":"PTFeline","birthday":{"year":2019,"month":5,"day":6}},{"name":"Theirs","type":"PTFeline","birthday":{"year":2019,"month":5,"day":6},"identity":"team-b/theirs"}]}"#,
    )?;
    let plain = kubectl_petstore_as(
        &alice,
        &["import", "-n", "team-a", "--store-ref", "PetStore/plain"],
    )?;
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    assert!(
        plain.stdout.contains("name: Local") && !plain.stdout.contains("Theirs"),
        "{}",
        plain.stdout
    );
    assert!(
        plain
            .stderr
            .starts_with("1 of 2 records in PetStore team-a/plain")
            && plain
                .stderr
                .contains("1 named after Pets of other namespaces"),
        "{}",
        plain.stderr
    );

    // (c) import as alice into team-b, where she may read Pets and
    // PetStores but not mint tokens: a clear refusal, and no call reaches
    // the store. With the operator stopped, the store's counters are the
    // plugin's alone.
    operator.kill();
    let before = store_calls(&store)?;
    let refused = kubectl_petstore_as(
        &alice,
        &["import", "-n", "team-b", "--store-ref", "PetStore/shared"],
    )?;
    assert_eq!(refused.code, Some(1), "{}", refused.stderr);
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    for needed in [
        "kubectl petstore import: you may not mint tokens for ServiceAccount team-b/petstore-tenant",
        "may not read the store as namespace team-b",
        "create on serviceaccounts/token for resourceNames [petstore-tenant]",
    ] {
        assert!(
            refused.stderr.contains(needed),
            "{needed:?} missing: {}",
            refused.stderr
        );
    }
    assert_eq!(
        store_calls(&store)?,
        before,
        "the store saw a call from a caller who may not act as team-b"
    );

    // The RBAC the error asks for, granted as it says: the same import
    // now lists team-b's records, and only those.
    let suggested = refused
        .stderr
        .split('`')
        .nth(1)
        .and_then(|command| command.strip_prefix("kubectl "))
        .unwrap_or_default();
    cp.kubectl(&suggested.split_whitespace().collect::<Vec<_>>())?;
    cp.kubectl(&[
        "create",
        "rolebinding",
        "petstore-tenant-token-alice",
        "-n",
        "team-b",
        "--role=petstore-tenant-token",
        "--serviceaccount=users:alice",
    ])?;
    // The API server's RBAC sees a new binding within moments.
    let granted = wait_for(TIMEOUT, "alice's import into team-b, once granted", || {
        kubectl_petstore_as(
            &alice,
            &["import", "-n", "team-b", "--store-ref", "PetStore/shared"],
        )
        .ok()
        .filter(|granted| granted.code == Some(0))
    })?;
    assert_eq!(
        granted.stdout.matches("kind: Pet\n").count(),
        1,
        "{}",
        granted.stdout
    );
    assert!(
        granted.stdout.contains("name: Stray B") && !granted.stdout.contains("Stray A"),
        "{}",
        granted.stdout
    );
    Ok(())
}

/// From outside the cluster a store's `spec.address` is an in-cluster name
/// no laptop resolves. `--store-address` dials a port-forward instead, and
/// TLS still checks the name the spec gives: the store's certificate is
/// only for `petstore.team-a.svc`, and a PetStore whose spec names another
/// host is refused through the same forward.
#[test]
fn the_plugin_reaches_a_store_through_a_port_forward_and_still_checks_its_name()
-> fixtures::Result<()> {
    let env = Env::start(Storage::Memory)?;
    let cp = &env.cp;
    let (cert, key) = cp
        .pki()
        .issue_server_for("far-store", &["petstore.team-a.svc".to_owned()])?;
    // Started here: the fixtures' store checks its health as 127.0.0.1,
    // which this certificate does not name.
    let addr = format!("127.0.0.1:{}", fixtures::free_port()?);
    let mut command = std::process::Command::new(fixtures::cargo_bin("petstore-server")?);
    command
        .args(["--listen", &addr, "--storage", "memory"])
        .args([
            "--metrics-listen",
            &format!("127.0.0.1:{}", fixtures::free_port()?),
        ])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key);
    let _store = fixtures::Process::spawn("far-store", command, &cp.dir().join("far-store.log"))?;
    wait_for(TIMEOUT, "the store listening", || {
        std::net::TcpStream::connect(&addr).ok().map(drop)
    })?;
    // What `kubectl port-forward` gives: a local port to the store.
    let forward = fixtures::forwarder::Forwarder::start(vec![addr.clone()])?;
    let ca = std::fs::read_to_string(&cp.pki().ca_cert).map_err(fixtures::io("the CA"))?;
    let ca_map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "petstore-ca", "namespace": "team-a"},
        "data": {"ca.crt": ca},
    });
    cp.ensure_namespace("team-a")?;
    cp.apply(&ca_map.to_string())?;
    // The plugin sends the namespace's token, as it does to any PetStore.
    cp.apply(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: petstore-tenant, namespace: team-a}\n",
    )?;
    for (name, host) in [
        ("far", "petstore.team-a.svc"),
        ("misnamed", "other.team-a.svc"),
    ] {
        cp.apply(&format!(
            "apiVersion: petstore.example.com/v1\nkind: PetStore\nmetadata: {{name: {name}, namespace: team-a}}\nspec:\n  address: https://{host}:6742\n  tls:\n    ca:\n      configMapKeyRef: {{name: petstore-ca, key: ca.crt}}\n"
        ))?;
    }
    let import = |store: &str, address: Option<&str>| {
        let store_ref = format!("PetStore/{store}");
        let redirect = address.map(|to| format!("--store-address=PetStore/team-a/{store}={to}"));
        let mut args = vec!["import", "-n", "team-a", "--store-ref", &store_ref];
        args.extend(redirect.as_deref());
        kubectl_petstore_as(&cp.kubeconfig, &args)
    };
    let through = forward.addr.clone();

    let unrouted = import("far", None)?;
    assert_eq!(unrouted.code, Some(1), "{}", unrouted.stderr);
    let forwarded = import("far", Some(&through))?;
    assert_eq!(forwarded.code, Some(0), "{}", forwarded.stderr);
    assert!(
        forwarded
            .stderr
            .starts_with("0 of 0 records in PetStore team-a/far, read as namespace team-a,"),
        "{}",
        forwarded.stderr
    );
    let misnamed = import("misnamed", Some(&through))?;
    assert_eq!(misnamed.code, Some(1), "{}", misnamed.stderr);
    assert!(
        misnamed.stderr.contains("certificate") || misnamed.stderr.contains("Certificate"),
        "refused for the name its spec gives: {}",
        misnamed.stderr
    );
    Ok(())
}
