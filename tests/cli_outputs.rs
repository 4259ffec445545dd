//! The text and `--json` outputs of `plan`, `doctor` and `max-batch`, byte for byte, for a
//! table of configurations (one GPU and several, fine-tuning modes, warnings, nothing fits,
//! a captured graph, an encoder-decoder, OOM messages, a snapshot, a bench run).
//! `tests/data/cli_outputs/cases.jsonl` was written by `capture.sh` beside it from the binary
//! before the answers moved into the core: they must print as the CLI printed them.

use std::process::Command;

#[test]
fn plan_outputs_are_unchanged() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/tests/data/cli_outputs/cases.jsonl"))
        .expect("cases.jsonl");
    let mut checked = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let name = case["name"].as_str().expect("name");
        let args: Vec<&str> = case["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("an argument"))
            .collect();
        for (kind, extra) in [("text", None), ("json", Some("--json"))] {
            let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
                .current_dir(root)
                .args(&args)
                .args(extra)
                .output()
                .expect("run vramlab");
            let expected = &case[kind];
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                stdout,
                expected["stdout"].as_str().expect("stdout"),
                "{name} ({kind}): stdout differs"
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stderr),
                expected["stderr"].as_str().expect("stderr"),
                "{name} ({kind}): stderr differs"
            );
            assert_eq!(
                i64::from(out.status.code().unwrap_or(-1)),
                expected["status"].as_i64().expect("status"),
                "{name} ({kind}): exit status differs; stderr {}",
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 72, "every case, text and JSON");
}

/// `fit --json` and `plan --json` (whose remedies and next step run the fit search), byte for
/// byte, as the binary printed them before the search and the remedies were made faster
/// (`tests/data/fit_outputs/capture.sh`): speed without changed answers.
#[test]
fn fit_outputs_are_unchanged() {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/tests/data/fit_outputs/cases.jsonl"))
        .expect("cases.jsonl");
    let mut checked = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let name = case["name"].as_str().expect("name");
        let args: Vec<&str> = case["args"]
            .as_array()
            .expect("args")
            .iter()
            .map(|a| a.as_str().expect("an argument"))
            .collect();
        let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
            .current_dir(root)
            .args(&args)
            .arg("--json")
            .output()
            .expect("run vramlab");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            case["stdout"].as_str().expect("stdout"),
            "{name}: stdout differs"
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            case["stderr"].as_str().expect("stderr"),
            "{name}: stderr differs"
        );
        assert_eq!(
            i64::from(out.status.code().unwrap_or(-1)),
            case["status"].as_i64().expect("status"),
            "{name}: exit status differs"
        );
        checked += 1;
    }
    assert_eq!(checked, 17, "every case");
}
