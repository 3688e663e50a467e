use std::process::ExitCode;

use clap::Parser;
use petstore_operator::{app, cli};

// One thread: the operator waits on I/O almost all the time, and a single
// scheduler avoids cross-thread wake-ups that cost more CPU than they save
// (measured in BENCHMARKS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = cli::Args::parse();
    cli::init_tracing(args.log_format);
    match app::run(args, None).await {
        Ok(code) => code,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}
