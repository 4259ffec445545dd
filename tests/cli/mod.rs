//! The command line end to end, by feature: JSON output fields and every error path
//! (non-zero exit, a message naming the problem, no panic). Shared helpers here.

use std::process::Command;

pub fn vramlab(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(args)
        .output()
        .expect("run vramlab");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn fails_with(args: &[&str], needle: &str) {
    let (ok, _out, err) = vramlab(args);
    assert!(!ok, "{args:?} should fail");
    assert!(
        err.contains(needle),
        "{args:?}: stderr {err:?} lacks {needle:?}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

/// Runs vramlab and returns the exit code with stdout and stderr.
pub fn vramlab_code(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(args)
        .output()
        .expect("run vramlab");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

mod bench;
mod errors;
mod finetune;
mod fit;
mod multi_gpu;
mod plan;
