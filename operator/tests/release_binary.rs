//! The binary a user runs, as cargo built it for this package: its command
//! line must offer no fault injection, however the workspace was built.

use std::process::Command;

#[test]
fn the_release_binary_has_no_fault_flag() {
    let binary = env!("CARGO_BIN_EXE_petstore-operator");
    let help = Command::new(binary)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(help.status.success(), "{help:?}");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("--petstore-addr"), "{text}");
    assert!(
        !text.contains("--fault") && !text.contains("FAULT"),
        "{text}"
    );

    let refused = Command::new(binary)
        .args(["--fault", "hang-after-create"])
        .output()
        .expect("run with --fault");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("unexpected argument '--fault'"), "{stderr}");
}
