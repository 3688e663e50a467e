//! The operator with crash-test faults, for the end-to-end tests only: the
//! release binary's flags plus `--fault`. See `petstore_operator::Fault`.

use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use petstore_operator::{Fault, app, cli};

/// Named apart from `cli::Args`: clap names each struct's argument group
/// after it, and two groups called `Args` make the command invalid.
#[derive(Parser)]
#[command(name = "petstore-operator-faults")]
struct FaultArgs {
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
    let args = FaultArgs::parse();
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_valid() {
        super::FaultArgs::command().debug_assert();
    }
}
