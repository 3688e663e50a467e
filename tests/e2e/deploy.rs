//! The shipped config/ against the real API server: server-side validation of
//! every manifest, and least privilege for the operator's ServiceAccount.

use std::process::Command;

use fixtures::{ControlPlane, Tools, repo_root};

const SA: &str = "system:serviceaccount:petstore-system:petstore-operator";

/// `kubectl auth can-i VERB RESOURCE --as=<operator SA> [-n NS | -A]`.
fn can_i(cp: &ControlPlane, verb: &str, resource: &str, namespace: Option<&str>) -> bool {
    can_i_with(cp, verb, resource, namespace, &[])
}

/// [`can_i`] on a resource's status subresource, in every namespace
/// (`-A`; a cluster-scoped resource has none).
fn can_i_status(cp: &ControlPlane, verb: &str, resource: &str) -> bool {
    can_i_with(cp, verb, resource, None, &["--subresource=status"])
}

fn can_i_with(
    cp: &ControlPlane,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
    extra: &[&str],
) -> bool {
    let mut command = Command::new(Tools::get().expect("tools").kubectl());
    command
        .arg(format!("--kubeconfig={}", cp.kubeconfig.display()))
        .args(["auth", "can-i", verb, resource, &format!("--as={SA}")])
        .args(extra);
    match namespace {
        Some(ns) => command.args(["-n", ns]),
        None => command.arg("-A"),
    };
    let out = command.output().expect("run kubectl auth can-i");
    // can-i prints yes/no and exits 1 for "no"; anything else is a failure.
    match String::from_utf8_lossy(&out.stdout).trim() {
        "yes" => true,
        "no" => false,
        other => panic!(
            "kubectl auth can-i {verb} {resource}: {other:?} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[test]
fn config_default_and_the_store_pass_server_side_validation_and_install() -> fixtures::Result<()> {
    let cp = ControlPlane::start()?;
    let config = repo_root().join("config");
    let default = config.join("default");
    // A dry run creates nothing, so namespaced objects need their namespaces.
    fixtures::env::create_config_namespaces(&cp)?;
    let store = config.join("petstore");
    let dry_run = |bundle: &std::path::Path| {
        cp.kubectl(&["apply", "-k", &bundle.to_string_lossy(), "--dry-run=server"])
    };
    let (dry, dry_store) = (dry_run(&default)?, dry_run(&store)?);
    let created =
        |output: &str, object: &str| output.contains(&format!("{object} created (server dry run)"));
    for object in [
        "customresourcedefinition.apiextensions.k8s.io/pets.petstore.example.com",
        "customresourcedefinition.apiextensions.k8s.io/petstores.petstore.example.com",
        "customresourcedefinition.apiextensions.k8s.io/clusterpetstores.petstore.example.com",
        "serviceaccount/petstore-operator",
        "role.rbac.authorization.k8s.io/petstore-operator-leader-election",
        "clusterrole.rbac.authorization.k8s.io/petstore-operator",
        "rolebinding.rbac.authorization.k8s.io/petstore-operator-leader-election",
        "role.rbac.authorization.k8s.io/petstore-operator-observer",
        "rolebinding.rbac.authorization.k8s.io/petstore-operator-observer",
        "clusterrolebinding.rbac.authorization.k8s.io/petstore-operator",
        "service/petstore-operator-metrics",
        "deployment.apps/petstore-operator",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/petstore-operator-crd-guard",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/petstore-operator-store-guard",
    ] {
        assert!(created(&dry, object), "{object}:\n{dry}");
    }
    // The store is a bundle of its own, so deleting the operator's leaves it.
    // (Its namespace already exists for the dry run: "unchanged".)
    for object in [
        "namespace/petstore",
        "service/petstore-service",
        "persistentvolumeclaim/petstore-data",
        "deployment.apps/petstore",
        "role.rbac.authorization.k8s.io/petstore-operator-store-trust",
    ] {
        assert!(
            dry_store.contains(&format!("{object} ")),
            "{object}:\n{dry_store}"
        );
        assert!(
            !dry.contains(&format!("{object} ")),
            "config/default holds the store's {object}:\n{dry}"
        );
    }

    // Install for real and read back what the API server stored.
    cp.kubectl(&["apply", "-k", &default.to_string_lossy()])?;
    cp.kubectl(&["apply", "-k", &store.to_string_lossy()])?;
    // Each object with a JSONPath into it and what it must read. Both
    // namespaces enforce the restricted Pod Security Standard, so the API
    // server would refuse pods that broke it.
    let stored: [(&[&str], &str, &str); 6] = [
        (
            &["service", "petstore-service", "-n", "petstore"],
            "{.spec.ports[0].name}:{.spec.ports[0].port}",
            "grpc:6742",
        ),
        // Probed on the plain metrics port (the gRPC port asks for a client
        // certificate), and serving mutual TLS from the Secret the operator
        // makes.
        (
            &["deployment", "petstore", "-n", "petstore"],
            "{.spec.template.spec.containers[0].readinessProbe.httpGet.path}:{.spec.template.spec.containers[0].readinessProbe.httpGet.port}/{.spec.template.spec.volumes[?(@.name==\"tls\")].secret.secretName}",
            "/readyz:metrics/petstore-tls",
        ),
        (
            &["deployment", "petstore-operator", "-n", "petstore-system"],
            "{.spec.template.spec.containers[0].env[?(@.name==\"PETSTORE_STORE_CERTIFICATES\")].value}/{.spec.template.spec.containers[0].env[?(@.name==\"PETSTORE_AUDIENCE\")].value}/{.spec.template.spec.containers[0].env[?(@.name==\"PETSTORE_PUBLISH_TOKEN_ISSUER\")].value}",
            "petstore/petstore-tls/petstore/petstore/petstore-token-issuer",
        ),
        // Tenancy, checked against the issuer the operator publishes.
        (
            &["deployment", "petstore", "-n", "petstore"],
            "{.spec.template.spec.containers[0].env[?(@.name==\"PETSTORE_TENANCY\")].value}/{.spec.template.spec.containers[0].env[?(@.name==\"PETSTORE_OBSERVERS\")].value}/{.spec.template.spec.volumes[?(@.name==\"token-issuer\")].configMap.name}",
            "true/system:serviceaccount:petstore-system:petstore-operator/petstore-token-issuer",
        ),
        (
            &["deployment", "petstore-operator", "-n", "petstore-system"],
            "{.spec.replicas}/{.spec.template.spec.securityContext.runAsNonRoot}/{.spec.template.spec.containers[0].securityContext.readOnlyRootFilesystem}/{.spec.template.spec.containers[0].securityContext.capabilities.drop[0]}/{.spec.template.spec.securityContext.seccompProfile.type}",
            "2/true/true/ALL/RuntimeDefault",
        ),
        (
            &["namespace", "petstore"],
            "{.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
            "restricted",
        ),
    ];
    for (object, jsonpath, expected) in stored {
        let output = format!("jsonpath={jsonpath}");
        let read = cp.kubectl(&[&["get"], object, &["-o", &output]].concat())?;
        assert_eq!(read, expected, "{object:?} {jsonpath}");
    }
    assert_restricted_pod_security(&cp, &["petstore-system", "petstore"])
}

/// In each of `namespaces`, the API server refuses a Pod that breaks the
/// restricted Pod Security Standard, naming what it breaks, and admits one
/// that keeps it (server-side dry runs: the refusal is admission's, and
/// nothing is left behind).
fn assert_restricted_pod_security(cp: &ControlPlane, namespaces: &[&str]) -> fixtures::Result<()> {
    let pod = |namespace: &str, name: &str, spec: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n{spec}"
        )
    };
    let breaking = "  hostNetwork: true
  containers:
    - name: c
      image: busybox
      securityContext: {privileged: true, runAsUser: 0}
";
    let keeping = "  securityContext: {runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: c
      image: busybox
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {drop: [ALL]}
";
    for namespace in namespaces {
        // The Pods run as the namespace's default ServiceAccount, which
        // this control plane (no ServiceAccount controller) does not make.
        cp.kubectl_stdin(
            &["apply", "-f", "-"],
            &format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: default, namespace: {namespace}}}\n"),
        )?;
        let refused = cp
            .kubectl_stdin(
                &["apply", "--dry-run=server", "-f", "-"],
                &pod(namespace, "breaks-restricted", breaking),
            )
            .expect_err("a privileged, root, host-network Pod is refused");
        let message = refused.to_string();
        let unsaid: Vec<&str> = [
            "violates PodSecurity \"restricted:latest\"",
            "host namespaces (hostNetwork=true)",
            "privileged (container \"c\" must not set securityContext.privileged=true)",
            "runAsUser=0",
        ]
        .into_iter()
        .filter(|said| !message.contains(said))
        .collect();
        assert!(
            unsaid.is_empty(),
            "{namespace}: {unsaid:?} not in {message}"
        );
        cp.kubectl_stdin(
            &["apply", "--dry-run=server", "-f", "-"],
            &pod(namespace, "keeps-restricted", keeping),
        )?;
    }
    Ok(())
}

#[test]
fn operator_service_account_has_least_privilege() -> fixtures::Result<()> {
    let cp = fixtures::env::start_installed(ControlPlane::builder())?;
    let config = repo_root().join("config");

    // What it needs.
    for (verb, resource) in [
        ("list", "pets.petstore.example.com"),
        ("watch", "pets.petstore.example.com"),
        ("patch", "pets.petstore.example.com"),
        ("update", "pets.petstore.example.com"),
        ("create", "events.events.k8s.io"),
        // The stores Pets name, the namespaces a ClusterPetStore admits by
        // label, and a store's CA, by name.
        ("list", "petstores.petstore.example.com"),
        ("watch", "clusterpetstores.petstore.example.com"),
        ("watch", "namespaces"),
        ("get", "secrets"),
        ("get", "configmaps"),
    ] {
        assert!(can_i(&cp, verb, resource, None), "needs {verb} {resource}");
    }
    // Nothing it does not use (the suite's RBAC audit finds every other
    // verb unused too).
    for (verb, resource) in [
        ("get", "pets.petstore.example.com"),
        ("patch", "events.events.k8s.io"),
        ("get", "petstores.petstore.example.com"),
    ] {
        assert!(
            !can_i(&cp, verb, resource, None),
            "{verb} {resource} is unused"
        );
    }
    assert!(
        !can_i_with(
            &cp,
            "update",
            "pets.petstore.example.com",
            None,
            &["--subresource=finalizers"]
        ),
        "update pets/finalizers is unused"
    );
    for resource in [
        "pets.petstore.example.com",
        "petstores.petstore.example.com",
        "clusterpetstores.petstore.example.com",
    ] {
        assert!(
            can_i_status(&cp, "patch", resource),
            "needs patch {resource}/status"
        );
        // The status writer only patches.
        for verb in ["get", "update"] {
            assert!(
                !can_i_status(&cp, verb, resource),
                "{verb} {resource}/status is unused"
            );
        }
    }
    // Tokens for the one tenant ServiceAccount name (writes), its own
    // account in its own namespace (the stores' change feeds), and no other.
    let mint = |account: &str, namespace: &str| {
        can_i_with(
            &cp,
            "create",
            &format!("serviceaccounts/{account}"),
            Some(namespace),
            &["--subresource=token"],
        )
    };
    assert!(
        mint("petstore-tenant", "team-a"),
        "needs tokens for petstore-tenant"
    );
    assert!(
        mint("petstore-operator", "petstore-system"),
        "needs its own tokens, to read the stores' change feeds"
    );
    for (account, namespace) in [
        ("petstore-operator", "team-a"),
        ("default", "petstore-system"),
        ("petstore-other", "petstore-system"),
        ("default", "team-a"),
    ] {
        assert!(
            !mint(account, namespace),
            "must not mint tokens for {namespace}/{account}"
        );
    }
    assert!(can_i(
        &cp,
        "patch",
        "leases.coordination.k8s.io",
        Some("petstore-system")
    ));
    // The conversion webhook: its own certificate Secret, and its own CRD.
    for verb in ["get", "update"] {
        assert!(
            can_i(
                &cp,
                verb,
                "secrets/petstore-operator-webhook-tls",
                Some("petstore-system")
            ),
            "needs {verb} on its webhook Secret"
        );
    }
    assert!(can_i(&cp, "create", "secrets", Some("petstore-system")));
    // The store channel's certificates, beside the store (config/petstore
    // grants it): its two Secrets there, and creating them; never replacing
    // another Secret of the store's namespace.
    cp.ensure_namespace("petstore")?;
    cp.kubectl(&[
        "apply",
        "-f",
        &config.join("petstore/trust_role.yaml").to_string_lossy(),
    ])?;
    for secret in ["petstore-tls", "petstore-store-client"] {
        for verb in ["get", "update"] {
            assert!(
                can_i(&cp, verb, &format!("secrets/{secret}"), Some("petstore")),
                "needs {verb} on the store's Secret {secret}"
            );
        }
    }
    assert!(can_i(&cp, "create", "secrets", Some("petstore")));
    assert!(
        !can_i(&cp, "update", "secrets/petstore-postgres", Some("petstore")),
        "must not replace the store's other Secrets"
    );
    // And the token issuer it publishes there for tenancy, read from the
    // API server's OIDC discovery.
    for verb in ["get", "update"] {
        assert!(
            can_i(
                &cp,
                verb,
                "configmaps/petstore-token-issuer",
                Some("petstore")
            ),
            "needs {verb} on the ConfigMap petstore-token-issuer"
        );
    }
    assert!(can_i(&cp, "create", "configmaps", Some("petstore")));
    assert!(!can_i(&cp, "update", "configmaps/other", Some("petstore")));
    for path in ["/.well-known/openid-configuration", "/openid/v1/jwks"] {
        assert!(can_i(&cp, "get", path, Some("default")), "needs get {path}");
    }
    for verb in ["get", "patch"] {
        assert!(
            can_i(
                &cp,
                verb,
                "customresourcedefinitions.apiextensions.k8s.io/pets.petstore.example.com",
                None
            ),
            "needs {verb} on the Pet CRD"
        );
    }

    // The storage migration lists the storage version alone as stored.
    assert!(
        can_i_status(
            &cp,
            "patch",
            "customresourcedefinitions.apiextensions.k8s.io/pets.petstore.example.com"
        ),
        "needs patch on the Pet CRD's status"
    );
    assert!(
        !can_i_status(
            &cp,
            "patch",
            "customresourcedefinitions.apiextensions.k8s.io/leases.example.com"
        ),
        "must not patch another CRD's status"
    );

    // What it must not have.
    for (verb, resource) in [
        ("list", "secrets"),
        ("delete", "pets.petstore.example.com"),
        ("create", "pets.petstore.example.com"),
        ("deletecollection", "pets.petstore.example.com"),
        ("create", "petstores.petstore.example.com"),
        ("delete", "clusterpetstores.petstore.example.com"),
        ("update", "petstores.petstore.example.com"),
        ("watch", "secrets"),
        ("list", "configmaps"),
        ("get", "pods"),
        ("list", "pods"),
        ("create", "pods"),
        ("delete", "pods"),
        ("create", "pods/exec"),
        ("create", "configmaps"),
        ("create", "deployments.apps"),
        ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ] {
        assert!(
            !can_i(&cp, verb, resource, None),
            "must not {verb} {resource}"
        );
    }
    assert!(
        !can_i(&cp, "patch", "leases.coordination.k8s.io", Some("default")),
        "Leases only in its own namespace"
    );
    // Changes only its own Secret, in its own namespace, and only the Pet
    // CRD. (It may get any Secret by name, for a store's CA.)
    for (verb, resource, namespace) in [
        ("update", "secrets/other", "petstore-system"),
        ("list", "secrets", "petstore-system"),
        ("watch", "secrets", "petstore-system"),
        (
            "delete",
            "secrets/petstore-operator-webhook-tls",
            "petstore-system",
        ),
        ("update", "secrets/petstore-operator-webhook-tls", "default"),
        ("create", "secrets", "default"),
    ] {
        assert!(
            !can_i(&cp, verb, resource, Some(namespace)),
            "must not {verb} {resource} in {namespace}"
        );
    }
    for (verb, resource) in [
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
        (
            "patch",
            "customresourcedefinitions.apiextensions.k8s.io/leases.example.com",
        ),
        (
            "delete",
            "customresourcedefinitions.apiextensions.k8s.io/pets.petstore.example.com",
        ),
    ] {
        assert!(
            !can_i(&cp, verb, resource, None),
            "must not {verb} {resource}"
        );
    }

    // And with the account's own token, not just impersonation.
    let token = cp.service_account_kubeconfig("petstore-system", "petstore-operator")?;
    cp.kubectl(&[
        "apply",
        "-f",
        &config.join("samples/pet-sample1.yaml").to_string_lossy(),
    ])?;
    for args in [
        &["get", "secrets", "-A"][..],
        &["get", "pods", "-A"][..],
        &["delete", "pet", "pet-sample1", "-n", "default"][..],
    ] {
        let err = cp.kubectl_as(&token, args).expect_err("forbidden");
        assert!(err.to_string().contains("forbidden"), "{args:?}: {err}");
    }
    assert!(cp.kubectl_as(&token, &["get", "pets", "-A"]).is_ok());
    Ok(())
}
