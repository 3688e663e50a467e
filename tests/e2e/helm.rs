//! The Helm chart, charts/petstore-operator, against config/: `helm lint`,
//! what it renders compared field by field with what kustomize renders, a
//! server-side dry run, the values schema's refusals, and a real install,
//! upgrade and uninstall on the fixtures' API server, with the CRDs
//! upgraded and kept.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use fixtures::helm::{Helm, chart_dir};
use fixtures::{ControlPlane, Error, Tools, repo_root};
use serde::Deserialize as _;
use serde_json::Value;

/// What the chart renders beyond config/, each a choice its README
/// documents: (kind, field path, value). Nothing else may differ with the
/// default values.
const CHART_ADDS: &[(&str, &[&str], &str)] = &[
    // `helm uninstall` leaves the CRDs, and every Pet and store with them.
    (
        "CustomResourceDefinition",
        &["metadata", "annotations", "helm.sh/resource-policy"],
        "keep",
    ),
];

/// Every object of a multi-document YAML stream (empty documents skipped).
fn objects(what: &str, yaml: &str) -> fixtures::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for document in serde_norway::Deserializer::from_str(yaml) {
        let object = Value::deserialize(document).map_err(|e| Error::Command {
            command: format!("parsing {what}"),
            status: "not YAML".into(),
            stderr: e.to_string(),
        })?;
        if !object.is_null() {
            objects.push(object);
        }
    }
    Ok(objects)
}

/// An object's key: kind, namespace/name.
fn key(object: &Value) -> String {
    let metadata = &object["metadata"];
    format!(
        "{} {}/{}",
        object["kind"].as_str().unwrap_or("?"),
        metadata["namespace"].as_str().unwrap_or(""),
        metadata["name"].as_str().unwrap_or("?")
    )
}

fn by_key(objects: Vec<Value>) -> BTreeMap<String, Value> {
    objects.into_iter().map(|o| (key(&o), o)).collect()
}

/// `kubectl kustomize config/<dir>`.
fn kustomize(dir: &str) -> fixtures::Result<String> {
    let dir = repo_root().join("config").join(dir);
    fixtures::run(
        Command::new(Tools::get()?.kubectl())
            .arg("kustomize")
            .arg(dir),
    )
}

/// `kubectl apply -k` and `kubectl delete -k` take config/default's objects
/// in the order kustomize prints them. The CRDs come before the operator's
/// Namespace, so that a deletion reaches them while the operator's pods still
/// answer the CRD guard (unanswered, it refuses: `failurePolicy: Fail`); the
/// guard's webhook configurations come last, after what they guard.
#[test]
fn config_default_deletes_its_crds_before_the_operators_namespace() -> fixtures::Result<()> {
    let kinds: Vec<String> = objects("config/default", &kustomize("default")?)?
        .iter()
        .map(|object| object["kind"].as_str().unwrap_or("?").to_owned())
        .collect();
    let first = |kind: &str| kinds.iter().position(|k| k == kind);
    let last = |kind: &str| kinds.iter().rposition(|k| k == kind);
    let namespace = first("Namespace").expect("config/default makes the operator's namespace");
    let crds = last("CustomResourceDefinition").expect("config/default holds the CRDs");
    assert!(crds < namespace, "a CRD after the Namespace: {kinds:?}");
    let guards = first("ValidatingWebhookConfiguration").expect("the guards");
    assert!(
        kinds[guards..]
            .iter()
            .all(|k| k == "ValidatingWebhookConfiguration"),
        "the guards are not last: {kinds:?}"
    );
    // Namespaced objects still follow their namespace, and the operator's
    // RBAC comes before its Deployment.
    assert!(namespace < first("ServiceAccount").expect("a ServiceAccount"));
    assert!(
        last("ClusterRoleBinding") < first("Deployment"),
        "{kinds:?}"
    );
    Ok(())
}

/// Removes from `object` the fields [`CHART_ADDS`] allows for its kind,
/// where they hold the allowed value, and a map left empty by that.
fn without_chart_additions(mut object: Value) -> Value {
    for (kind, path, value) in CHART_ADDS {
        if object["kind"] != *kind {
            continue;
        }
        let (field, parents) = path.split_last().expect("a field path");
        let mut parent = &mut object;
        for name in parents {
            parent = &mut parent[*name];
        }
        if let Some(map) = parent.as_object_mut()
            && map.get(*field).and_then(Value::as_str) == Some(*value)
        {
            map.remove(*field);
            if map.is_empty() {
                let (last, grandparents) = parents.split_last().expect("a parent");
                let mut grandparent = &mut object;
                for name in grandparents {
                    grandparent = &mut grandparent[*name];
                }
                if let Some(map) = grandparent.as_object_mut() {
                    map.remove(*last);
                }
            }
        }
    }
    object
}

/// Every difference between `chart` and `config` below `path`, one line
/// each: where, and what each side holds.
fn differences(path: &str, chart: &Value, config: &Value, out: &mut Vec<String>) {
    match (chart, config) {
        (Value::Object(a), Value::Object(b)) => {
            let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for name in names {
                difference_at(&format!("{path}.{name}"), a.get(name), b.get(name), out);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for i in 0..a.len().max(b.len()) {
                difference_at(&format!("{path}[{i}]"), a.get(i), b.get(i), out);
            }
        }
        (a, b) if a != b => out.push(format!("{path}: chart {a}, config/ {b}")),
        _ => {}
    }
}

/// One key or index of an object or array that either side has: compared
/// further where both have it, else named as missing on one side.
fn difference_at(here: &str, chart: Option<&Value>, config: Option<&Value>, out: &mut Vec<String>) {
    match (chart, config) {
        (Some(x), Some(y)) => differences(here, x, y, out),
        (Some(x), None) => out.push(format!("{here}: chart {x}, config/ has none")),
        (None, Some(y)) => out.push(format!("{here}: chart has none, config/ {y}")),
        (None, None) => {}
    }
}

/// The differences between the chart's objects and config/'s, keyed by
/// kind, namespace and name, the allowed additions aside: one line each.
fn drift(chart: Vec<Value>, config: Vec<Value>) -> Vec<String> {
    let mut out = Vec::new();
    // Keyed below, an object rendered twice would count once.
    for (side, objects) in [("the chart", &chart), ("config/", &config)] {
        let mut seen = std::collections::BTreeSet::new();
        for object in objects.iter().map(key) {
            if !seen.insert(object.clone()) {
                out.push(format!("{object}: twice in {side}"));
            }
        }
    }
    let chart = by_key(chart.into_iter().map(without_chart_additions).collect());
    let config = by_key(config);
    for (key, object) in &chart {
        match config.get(key) {
            Some(theirs) => {
                let mut found = Vec::new();
                differences("", object, theirs, &mut found);
                out.extend(found.into_iter().map(|line| format!("{key}: {line}")));
            }
            None => out.push(format!("{key}: only in the chart")),
        }
    }
    for key in config.keys().filter(|key| !chart.contains_key(*key)) {
        out.push(format!("{key}: only in config/"));
    }
    out
}

fn assert_no_drift(what: &str, chart: Vec<Value>, config: Vec<Value>) {
    assert!(!config.is_empty(), "{what}: config/ rendered nothing");
    let found = drift(chart, config);
    assert!(
        found.is_empty(),
        "{what}: the chart and config/ differ (a field the chart adds on purpose goes in \
         CHART_ADDS and its README):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_chart_lints_clean_and_carries_the_workspace_version() -> fixtures::Result<()> {
    let helm = Helm::new()?;
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    for strict in [&[][..], &["--strict"][..]] {
        let out = helm.run(&[&["lint", &chart], strict].concat())?;
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
    let text = std::fs::read_to_string(chart_dir().join("Chart.yaml"))
        .map_err(fixtures::io("reading Chart.yaml"))?;
    let meta: Value = serde_norway::from_str(&text).expect("Chart.yaml is YAML");
    // This crate's version is the workspace's (version.workspace = true).
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(meta["version"], version, "Chart.yaml version");
    assert_eq!(meta["appVersion"], version, "Chart.yaml appVersion");
    // The CRDs are templates, so that `helm upgrade` upgrades them: Helm
    // installs crds/ once and never again.
    assert!(!chart_dir().join("crds").exists(), "a crds/ folder");
    Ok(())
}

#[test]
fn the_chart_renders_exactly_what_config_installs() -> fixtures::Result<()> {
    let helm = Helm::new()?;
    let default = objects("config/default", &kustomize("default")?)?;
    let store = objects("config/petstore", &kustomize("petstore")?)?;
    let everything = [default.clone(), store].concat();
    let rendered = objects("the chart", &helm.template(&[])?)?;
    assert_no_drift("default values", rendered, everything);
    // Without the demo store: config/default alone.
    let operator_only = objects(
        "the chart without the store",
        &helm.template(&["--set", "petstore.enabled=false"])?,
    )?;
    assert_no_drift("petstore.enabled=false", operator_only, default);
    Ok(())
}

#[test]
fn the_drift_check_reports_every_changed_missing_and_added_field() {
    let config = vec![serde_json::json!({
        "kind": "Deployment",
        "metadata": {"name": "petstore-operator", "namespace": "petstore-system"},
        "spec": {"replicas": 2, "ports": [{"port": 8080}, {"port": 443}]},
    })];
    let mut chart = config.clone();
    chart[0]["spec"]["replicas"] = 3.into();
    chart[0]["spec"]["ports"]
        .as_array_mut()
        .expect("ports")
        .pop();
    chart[0]["metadata"]["labels"] = serde_json::json!({"helm.sh/chart": "x"});
    // An allowed field on a kind it is not allowed for is a difference.
    chart[0]["metadata"]["annotations"] = serde_json::json!({"helm.sh/resource-policy": "keep"});
    let mut crd = serde_json::json!({
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "pets.petstore.example.com"},
    });
    let config = [config, vec![crd.clone()]].concat();
    // The allowed field with another value is a difference too.
    crd["metadata"]["annotations"] = serde_json::json!({"helm.sh/resource-policy": "delete"});
    chart.push(crd);
    chart.push(serde_json::json!({"kind": "Secret", "metadata": {"name": "x", "namespace": "y"}}));
    chart.push(chart[chart.len() - 1].clone());
    let found = drift(chart, config);
    assert_eq!(
        found,
        [
            "Secret y/x: twice in the chart",
            "CustomResourceDefinition /pets.petstore.example.com: .metadata.annotations: chart {\"helm.sh/resource-policy\":\"delete\"}, config/ has none",
            "Deployment petstore-system/petstore-operator: .metadata.annotations: chart {\"helm.sh/resource-policy\":\"keep\"}, config/ has none",
            "Deployment petstore-system/petstore-operator: .metadata.labels: chart {\"helm.sh/chart\":\"x\"}, config/ has none",
            "Deployment petstore-system/petstore-operator: .spec.ports[1]: chart has none, config/ {\"port\":443}",
            "Deployment petstore-system/petstore-operator: .spec.replicas: chart 3, config/ 2",
            "Secret y/x: only in the chart",
        ],
        "{found:#?}"
    );
    let allowed = without_chart_additions(serde_json::json!({
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "c", "annotations": {"helm.sh/resource-policy": "keep"}},
    }));
    assert_eq!(
        allowed,
        serde_json::json!({"kind": "CustomResourceDefinition", "metadata": {"name": "c"}})
    );
}

#[test]
fn every_crd_is_a_template_kept_on_uninstall() -> fixtures::Result<()> {
    let rendered = objects("the chart", &Helm::new()?.template(&[])?)?;
    let crds: Vec<&Value> = rendered
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition")
        .collect();
    let names: Vec<&str> = crds
        .iter()
        .filter_map(|crd| crd["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        [
            "clusterpetstores.petstore.example.com",
            "pets.petstore.example.com",
            "petstores.petstore.example.com",
        ]
    );
    for crd in crds {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep",
            "{}",
            key(crd)
        );
    }
    Ok(())
}

#[test]
fn the_namespace_values_reach_every_reference() -> fixtures::Result<()> {
    let rendered =
        Helm::new()?.template(&["--set", "namespaces.operator=ops,namespaces.store=records"])?;
    assert!(!rendered.contains("petstore-system"), "{rendered}");
    let rendered = objects("the chart", &rendered)?;
    let mut namespaces = Vec::new();
    // Every `namespace` field anywhere: metadata, subjects, webhook clients.
    fn walk(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (name, value) in map {
                    match (name.as_str(), value) {
                        ("namespace", Value::String(ns)) => found.push(ns.clone()),
                        _ => walk(value, found),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    for object in &rendered {
        walk(object, &mut namespaces);
    }
    namespaces.sort();
    namespaces.dedup();
    assert_eq!(namespaces, ["ops", "records"]);
    let created: Vec<&str> = rendered
        .iter()
        .filter(|o| o["kind"] == "Namespace")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(created, ["ops", "records"]);
    let operator = rendered
        .iter()
        .find(|o| key(o) == "Deployment ops/petstore-operator")
        .expect("the operator's Deployment");
    let env = &operator["spec"]["template"]["spec"]["containers"][0]["env"];
    let address = env
        .as_array()
        .and_then(|env| env.iter().find(|e| e["name"] == "PETSTORE_ADDR"))
        .expect("PETSTORE_ADDR");
    assert_eq!(
        address["value"],
        "petstore-service.records.svc.cluster.local:6742"
    );
    Ok(())
}

#[test]
fn values_reach_the_objects_they_name() -> fixtures::Result<()> {
    let rendered = Helm::new()?.template(&[
        "--set",
        "image.repository=registry.example.com/petstore-operator,image.tag=0.1.0,image.pullPolicy=Always",
        "--set",
        "replicas=3,installation=blue,logFormat=text,storeAddress=store.example.com:6742",
        "--set",
        "resources.limits.memory=256Mi",
        "--set",
        "petstore.image.repository=registry.example.com/petstore-server,petstore.image.tag=0.1.0",
        "--set",
        "petstore.volumeSize=5Gi,petstore.logFormat=text",
    ])?;
    let rendered = by_key(objects("the chart", &rendered)?);
    let operator = &rendered["Deployment petstore-system/petstore-operator"];
    let pod = &operator["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(operator["spec"]["replicas"], 3);
    assert_eq!(pod["image"], "registry.example.com/petstore-operator:0.1.0");
    assert_eq!(pod["imagePullPolicy"], "Always");
    assert_eq!(pod["resources"]["limits"]["memory"], "256Mi");
    assert_eq!(pod["resources"]["requests"]["cpu"], "50m", "defaults kept");
    let env: BTreeMap<&str, &Value> = pod["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, &e["value"])))
        .collect();
    assert_eq!(env["PETSTORE_INSTALLATION"], "blue");
    assert_eq!(env["LOG_FORMAT"], "text");
    assert_eq!(env["PETSTORE_ADDR"], "store.example.com:6742");
    let store =
        &rendered["Deployment petstore/petstore"]["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(store["image"], "registry.example.com/petstore-server:0.1.0");
    let store_env = store["env"].as_array().expect("env");
    assert!(
        store_env
            .iter()
            .any(|e| e["name"] == "PETSTORE_LOG_FORMAT" && e["value"] == "text"),
        "{store_env:?}"
    );
    let claim = &rendered["PersistentVolumeClaim petstore/petstore-data"];
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "5Gi");
    Ok(())
}

/// A digest pins each image to the bytes `cosign verify` checked, with or
/// without a tag beside it.
#[test]
fn an_image_digest_pins_the_image() -> fixtures::Result<()> {
    let operator_digest = format!("sha256:{}", "a1".repeat(32));
    let store_digest = format!("sha256:{}", "b2".repeat(32));
    let rendered = Helm::new()?.template(&[
        "--set",
        "image.repository=registry.example.com/petstore-operator,image.tag=0.2.0",
        "--set",
        &format!("image.digest={operator_digest}"),
        "--set",
        "petstore.image.repository=registry.example.com/petstore-server",
        "--set",
        &format!("petstore.image.digest={store_digest}"),
    ])?;
    let rendered = by_key(objects("the chart", &rendered)?);
    let image =
        |key: &str| rendered[key]["spec"]["template"]["spec"]["containers"][0]["image"].clone();
    assert_eq!(
        image("Deployment petstore-system/petstore-operator"),
        format!("registry.example.com/petstore-operator:0.2.0@{operator_digest}")
    );
    assert_eq!(
        image("Deployment petstore/petstore"),
        format!("registry.example.com/petstore-server@{store_digest}")
    );
    Ok(())
}

#[test]
fn a_webhook_certificate_secret_is_mounted_and_followed() -> fixtures::Result<()> {
    let helm = Helm::new()?;
    let operator =
        |args: &[&str]| -> fixtures::Result<Value> {
            let rendered = by_key(objects("the chart", &helm.template(args)?)?);
            Ok(rendered["Deployment petstore-system/petstore-operator"]["spec"]["template"]["spec"]
            .clone())
        };
    let cert_dir = |pod: &Value| {
        pod["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "WEBHOOK_CERT_DIR")
            .map(|e| e["value"].clone())
    };
    let by_name = |list: &Value, name: &str| {
        list.as_array()
            .into_iter()
            .flatten()
            .find(|item| item["name"] == name)
            .cloned()
    };
    // By default the operator makes its own, and mounts nothing for it.
    let default = operator(&[])?;
    assert_eq!(cert_dir(&default), None);
    assert_eq!(by_name(&default["volumes"], "webhook-tls"), None);

    for store_certificates in ["true", "false"] {
        let pod = operator(&[
            "--set",
            "webhookCertificateSecret=petstore-webhook-cert",
            "--set",
            &format!("storeCertificates={store_certificates},tenancy={store_certificates}"),
        ])?;
        let dir = cert_dir(&pod).expect("WEBHOOK_CERT_DIR set");
        let volume = by_name(&pod["volumes"], "webhook-tls").expect("a volume");
        assert_eq!(volume["secret"]["secretName"], "petstore-webhook-cert");
        let mount = by_name(&pod["containers"][0]["volumeMounts"], "webhook-tls").expect("mounted");
        assert_eq!(mount["mountPath"], dir, "mounted where the operator reads");
        assert_eq!(mount["readOnly"], true);
        // The store channel's folder is there exactly when it is used.
        assert_eq!(
            by_name(&pod["volumes"], "run").is_some(),
            store_certificates == "true",
            "{pod}"
        );
    }
    Ok(())
}

#[test]
fn the_schema_refuses_bad_values_naming_the_field() -> fixtures::Result<()> {
    let helm = Helm::new()?;
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    // Each bad value, and what helm's message must name.
    for (set, names) in [
        ("replicas=-1", "at '/replicas': minimum: got -1, want 0"),
        ("replicas=two", "at '/replicas': got string, want integer"),
        ("image.tag=3", "at '/image/tag': got number, want string"),
        (
            "unknownKey=1",
            "additional properties 'unknownKey' not allowed",
        ),
        (
            "image.registry=x",
            "additional properties 'registry' not allowed",
        ),
        (
            "petstore.enabled=yes",
            "at '/petstore/enabled': got string, want boolean",
        ),
        (
            "logFormat=xml",
            "at '/logFormat': value must be one of 'json', 'text'",
        ),
        (
            "installation=Blue",
            "at '/installation': 'Blue' does not match pattern",
        ),
        (
            "namespaces.operator=Petstore_System",
            "at '/namespaces/operator'",
        ),
        ("image.pullPolicy=Sometimes", "at '/image/pullPolicy'"),
        (
            "image.digest=sha256:abc",
            "at '/image/digest': 'sha256:abc' does not match pattern",
        ),
        (
            "petstore.image.digest=latest",
            "at '/petstore/image/digest'",
        ),
        ("petstore.volumeSize=lots", "at '/petstore/volumeSize'"),
        ("storeAddress=no-port", "at '/storeAddress'"),
        (
            "webhookCertificateSecret=Not_A_Secret",
            "at '/webhookCertificateSecret'",
        ),
    ] {
        let out = helm.output(&["template", "petstore", &chart, "--set", set])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--set {set} was accepted");
        assert!(
            stderr.contains("values don't meet the specifications of the schema")
                && stderr.contains(names),
            "--set {set}: {stderr}"
        );
    }
    Ok(())
}

/// `helm template ... | kubectl apply --dry-run=server -f -`: the API
/// server accepts every object, with the default namespaces and others.
#[test]
fn the_rendered_chart_passes_a_server_side_dry_run() -> fixtures::Result<()> {
    let cp = ControlPlane::start()?;
    let helm = Helm::new()?;
    // A dry run creates nothing, so namespaced objects need their namespaces.
    fixtures::env::create_config_namespaces(&cp)?;
    for namespace in ["ops", "records"] {
        cp.ensure_namespace(namespace)?;
    }
    for values in [
        &[][..],
        &["--set", "namespaces.operator=ops,namespaces.store=records"][..],
        &["--set", "webhookCertificateSecret=petstore-webhook-cert"][..],
    ] {
        let rendered = helm.template(values)?;
        let expected = objects("the chart", &rendered)?.len();
        // Refused, any object fails the command; accepted, each has a line.
        let out = cp.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered)?;
        let accepted = out
            .lines()
            .filter(|line| line.ends_with("(server dry run)"))
            .count();
        assert_eq!(accepted, expected, "{values:?}:\n{out}");
    }
    Ok(())
}

/// The chart's CRDs with one description changed: an older chart, for the
/// upgrade.
fn older_chart(dir: &Path) -> fixtures::Result<()> {
    let copy = |from: &Path, to: &Path| -> fixtures::Result<()> {
        fixtures::run(Command::new("cp").arg("-r").arg(from).arg(to)).map(drop)
    };
    copy(&chart_dir(), dir)?;
    let crd = dir.join("files/crds/petstore.example.com_pets.yaml");
    let text = std::fs::read_to_string(&crd).map_err(fixtures::io("reading the CRD copy"))?;
    assert!(
        text.contains(NEW_DESCRIPTION),
        "the Pet CRD's column description changed"
    );
    std::fs::write(&crd, text.replace(NEW_DESCRIPTION, OLD_DESCRIPTION))
        .map_err(fixtures::io("writing the CRD copy"))
}

const NEW_DESCRIPTION: &str = "The pet's name in the store";
const OLD_DESCRIPTION: &str = "An older chart's description";

/// The Pet CRD's printer column descriptions, as the API server stores them.
fn pet_crd(cp: &ControlPlane) -> fixtures::Result<String> {
    cp.kubectl(&["get", "crd", "pets.petstore.example.com", "-o", "json"])
}

/// What the chart's README and docs/install.md say of install, upgrade
/// and uninstall: the release lives in an existing namespace and the
/// chart makes its own; `helm upgrade` upgrades the CRDs; `helm uninstall`
/// keeps the CRDs, and the Pets with them, and removes the rest, the demo
/// store's volume included.
#[test]
fn helm_upgrade_upgrades_the_crds_and_uninstall_keeps_them() -> fixtures::Result<()> {
    let cp = ControlPlane::start()?;
    let helm = Helm::with_kubeconfig(&cp.kubeconfig)?;
    let old = tempfile::tempdir().map_err(fixtures::io("making a folder"))?;
    let old_chart = old.path().join("petstore-operator");
    older_chart(&old_chart)?;

    helm.run(&[
        "install",
        "petstore",
        &old_chart.to_string_lossy(),
        "--namespace",
        "default",
    ])?;
    let crd = pet_crd(&cp)?;
    assert!(crd.contains(OLD_DESCRIPTION), "{crd}");
    assert!(
        cp.kubectl(&["get", "namespace", "petstore-system", "petstore"])
            .is_ok(),
        "the chart makes its namespaces"
    );

    helm.run(&[
        "upgrade",
        "petstore",
        &chart_dir().to_string_lossy(),
        "--namespace",
        "default",
    ])?;
    let crd = pet_crd(&cp)?;
    assert!(
        crd.contains(NEW_DESCRIPTION) && !crd.contains(OLD_DESCRIPTION),
        "helm upgrade left the CRD as it was:\n{crd}"
    );

    // A Pet, which must outlive the release with its CRD.
    let sample = repo_root().join("config/samples/pet-sample1.yaml");
    cp.kubectl(&["apply", "-n", "default", "-f", &sample.to_string_lossy()])?;

    let out = helm.run(&["uninstall", "petstore", "--namespace", "default"])?;
    assert!(
        out.contains("These resources were kept due to the resource policy"),
        "{out}"
    );
    for name in [
        "pets.petstore.example.com",
        "petstores.petstore.example.com",
        "clusterpetstores.petstore.example.com",
    ] {
        assert!(out.contains(name), "{name} not among the kept:\n{out}");
        cp.kubectl(&["get", "crd", name])?;
    }
    cp.kubectl(&["get", "pet", "pet-sample1", "-n", "default"])?;
    // The rest went with the release.
    for object in [
        &["clusterrole", "petstore-operator"][..],
        &[
            "validatingwebhookconfiguration",
            "petstore-operator-crd-guard",
        ][..],
        &["validatingadmissionpolicy", "petstore-pet-annotations"][..],
    ] {
        let gone =
            cp.kubectl(&[&["get"], object, &["--ignore-not-found", "-o", "name"]].concat())?;
        assert_eq!(gone.trim(), "", "{object:?} outlived the release");
    }
    // The demo store's volume, and every record in it, too (its
    // pvc-protection finalizer waits for a controller this API server
    // does not run, so it may still be there, being deleted).
    let volume = cp.kubectl(&[
        "get",
        "pvc",
        "petstore-data",
        "-n",
        "petstore",
        "--ignore-not-found",
        "-o",
        "go-template={{if .metadata.deletionTimestamp}}deleting{{else}}kept{{end}}",
    ])?;
    assert!(
        matches!(volume.trim(), "" | "deleting"),
        "the store's volume: {volume}"
    );
    Ok(())
}

/// The chart makes its namespaces, so a release in one of them made
/// beforehand by `--create-namespace` fails, naming it (the chart's README
/// says to use an existing namespace instead).
#[test]
fn a_release_into_a_namespace_the_chart_makes_fails() -> fixtures::Result<()> {
    let cp = ControlPlane::start()?;
    let helm = Helm::with_kubeconfig(&cp.kubeconfig)?;
    let chart = chart_dir();
    let out = helm.output(&[
        "install",
        "petstore",
        &chart.to_string_lossy(),
        "--namespace",
        "petstore-system",
        "--create-namespace",
    ])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "installed: {stderr}");
    assert!(
        stderr.contains("namespaces \"petstore-system\" already exists"),
        "{stderr}"
    );
    Ok(())
}

/// CHANGELOG.md's newest section is this version, and its oldest the
/// previous release the upgrade test starts from, by its commit.
#[test]
fn the_changelog_starts_at_the_workspace_version_and_ends_at_the_previous_release() {
    let text = std::fs::read_to_string(fixtures::repo_root().join("CHANGELOG.md"))
        .expect("CHANGELOG.md at the root");
    let versions: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("## ["))
        .filter_map(|rest| rest.split_once(']').map(|(version, _)| version))
        .collect();
    assert_eq!(
        versions.first().copied(),
        Some(env!("CARGO_PKG_VERSION")),
        "the newest section is the workspace version: {versions:?}"
    );
    let previous = fixtures::previous_release::commit();
    let oldest = text
        .rsplit_once("\n## [")
        .map(|(_, section)| section)
        .unwrap_or_default();
    assert!(
        oldest.contains(&format!("`{}`", &previous[..7])),
        "the oldest section names the previous release's commit {previous}:\n{oldest}"
    );
    for version in &versions {
        assert!(
            text.contains(&format!("\n[{version}]: ")),
            "a link for [{version}]"
        );
    }
}
