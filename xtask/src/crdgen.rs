//! `cargo xtask crdgen`: writes the CRDs generated from the operator's Rust
//! types (Pet, PetStore, ClusterPetStore) to config/crd/, where kustomize
//! and the tests read them, and to the Helm chart's files/crds/, which its
//! CRD template reads (a chart cannot read files outside its folder). Tests
//! in the operator fail while a committed copy is stale.

use std::path::Path;

use anyhow::Context as _;

/// Where the CRDs are committed, relative to the repository root.
pub const CRD_DIR: &str = "config/crd";
/// The chart's copy, relative to the repository root.
pub const CHART_CRD_DIR: &str = "charts/petstore-operator/files/crds";

/// Writes every CRD into each of the folders `paths`, or all of them to
/// stdout, as one YAML stream, for `-`.
pub fn run(paths: &[&Path]) -> anyhow::Result<()> {
    let files = petstore_operator::crd::crd_files().context("serialising the CRDs")?;
    if paths == [Path::new("-")] {
        let stream: Vec<String> = files.into_iter().map(|(_, yaml)| yaml).collect();
        print!("{}", stream.join("---\n"));
        return Ok(());
    }
    for path in paths {
        for (name, yaml) in &files {
            let file = path.join(name);
            std::fs::write(&file, yaml).with_context(|| format!("writing {}", file.display()))?;
        }
    }
    Ok(())
}
