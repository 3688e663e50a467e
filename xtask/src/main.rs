//! Developer commands, run as `cargo xtask <command>` (an alias in
//! .cargo/config.toml), after rust-analyzer's xtask: plain Rust, so they need
//! no tool beyond cargo and work the same on every machine. `krew`'s code is
//! in the library (src/lib.rs), which the end-to-end tests reuse.

mod crdgen;
mod dev;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "Developer commands for petstore-operator"
)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Run the project without Docker: a local control plane, the durable
    /// pet store and the operator, with the samples applied. Ctrl-C stops
    /// and removes everything.
    Dev,
    /// Bring up the one-node cluster (node, registry on localhost:5005,
    /// context kind-petstore) that `tilt up` can use instead of kind.
    /// Needs root. Ctrl-C stops and removes everything.
    Cluster,
    /// Regenerate the CRDs (Pet, PetStore, ClusterPetStore) from the
    /// operator's Rust types, into config/crd and the Helm chart.
    Crdgen {
        /// The folder to write them into instead (`-` for stdout).
        path: Option<PathBuf>,
    },
    /// Pack each built kubectl-petstore (and LICENSE, if the repository has
    /// one) into a .tar.gz for its platform, and write the krew manifest
    /// petstore.yaml with each archive's platform, URI and sha256 beside it.
    Krew {
        /// The folder the archive and the manifest are written to.
        #[arg(long)]
        out: PathBuf,
        /// A built plugin binary, once for each platform (its platform is
        /// read from its header): this machine's, and any cross-built
        /// (target/<triple>/release/kubectl-petstore).
        #[arg(long = "binary", default_value = "target/release/kubectl-petstore")]
        binaries: Vec<PathBuf>,
        /// Where the archives will be served from: each archive's URI in
        /// the manifest is this, a slash and the archive's file name.
        #[arg(long)]
        uri_base: String,
    },
    /// Compare the operator's RBAC in config/ with what its
    /// ServiceAccount asked of the API servers whose requests are kept in
    /// DIR (the test command's audit): fails on a verb granted and never
    /// used, and on a request refused or allowed by no rule.
    RbacAudit {
        /// The requests, as the fixtures keep them (PETSTORE_AUDIT_DIR).
        dir: PathBuf,
    },
    /// Write a CycloneDX 1.5 JSON SBOM of one released artifact: every
    /// package its binaries are built from, with its locked version and
    /// purl, from `cargo metadata`.
    Sbom {
        /// The artifact: chart (both binaries), operator-image, store-image
        /// or plugin (kubectl-petstore).
        #[arg(long = "for", default_value = "chart", value_parser = artifact)]
        artifact: xtask::sbom::Artifact,
        /// The file to write (stdout without it).
        #[arg(long)]
        out: Option<PathBuf>,
        /// The target triple the binaries are built for (the host's without
        /// it): it decides which platform-specific dependencies count.
        #[arg(long)]
        target: Option<String>,
    },
}

/// `cargo xtask rbac-audit`.
fn rbac_audit(dir: &Path) -> anyhow::Result<bool> {
    use xtask::rbac_audit;
    let root = fixtures::repo_root();
    let rules = rbac_audit::read_rules(&root, &rbac_audit::RBAC_FILES)?;
    let sources = rbac_audit::read_requests(dir)?;
    let requests = sources.keys().cloned().collect();
    let findings = rbac_audit::compare(&rules, &requests);
    println!(
        "rbac-audit: {} rules in {} files against {} distinct requests of the operator",
        rules.len(),
        rbac_audit::RBAC_FILES.len(),
        requests.len()
    );
    for unused in &findings.unused {
        println!("  unused:  {unused}");
    }
    for missing in &findings.missing {
        // Which stories asked it, to find why.
        let seen: std::collections::BTreeSet<&String> = sources
            .iter()
            .filter(|(request, _)| request.to_string() == *missing)
            .flat_map(|(_, files)| files)
            .collect();
        println!("  missing: {missing}, asked in {seen:?}");
    }
    let equal = findings.unused.is_empty() && findings.missing.is_empty();
    println!(
        "rbac-audit: {} unused, {} missing{}",
        findings.unused.len(),
        findings.missing.len(),
        if equal { ": RBAC equal to use" } else { "" }
    );
    Ok(equal)
}

/// An artifact named as `cargo xtask sbom --for` takes it.
fn artifact(name: &str) -> Result<xtask::sbom::Artifact, String> {
    let known = xtask::sbom::ARTIFACTS;
    known
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, artifact)| *artifact)
        .ok_or_else(|| {
            let names: Vec<&str> = known.iter().map(|(name, _)| *name).collect();
            format!("one of {}", names.join(", "))
        })
}

/// `cargo xtask sbom`.
fn sbom(
    artifact: xtask::sbom::Artifact,
    out: Option<&Path>,
    target: Option<&str>,
) -> anyhow::Result<()> {
    let root = fixtures::repo_root();
    let bom = xtask::sbom::generate(&root, artifact, target).context("making the SBOM")?;
    let text = serde_json::to_string_pretty(&bom)? + "\n";
    match out {
        None => print!("{text}"),
        Some(out) => {
            let out = root.join(out);
            std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
            let count = bom["components"].as_array().map_or(0, Vec::len);
            eprintln!("{}: {count} components", out.display());
        }
    }
    Ok(())
}

/// `cargo xtask krew`; relative paths are the repository's, wherever cargo
/// was run.
fn krew(out: &Path, binaries: &[PathBuf], uri_base: &str) -> anyhow::Result<()> {
    let root = fixtures::repo_root();
    let out = root.join(out);
    let binaries: Vec<PathBuf> = binaries.iter().map(|binary| root.join(binary)).collect();
    let binaries: Vec<&Path> = binaries.iter().map(PathBuf::as_path).collect();
    let released = xtask::krew::release_from_repo(&root, &binaries, uri_base, &out)
        .context("packing the plugin for krew")?;
    for archive in &released.archives {
        println!(
            "{}  {} ({}/{})",
            archive.sha256,
            archive.path.display(),
            archive.platform.os,
            archive.platform.arch
        );
    }
    println!("{}", released.manifest.display());
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Task::Crdgen { path } => {
            // Relative paths are the repository's, wherever cargo was run.
            let root = fixtures::repo_root();
            let paths = match path {
                Some(path) if path == std::path::Path::new("-") || path.is_absolute() => vec![path],
                Some(path) => vec![root.join(path)],
                None => vec![root.join(crdgen::CRD_DIR), root.join(crdgen::CHART_CRD_DIR)],
            };
            let paths: Vec<&std::path::Path> = paths.iter().map(PathBuf::as_path).collect();
            crdgen::run(&paths)
        }
        Task::Krew {
            out,
            binaries,
            uri_base,
        } => krew(&out, &binaries, &uri_base),
        Task::Sbom {
            artifact,
            out,
            target,
        } => sbom(artifact, out.as_deref(), target.as_deref()),
        Task::RbacAudit { dir } => match rbac_audit(&dir) {
            Ok(true) => Ok(()),
            Ok(false) => Err(anyhow::anyhow!(
                "the operator's RBAC is not equal to its use"
            )),
            Err(err) => Err(err),
        },
        Task::Dev => petstore_process::stop_flag()
            .map_err(anyhow::Error::from)
            .and_then(|stop| dev::dev(&stop).map_err(anyhow::Error::from)),
        Task::Cluster => petstore_process::stop_flag()
            .map_err(anyhow::Error::from)
            .and_then(|stop| dev::cluster(&stop).map_err(anyhow::Error::from)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn krew_takes_out_uri_base_and_binaries_defaulting_to_the_release_build() {
        let cli =
            Cli::try_parse_from(["xtask", "krew", "--out", "dist", "--uri-base", "https://x"])
                .unwrap();
        let Task::Krew {
            out,
            binaries,
            uri_base,
        } = cli.command
        else {
            panic!("not the krew command");
        };
        assert_eq!(out, PathBuf::from("dist"));
        assert_eq!(binaries, [PathBuf::from("target/release/kubectl-petstore")]);
        assert_eq!(uri_base, "https://x");
        // One --binary a platform, in the order given, and then no default.
        let cli = Cli::try_parse_from([
            "xtask",
            "krew",
            "--out",
            "dist",
            "--uri-base",
            "https://x",
            "--binary",
            "a",
            "--binary",
            "b",
        ])
        .unwrap();
        let Task::Krew { binaries, .. } = cli.command else {
            panic!("not the krew command");
        };
        assert_eq!(binaries, [PathBuf::from("a"), PathBuf::from("b")]);
        // Both are required: an archive needs somewhere to go and a URI.
        assert!(Cli::try_parse_from(["xtask", "krew", "--out", "dist"]).is_err());
        assert!(Cli::try_parse_from(["xtask", "krew", "--uri-base", "https://x"]).is_err());
    }
}
