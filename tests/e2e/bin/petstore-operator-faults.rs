//! The operator with crash-test faults, for the end-to-end tests only: the
//! release binary's flags plus `--fault`. See `petstore_operator::Fault`.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use petstore_operator::{Fault, app, cli};

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    operator: cli::Args,

    /// The fault to inject.
    #[arg(long, env = "PETSTORE_OPERATOR_FAULT", value_enum)]
    fault: Option<FaultArg>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum FaultArg {
    HangAfterCreate,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    cli::init_tracing(args.operator.log_format);
    let fault = args
        .fault
        .map(|FaultArg::HangAfterCreate| Fault::HangAfterCreate);
    match app::run(args.operator, fault).await {
        Ok(code) => code,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}
