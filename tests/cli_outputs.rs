//! The text and `--json` outputs of `plan`, `doctor` and `max-batch`, byte for byte, for a
//! table of configurations (one GPU and several, fine-tuning modes, warnings, nothing fits,
//! a captured graph, an encoder-decoder, OOM messages, a snapshot, a bench run).
//! `tests/data/cli_outputs/cases.jsonl` was written by `capture.sh` beside it from the binary
//! before the answers moved into the core: they must print as the CLI printed them.

use std::process::Command;

/// The recorded cases of `tests/data/<dir>/cases.jsonl`: (name, arguments, the recording).
fn cases(dir: &str) -> Vec<(String, Vec<String>, serde_json::Value)> {
    let root = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{root}/tests/data/{dir}/cases.jsonl"))
        .expect("cases.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let case: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            let name = case["name"].as_str().expect("name").to_string();
            let args = case["args"]
                .as_array()
                .expect("args")
                .iter()
                .map(|a| a.as_str().expect("an argument").to_string())
                .collect();
            (name, args, case)
        })
        .collect()
}

/// Runs `vramlab ARGS [EXTRA]` and asserts its standard output, standard error and exit
/// status are `expected`'s (`stdout`, `stderr`, `status`); `what` names the case.
fn assert_prints(args: &[String], extra: Option<&str>, expected: &serde_json::Value, what: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .args(extra)
        .output()
        .expect("run vramlab");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        expected["stdout"].as_str().expect("stdout"),
        "{what}: stdout differs"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        expected["stderr"].as_str().expect("stderr"),
        "{what}: stderr differs"
    );
    assert_eq!(
        i64::from(out.status.code().unwrap_or(-1)),
        expected["status"].as_i64().expect("status"),
        "{what}: exit status differs; stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn plan_outputs_are_unchanged() {
    let mut checked = 0;
    for (name, args, case) in cases("cli_outputs") {
        for (kind, extra) in [("text", None), ("json", Some("--json"))] {
            assert_prints(&args, extra, &case[kind], &format!("{name} ({kind})"));
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
    let mut checked = 0;
    for (name, args, case) in cases("fit_outputs") {
        assert_prints(&args, Some("--json"), &case, &name);
        checked += 1;
    }
    assert_eq!(checked, 17, "every case");
}
