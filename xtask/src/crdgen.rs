//! `cargo xtask crdgen`: writes the Pet CRD generated from the operator's
//! Rust types to config/crd/, where kustomize and the tests read it. A test
//! in the operator fails while the committed file is stale.

use std::path::Path;

use anyhow::Context as _;

/// The committed CRD, relative to the repository root.
pub const CRD_PATH: &str = "config/crd/petstore.example.com_pets.yaml";

/// Writes the CRD to `path`, or to stdout for `-`.
pub fn run(path: &Path) -> anyhow::Result<()> {
    let yaml = petstore_operator::crd::crd_yaml().context("serialising the CRD")?;
    if path == Path::new("-") {
        print!("{yaml}");
        return Ok(());
    }
    std::fs::write(path, yaml).with_context(|| format!("writing {}", path.display()))
}
