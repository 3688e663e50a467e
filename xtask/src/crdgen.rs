//! `cargo xtask crdgen`: writes the CRDs generated from the operator's Rust
//! types (Pet, PetStore, ClusterPetStore) to config/crd/, where kustomize
//! and the tests read them. A test in the operator fails while a committed
//! file is stale.

use std::path::Path;

use anyhow::Context as _;

/// Where the CRDs are committed, relative to the repository root.
pub const CRD_DIR: &str = "config/crd";

/// Writes every CRD into the folder `path`, or all of them to stdout, as
/// one YAML stream, for `-`.
pub fn run(path: &Path) -> anyhow::Result<()> {
    let files = petstore_operator::crd::crd_files().context("serialising the CRDs")?;
    if path == Path::new("-") {
        let stream: Vec<String> = files.into_iter().map(|(_, yaml)| yaml).collect();
        print!("{}", stream.join("---\n"));
        return Ok(());
    }
    for (name, yaml) in files {
        let file = path.join(name);
        std::fs::write(&file, yaml).with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(())
}
