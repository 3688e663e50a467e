//! Fails when config/crd/ no longer matches the Rust types. Regenerate with
//! `cargo xtask crdgen`.

#[test]
fn committed_crd_matches_the_rust_types() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/crd/petstore.example.com_pets.yaml"
    );
    let committed = std::fs::read_to_string(path).expect("read the committed CRD");
    let generated = petstore_operator::crd::crd_yaml().expect("generate the CRD");
    assert!(
        committed == generated,
        "config/crd is out of date; run: cargo xtask crdgen"
    );
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
    let columns: Vec<_> = version["additionalPrinterColumns"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    for column in [
        "Pet Name", "Type", "Birthday", "Store ID", "Plan", "Ready", "Age",
    ] {
        assert!(
            columns.contains(&column.to_owned()),
            "{column} in {columns:?}"
        );
    }
    // The Plan column prints `none` when nothing waits, Pets written before
    // the field existed included: the API server fills the default on read.
    for v in [alpha, version] {
        let plan = v["additionalPrinterColumns"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "Plan"))
            .expect("a Plan column");
        assert_eq!(plan["jsonPath"], ".status.pendingPlan");
        let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"];
        assert_eq!(status["properties"]["pendingPlan"]["default"], "none");
        assert_eq!(status["properties"]["pendingPlan"]["type"], "string");
    }
}
