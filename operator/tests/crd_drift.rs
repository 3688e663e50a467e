//! Fails when config/crd/, or the Helm chart's copy in
//! charts/petstore-operator/files/crds/, no longer matches the Rust types.
//! Regenerate both with `cargo xtask crdgen`.

use petstore_operator::crd::{self, CLUSTERPETSTORES_CRD_FILE, PETS_CRD_FILE, PETSTORES_CRD_FILE};

/// The folders that hold a committed copy of every CRD.
const CRD_DIRS: [&str; 2] = ["config/crd", "charts/petstore-operator/files/crds"];

/// The committed file `name` in each of [`CRD_DIRS`] is what the types
/// generate.
fn assert_committed(name: &str) {
    let generated = crd::crd_files()
        .expect("generate the CRDs")
        .into_iter()
        .find_map(|(file, yaml)| (file == name).then_some(yaml))
        .expect("a generated CRD of that name");
    for dir in CRD_DIRS {
        let path = format!("{}/../{dir}/{name}", env!("CARGO_MANIFEST_DIR"));
        let committed = std::fs::read_to_string(&path).expect("read the committed CRD");
        assert!(
            committed == generated,
            "{dir}/{name} is out of date; run: cargo xtask crdgen"
        );
    }
}

/// The chart's copy holds the CRDs and nothing else: its template renders
/// every file there.
#[test]
fn the_chart_holds_exactly_the_generated_crds() {
    let dir = format!("{}/../{}", env!("CARGO_MANIFEST_DIR"), CRD_DIRS[1]);
    let mut held: Vec<String> = std::fs::read_dir(&dir)
        .expect("read the chart's CRD folder")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    held.sort();
    let mut generated: Vec<String> = crd::crd_files()
        .expect("CRDs")
        .into_iter()
        .map(|(file, _)| file.to_owned())
        .collect();
    generated.sort();
    assert_eq!(held, generated, "{dir}; run: cargo xtask crdgen");
}

#[test]
fn committed_crd_matches_the_rust_types() {
    assert_committed(PETS_CRD_FILE);
}

#[test]
fn committed_petstore_crd_matches_the_rust_types() {
    assert_committed(PETSTORES_CRD_FILE);
}

#[test]
fn committed_clusterpetstore_crd_matches_the_rust_types() {
    assert_committed(CLUSTERPETSTORES_CRD_FILE);
}

#[test]
fn kustomize_installs_every_crd() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/crd/kustomization.yaml"
    );
    let kustomization = std::fs::read_to_string(path).expect("read config/crd/kustomization.yaml");
    for (file, _) in crd::crd_files().expect("CRDs") {
        assert!(kustomization.contains(file), "{file} not in {path}");
    }
}

/// A CRD's only version, as JSON.
fn store_crd(name: &str) -> (serde_json::Value, serde_json::Value) {
    let yaml = crd::crd_files()
        .expect("CRDs")
        .into_iter()
        .find_map(|(file, yaml)| (file == name).then_some(yaml))
        .expect("the CRD");
    let crd: serde_json::Value = serde_norway::from_str(&yaml).expect("yaml");
    let version = crd["spec"]["versions"][0].clone();
    (crd, version)
}

/// The names of a CRD version's printer columns, in order.
fn column_names(version: &serde_json::Value) -> Vec<String> {
    version["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A CRD version's printer column `name`.
fn column<'a>(version: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    version["additionalPrinterColumns"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("a {name} column"))
}

#[test]
fn store_crds_have_the_promised_shape() {
    for (file, kind, scope) in [
        (PETSTORES_CRD_FILE, "PetStore", "Namespaced"),
        (CLUSTERPETSTORES_CRD_FILE, "ClusterPetStore", "Cluster"),
    ] {
        let (crd, version) = store_crd(file);
        assert_eq!(crd["spec"]["group"], "petstore.example.com", "{kind}");
        assert_eq!(crd["spec"]["names"]["kind"], kind);
        assert_eq!(crd["spec"]["scope"], scope, "{kind}");
        assert_eq!(version["name"], "v1");
        assert!(version["subresources"]["status"].is_object(), "{kind}");
        let columns = column_names(&version);
        assert_eq!(columns, ["Address", "Ready", "Pets", "Age"], "{kind}");
        let schema = &version["schema"]["openAPIV3Schema"];
        let spec = &schema["properties"]["spec"]["properties"];
        assert_eq!(spec["audience"]["default"], "petstore", "{kind}");
        assert!(
            spec["address"]["x-kubernetes-validations"].is_array(),
            "{kind}: the address is checked"
        );
        let ca = &spec["tls"]["properties"]["ca"];
        assert!(
            ca["x-kubernetes-validations"].is_array(),
            "{kind}: one CA source"
        );
        let secret_ref_required = &ca["properties"]["secretKeyRef"]["required"];
        let namespaced = secret_ref_required
            .as_array()
            .expect("required")
            .contains(&"namespace".into());
        assert_eq!(
            namespaced,
            kind == "ClusterPetStore",
            "{kind}: {secret_ref_required}"
        );
        let conditions = &schema["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map", "{kind}");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
    }
    let (_, version) = store_crd(CLUSTERPETSTORES_CRD_FILE);
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    assert!(spec["properties"]["allowedNamespaces"].is_object());
}

#[test]
fn crd_has_the_promised_shape() {
    let crd: serde_json::Value =
        serde_norway::from_str(&petstore_operator::crd::crd_yaml().expect("CRD")).expect("yaml");
    let versions = crd["spec"]["versions"].as_array().expect("versions");
    let named = |name: &str| {
        versions
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("version {name}"))
    };
    assert_eq!(versions.len(), 2);
    let (alpha, version) = (named("v1alpha1"), named("v1"));
    assert_eq!(crd["spec"]["group"], "petstore.example.com");
    assert_eq!(version["storage"], true);
    assert_eq!(alpha["storage"], false);
    assert_eq!(alpha["served"], true);
    assert_eq!(alpha["deprecated"], true);
    assert_eq!(
        alpha["deprecationWarning"],
        "petstore.example.com/v1alpha1 Pet is deprecated; use petstore.example.com/v1"
    );
    assert_eq!(
        alpha["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["birthday"]["format"],
        "date-time",
        "v1alpha1 keeps its timestamp"
    );
    let conversion = &crd["spec"]["conversion"];
    assert_eq!(conversion["strategy"], "Webhook");
    assert_eq!(
        conversion["webhook"]["conversionReviewVersions"],
        serde_json::json!(["v1"])
    );
    assert_eq!(
        conversion["webhook"]["clientConfig"]["service"],
        serde_json::json!({
            "name": "petstore-operator-metrics",
            "namespace": "petstore-system",
            "path": "/convert",
            "port": 443,
        })
    );
    assert_eq!(crd["spec"]["scope"], "Namespaced");
    assert!(version["subresources"]["status"].is_object());
    let spec = &version["schema"]["openAPIV3Schema"]["properties"]["spec"];
    for field in ["name", "type", "birthday"] {
        assert!(
            spec["properties"][field]["description"].is_string(),
            "{field} has a description"
        );
        assert!(
            spec["required"]
                .as_array()
                .expect("required")
                .contains(&field.into()),
            "{field} is required"
        );
    }
    assert_eq!(spec["properties"]["birthday"]["format"], "date");
    assert_eq!(spec["properties"]["name"]["maxLength"], 128);
    let columns = column_names(version);
    for name in [
        "Pet Name", "Type", "Birthday", "Store ID", "Plan", "Ready", "Age",
    ] {
        assert!(columns.contains(&name.to_owned()), "{name} in {columns:?}");
    }
    // The Plan column prints `none` when nothing waits, Pets written before
    // the field existed included: the API server fills the default on read.
    for v in [alpha, version] {
        // spec.storeRef is fixed once the Pet has a record, in both versions.
        let rules = &v["schema"]["openAPIV3Schema"]["x-kubernetes-validations"];
        assert_eq!(rules[0]["fieldPath"], ".spec.storeRef", "{rules}");
        assert_eq!(rules[0]["message"], crd::STORE_REF_IMMUTABLE_MESSAGE);
        let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
        assert!(spec["properties"]["storeRef"].is_object());
        // The Store column is wide only: the default table is the README's.
        let store_column = column(v, "Store");
        assert_eq!(store_column["priority"], 1);
        let plan = column(v, "Plan");
        assert_eq!(plan["jsonPath"], ".status.pendingPlan");
        let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"];
        assert_eq!(status["properties"]["pendingPlan"]["default"], "none");
        assert_eq!(status["properties"]["pendingPlan"]["type"], "string");
    }
}
