//! The lab's one run script, checked without a GPU: `lab/run --list` names every device job,
//! each job (and each of its parts) dry-runs to exit 0 under `DRY_RUN=1`, and every file a
//! dry run or the lab's device code names is in the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The jobs that were the `*_on_device.sh` scripts before issue 28, by their `lab/run` names.
const JOBS: [&str; 23] = [
    "bench",
    "calibration",
    "capture",
    "dist",
    "ds",
    "eval",
    "faults",
    "grid26",
    "grid26b",
    "grid29",
    "grid29_lanes",
    "grid29c",
    "grid30",
    "grid30_new",
    "grid30_h200",
    "grid31_lightning",
    "grid34",
    "hf",
    "large_batch",
    "lora",
    "qlora",
    "trace",
    "ws",
];

/// `bash lab/run ARGS` at the repository root with only PATH and `env` set (no knob of the
/// caller's environment leaks in); its exit status and stdout.
fn lab_run(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new("bash");
    cmd.arg("lab/run")
        .args(args)
        .current_dir(root())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("bash runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `lab/run --list`: each job's name and its parts (none, or the first being the default).
fn listed() -> Vec<(String, Vec<String>)> {
    let (ok, out, err) = lab_run(&["--list"], &[]);
    assert!(ok, "lab/run --list failed: {err}");
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next().expect("a job name").to_string();
            let parts = words
                .next()
                .filter(|w| w.starts_with('[') && w.ends_with(']'))
                .map(|w| {
                    w.trim_matches(|c| c == '[' || c == ']')
                        .split('|')
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            (name, parts)
        })
        .collect()
}

/// The repository paths a text names (`lab/…`, `crates/…`, `runners/…`, `tests/…`), leaving
/// out templates and globs (a name followed by `$`, `{` or `*`, or one holding them).
fn named_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for prefix in ["lab/", "crates/", "runners/", "tests/"] {
        let mut from = 0;
        while let Some(at) = text[from..].find(prefix) {
            let start = from + at;
            from = start + prefix.len();
            let before = text[..start].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || "_./".contains(c)) {
                continue;
            }
            let len = text[start..]
                .find(|c: char| !(c.is_alphanumeric() || "_-./".contains(c)))
                .unwrap_or(text.len() - start);
            let path = text[start..start + len].trim_end_matches('.');
            let next = text[start + len..].chars().next();
            if next.is_some_and(|c| "${*\\".contains(c)) || path.ends_with('/') {
                continue;
            }
            found.push(path.to_string());
        }
    }
    found
}

#[test]
fn lab_run_lists_every_device_job() {
    let names: Vec<String> = listed().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, JOBS, "lab/run --list");
    let (ok, _, err) = lab_run(&["no_such_job"], &[]);
    assert!(!ok && err.contains("no job"), "{err}");
    let (ok, _, err) = lab_run(&["grid26", "nope"], &[]);
    assert!(!ok && err.contains("parts"), "{err}");
}

#[test]
fn every_job_dry_runs_and_names_files_that_exist() {
    let root = root();
    let mut runs = 0;
    for (job, parts) in listed() {
        let parts: Vec<Option<String>> = if parts.is_empty() {
            vec![None]
        } else {
            parts.into_iter().map(Some).collect()
        };
        for part in parts {
            let out_dir = std::env::temp_dir().join(format!(
                "vramlab-lab-run-{}-{job}-{}",
                std::process::id(),
                part.as_deref().unwrap_or("all")
            ));
            let _ = std::fs::remove_dir_all(&out_dir);
            let out_str = out_dir.to_string_lossy().into_owned();
            let mut args = vec![job.as_str()];
            args.extend(part.as_deref());
            let (ok, out, err) = lab_run(&args, &[("DRY_RUN", "1"), ("OUT", &out_str)]);
            let _ = std::fs::remove_dir_all(&out_dir);
            assert!(ok, "DRY_RUN=1 lab/run {args:?} failed:\n{out}\n{err}");
            assert!(
                out.lines().count() >= 2,
                "lab/run {args:?} printed no commands:\n{out}"
            );
            let mut words = out.split_whitespace().peekable();
            while let Some(w) = words.next() {
                if w == "--skip" {
                    // results of an earlier call, skipped when there
                    while words.peek().is_some_and(|n| n.starts_with("tests/")) {
                        words.next();
                    }
                    continue;
                }
                for path in named_paths(w) {
                    assert!(
                        root.join(&path).exists(),
                        "lab/run {args:?} names {path}, which is not in the repository"
                    );
                }
            }
            runs += 1;
        }
    }
    assert!(runs >= JOBS.len() + 5, "only {runs} dry runs");
}

/// The files lab/run and the lab's device code name (default config lists, grids, runners)
/// are there: a moved file breaks this test, not a session on the device.
#[test]
fn the_lab_names_files_that_exist() {
    let root = root();
    let mut sources = vec![root.join("lab/run")];
    for dir in ["lab/device", "lab/grids", "lab/cpu", "lab/models"] {
        for e in std::fs::read_dir(root.join(dir)).expect(dir).flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "py" || x == "sh") {
                sources.push(p);
            }
        }
    }
    let mut checked = 0;
    for src in &sources {
        let text = std::fs::read_to_string(src).expect("source");
        for path in named_paths(&text) {
            // outputs the lab writes into tests/data are not inputs: only the lab's own files
            if path.starts_with("tests/") {
                continue;
            }
            checked += 1;
            assert!(
                root.join(&path).exists(),
                "{} names {path}, which is not in the repository",
                src.strip_prefix(&root).unwrap_or(src).display()
            );
        }
    }
    assert!(checked >= 50, "only {checked} paths found");
}

#[test]
fn every_lab_shell_script_parses() {
    let root = root();
    let mut scripts = vec![root.join("lab/run")];
    for e in std::fs::read_dir(root.join("lab/cpu"))
        .expect("lab/cpu")
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "sh") {
            scripts.push(e.path());
        }
    }
    assert!(scripts.len() >= 3, "{scripts:?}");
    for s in &scripts {
        let st = Command::new("bash")
            .arg("-n")
            .arg(s)
            .status()
            .expect("bash");
        assert!(st.success(), "bash -n {}", Path::new(s).display());
    }
}
