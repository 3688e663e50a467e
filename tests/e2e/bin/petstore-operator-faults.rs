//! The operator with crash-test faults, for the end-to-end tests only: the
//! release binary's flags plus `--fault`. See `petstore_operator::Fault`.

use std::process::ExitCode;

use clap::Parser;
use petstore_operator::{Fault, app, cli};

/// Named apart from `cli::Args`: clap names each struct's argument group
/// after it, and two groups called `Args` make the command invalid.
#[derive(Parser)]
#[command(name = "petstore-operator-faults")]
struct FaultArgs {
    #[command(flatten)]
    operator: cli::Args,

    /// The fault to inject: hang-after-create, hang-after-release,
    /// hang-before-claim, or hang-after-claims=<N>.
    #[arg(long, env = "PETSTORE_OPERATOR_FAULT", value_parser = parse_fault)]
    fault: Option<Fault>,
}

fn parse_fault(text: &str) -> Result<Fault, String> {
    match text.split_once('=') {
        None => match text {
            "hang-after-create" => Ok(Fault::HangAfterCreate),
            "hang-after-release" => Ok(Fault::HangAfterRelease),
            "hang-before-claim" => Ok(Fault::HangBeforeClaim),
            _ => Err(format!("unknown fault {text:?}")),
        },
        Some(("hang-after-claims", count)) => count
            .parse()
            .map(Fault::HangAfterClaims)
            .map_err(|e| format!("hang-after-claims={count}: {e}")),
        Some(_) => Err(format!("unknown fault {text:?}")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = FaultArgs::parse();
    cli::init_tracing(args.operator.log_format);
    match app::run(args.operator, args.fault).await {
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

    use clap::Parser;
    use petstore_operator::Fault;

    #[test]
    fn the_command_line_is_valid() {
        super::FaultArgs::command().debug_assert();
    }

    #[test]
    fn every_fault_parses_by_name() {
        let fault = |text: &str| {
            super::FaultArgs::try_parse_from(["petstore-operator-faults", "--fault", text])
                .map(|args| args.fault)
                .map_err(|e| e.to_string())
        };
        assert_eq!(fault("hang-after-create"), Ok(Some(Fault::HangAfterCreate)));
        assert_eq!(
            fault("hang-after-release"),
            Ok(Some(Fault::HangAfterRelease))
        );
        assert_eq!(fault("hang-before-claim"), Ok(Some(Fault::HangBeforeClaim)));
        assert_eq!(
            fault("hang-after-claims=4"),
            Ok(Some(Fault::HangAfterClaims(4)))
        );
        for wrong in [
            "hang-after-claims",
            "hang-after-claims=x",
            "hang-forever",
            "a=1",
        ] {
            assert!(fault(wrong).is_err(), "{wrong}");
        }
    }
}
