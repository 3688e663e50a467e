//! Sends real signals to this test process: one test function, so no other
//! test's listener shares them.

use std::sync::atomic::Ordering;
use std::time::Duration;

use petstore_process::{ShutdownSignals, stop_flag};

fn send(signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}

#[test]
fn sigterm_and_sigint_each_request_a_stop_and_nothing_else_does() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        for signal in ["-TERM", "-INT"] {
            let signals = ShutdownSignals::listen().expect("listen");
            let mut waiting = Box::pin(signals.recv());
            assert!(
                tokio::time::timeout(Duration::from_millis(200), &mut waiting)
                    .await
                    .is_err(),
                "resolved before {signal}"
            );
            send(signal);
            tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .unwrap_or_else(|_| panic!("no stop after {signal}"));
        }
    });

    let stop = stop_flag().expect("stop flag");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!stop.load(Ordering::SeqCst), "set before any signal");
    send("-TERM");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !stop.load(Ordering::SeqCst) {
        assert!(std::time::Instant::now() < deadline, "not set by SIGTERM");
        std::thread::sleep(Duration::from_millis(10));
    }
}
