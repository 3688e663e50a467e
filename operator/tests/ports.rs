//! The operator binds its ports before anything else: a taken one stops it
//! at once with the port named, rather than leave it running unobserved
//! (without its metrics port the probes fail and nothing sees it).

use std::net::TcpListener;
use std::process::{Command, Output};

/// The operator with a kubeconfig that does not exist: it gets as far as
/// its ports and the Kubernetes client, and no further.
fn run(metrics: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_petstore-operator"))
        .args(["--metrics-addr", metrics, "--webhook-listen", "127.0.0.1:0"])
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env("RUST_LOG", "info")
        .output()
        .expect("run the operator")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_taken_metrics_port_stops_the_operator_naming_it() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let output = run(&addr);
    let log = text(&output);
    assert!(!output.status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "cannot listen for metrics and health probes on {addr} (--metrics-addr)"
        )),
        "{log}"
    );
    assert!(!log.contains("listening"), "{log}");
}

#[test]
fn the_ports_bound_are_logged_then_the_kubernetes_client_is_built() {
    let output = run("127.0.0.1:0");
    let log = text(&output);
    assert!(!output.status.success(), "no kubeconfig: {log}");
    let listening = log
        .lines()
        .find(|line| line.contains(" listening "))
        .unwrap_or_else(|| panic!("no listening line: {log}"));
    // The ports the kernel picked, not the :0 asked for.
    for field in ["webhook=127.0.0.1:", "metrics=127.0.0.1:"] {
        let port = listening
            .split(field)
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no {field} in {listening}"));
        assert_ne!(port, "0", "{listening}");
    }
    assert!(log.contains("cannot build a Kubernetes client"), "{log}");
}
