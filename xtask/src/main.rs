//! Developer commands, run as `cargo xtask <command>` (an alias in
//! .cargo/config.toml), after rust-analyzer's xtask: plain Rust, so they need
//! no tool beyond cargo and work the same on every machine.

mod crdgen;
mod dev;

use std::path::PathBuf;
use std::process::ExitCode;

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
