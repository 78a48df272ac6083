//! The binary starts and names its two commands. Also what makes a plain `cargo test` at the
//! workspace root build `x402-test-upstream`, which the router's tests spawn.

use std::process::Command;

#[test]
fn help_names_deploy_and_serve() {
    let out = Command::new(env!("CARGO_BIN_EXE_x402-test-upstream")).arg("--help").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("deploy") && help.contains("serve"), "{help}");
}
