//! Issue 31's recorded GPU runs of the Python callbacks (`tests/data/callbacks/`, written by
//! `lab/device/python_callbacks_on_device.py`): a Lightning and an HF Trainer run of GPT-2 with
//! `vramlab.callbacks`, each record holding the lines the callback logged, the plan's and
//! torch's peaks, the versions and the device; and a run under a per-process cap whose OOM the
//! callback hands to the doctor.
//!
//! What the records must show: every run logs the plan-vs-measured line, its numbers are the
//! record's own (the line is not free text), a clean run (its own process) is inside the
//! band the callback checks against, and the induced OOM gets the doctor's diagnosis.

use serde_json::Value;

struct Record {
    file: String,
    run: String,
    device: String,
    lines: Vec<String>,
    value: Value,
}

fn records() -> Vec<Record> {
    let dir = crate::data("callbacks");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/data/callbacks")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        // session 17's records (`callbacks_h100.jsonl`) were written by the first callbacks,
        // which logged the check only from the HF Trainer and the doctor's line not at all;
        // kept as the history docs/python.md tells, not held to what the package does now
        .filter(|p| !p.ends_with("callbacks_h100.jsonl"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("callbacks file");
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let value: Value = serde_json::from_str(line).expect("a JSON record");
            out.push(Record {
                file: file.clone(),
                run: value["run"].as_str().expect("run").to_string(),
                device: value["versions"]["device"]
                    .as_str()
                    .expect("device")
                    .to_string(),
                lines: value["lines"]
                    .as_array()
                    .expect("lines")
                    .iter()
                    .map(|l| l.as_str().expect("a line").to_string())
                    .collect(),
                value,
            });
        }
    }
    out
}

fn gib(v: &Value) -> f64 {
    v.as_u64().expect("bytes") as f64 / (1u64 << 30) as f64
}

/// `(measured − planned) / planned` in percent, as the callback prints it.
fn error(r: &Record, what: &str) -> f64 {
    let m = gib(&r.value[format!("measured_{what}")]);
    let p = gib(&r.value[format!("planned_{what}")]);
    100.0 * (m - p) / p
}

/// Each run without an error logs "after N steps: allocated X GiB vs planned Y (±e %), reserved
/// …" with the record's own numbers.
#[test]
fn recorded_runs_log_plan_against_measured() {
    let all = records();
    assert!(all.len() >= 5, "{} records", all.len());
    for r in all.iter().filter(|r| r.value["error"].is_null()) {
        let line = r
            .lines
            .iter()
            .find(|l| l.contains("after ") && l.contains(" vs planned "))
            .unwrap_or_else(|| panic!("{} {}: no plan-vs-measured line", r.file, r.run));
        for what in ["allocated", "reserved"] {
            let text = format!(
                "{what} {:.2} GiB vs planned {:.2} ({:+.1} %)",
                gib(&r.value[format!("measured_{what}")]),
                gib(&r.value[format!("planned_{what}")]),
                error(r, what)
            );
            assert!(
                line.contains(&text),
                "{} {}: {line} lacks {text}",
                r.file,
                r.run
            );
        }
    }
}

/// Runs in a process of their own are inside ±2 % allocated and reserved; the one Lightning
/// run of session 23 that shared its process with an HF run (the `one_process` file, its
/// second record) measured the other run's leftovers and its callback said so.
#[test]
fn clean_runs_are_within_the_band() {
    let all = records();
    let mut clean = 0;
    for (i, r) in all.iter().enumerate() {
        if !r.value["error"].is_null() {
            continue;
        }
        let shared = r.file.contains("one_process")
            && all[..i].iter().any(|q| q.file == r.file && q.run != r.run);
        let (a, res) = (error(r, "allocated"), error(r, "reserved"));
        println!(
            "{} {} on {}: allocated {a:+.1} %, reserved {res:+.1} %{}",
            r.file,
            r.run,
            r.device,
            if shared { " (shared process)" } else { "" }
        );
        if shared {
            assert!(
                r.lines.iter().any(|l| l.contains("past the measured band")),
                "the contaminated run is flagged"
            );
            continue;
        }
        assert!(a.abs() <= 2.0 && res.abs() <= 2.0, "{} {}", r.file, r.run);
        clean += 1;
    }
    assert!(clean >= 3, "{clean} clean runs");
}

/// The run under an 8 GiB per-process cap ran out of memory, and the callback's doctor line
/// names the cause (`process_cap`) and the first thing to change.
#[test]
fn the_induced_oom_gets_the_doctors_diagnosis() {
    let all = records();
    let ooms: Vec<&Record> = all.iter().filter(|r| !r.value["error"].is_null()).collect();
    assert!(!ooms.is_empty());
    for r in ooms {
        let oom = r.value["error"]["oom"].as_str().expect("the OOM message");
        assert!(oom.starts_with("CUDA out of memory."), "{oom}");
        let doctor = r
            .lines
            .iter()
            .find(|l| l.starts_with("vramlab doctor: "))
            .expect("a doctor line");
        assert!(doctor.contains("process_cap"), "{doctor}");
        assert!(doctor.contains("First: "), "{doctor}");
    }
}
