//! The chaos soak, small and with a fixed seed so the test command stays
//! quick and reproducible. A longer run:
//!
//!     CHAOS_SEED=7 CHAOS_OPS=1000 CHAOS_PETS=200 CHAOS_NAMESPACES=5 CHAOS_FAULTS=25 \
//!       cargo test -p testenv --test chaos -- --nocapture

use std::time::Duration;

use testenv::chaos::{SoakConfig, run_soak};

#[test]
fn chaos_soak_converges_with_nothing_lost_or_leaked() -> testenv::Result<()> {
    let config = SoakConfig::from_env(SoakConfig {
        seed: 42,
        operations: 100,
        initial_pets: 40,
        namespaces: 4,
        faults: 6,
        converge_timeout: Duration::from_secs(180),
    });
    eprintln!("chaos soak: {config:?}");
    let report = run_soak(config.clone())?;
    eprintln!("{report}");
    let operations: usize = report.operations.values().sum();
    let faults: usize = report.faults.values().sum();
    assert!(operations >= config.operations, "{report}");
    assert_eq!(faults, config.faults, "{report}");
    assert!(report.live_pets > 0, "{report}");
    Ok(())
}
