//! Writes the Pet CRD to stdout, or to the path given as the only argument.
//! `cargo run -p petstore-operator --bin crdgen -- config/crd/pets.yaml`

use std::process::ExitCode;

fn main() -> ExitCode {
    let yaml = match petstore_operator::crd::crd_yaml() {
        Ok(yaml) => yaml,
        Err(err) => {
            eprintln!("crdgen: cannot serialise the CRD: {err}");
            return ExitCode::FAILURE;
        }
    };
    match std::env::args_os().nth(1) {
        None => print!("{yaml}"),
        Some(path) => {
            if let Err(err) = std::fs::write(&path, yaml) {
                eprintln!("crdgen: cannot write {}: {err}", path.to_string_lossy());
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
