use std::process::ExitCode;

use clap::Parser;
use petstore_operator::{app, cli};

// One thread: the operator waits on I/O almost all the time, and a single
// scheduler avoids cross-thread wake-ups that cost more CPU than they save
// (measured in BENCHMARKS.md).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = cli::Args::parse();
    // Inside the runtime: the span exporter's gRPC channel lives on it.
    let Some(telemetry) =
        petstore_telemetry::init_for_main("petstore-operator", args.log_format, None)
    else {
        return ExitCode::FAILURE;
    };
    tracing::info!(
        exporting_spans = telemetry.is_exporting(),
        "telemetry ready"
    );
    let code = match app::run(args, None).await {
        Ok(code) => code,
        Err(error) => {
            tracing::error!("{error}");
            ExitCode::FAILURE
        }
    };
    // Sends the last spans.
    telemetry.shutdown_async().await;
    code
}
