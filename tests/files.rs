//! Files a user names are read within a limit per kind: `/dev/zero`, a FIFO, a directory or
//! a file above the kind's limit is refused with the limit and the file named, in under a
//! second and under 100 MB of memory (the child's peak resident set, from `wait4`).

// `wait4` is the one call that returns a given child's peak memory. Its own test binary
// (Cargo.toml): the child's ru_maxrss starts at the spawning process's high-water mark
// (the kernel records the old address space's at exec), so the parent must stay small.
#![cfg(target_os = "linux")]
#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one run of the binary did.
struct Run {
    ok: bool,
    stderr: String,
    took: Duration,
    max_rss_kib: i64,
}

// The child is reaped by `wait4` (which also returns its peak memory), not `Child::wait`.
#[allow(clippy::zombie_processes)]
fn run(args: &[&str], stdin: Stdio, dir: &Path) -> Run {
    let err_path = dir.join(format!("stderr-{}", args.join("_").replace('/', "_")));
    let err_file = std::fs::File::create(&err_path).expect("stderr file");
    let start = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::null())
        .stderr(err_file)
        .spawn()
        .expect("run vramlab");
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    let mut status = 0;
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `pid` is our own child, not yet waited for (std's `Child` never waits unless
    // asked); wait4 writes the status and the child's rusage into the two pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, usage.as_mut_ptr()) };
    let took = start.elapsed();
    assert_eq!(r, pid, "wait4: {}", std::io::Error::last_os_error());
    // SAFETY: wait4 succeeded, so it filled the rusage (it was zeroed before anyway).
    let usage = unsafe { usage.assume_init() };
    Run {
        ok: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        stderr: std::fs::read_to_string(&err_path).expect("stderr"),
        took,
        // Linux reports ru_maxrss in KiB.
        max_rss_kib: usage.ru_maxrss,
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vramlab-files-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A sparse file of `len` bytes (no disk used, reads as zeros).
fn sparse(path: &Path, len: u64) -> String {
    std::fs::File::create(path)
        .and_then(|f| f.set_len(len))
        .expect("sparse file");
    path.display().to_string()
}

fn refused(args: &[&str], needles: &[&str], dir: &Path) {
    refused_with(args, Stdio::null(), needles, dir);
}

fn refused_with(args: &[&str], stdin: Stdio, needles: &[&str], dir: &Path) {
    let r = run(args, stdin, dir);
    assert!(!r.ok, "{args:?} should be refused");
    for n in needles {
        assert!(
            r.stderr.contains(n),
            "{args:?}: stderr {:?} lacks {n:?}",
            r.stderr
        );
    }
    assert!(!r.stderr.contains("panicked"), "{args:?}: {}", r.stderr);
    assert!(
        r.took < Duration::from_secs(1),
        "{args:?} took {:?}",
        r.took
    );
    assert!(
        r.max_rss_kib < 100 * 1024,
        "{args:?} used {} MiB",
        r.max_rss_kib / 1024
    );
}

#[test]
fn dev_zero_is_refused_for_every_file_kind() {
    let dir = scratch("zero");
    let z = "/dev/zero";
    let not_regular = "not a regular file (a character device)";
    for (args, kind) in [
        (vec!["plan", "--model", z, "--batch", "1"], "model file"),
        (vec!["plan", "--config", z], "saved plan"),
        (
            vec!["export", "--config", z, "--format", "hf"],
            "saved plan",
        ),
        (vec!["doctor", "--snapshot", z], "memory snapshot"),
        (vec!["doctor", "--message-file", z], "OOM message file"),
        (vec!["doctor", "--run", z], "run record"),
        (vec!["validate", z], "measurement file"),
    ] {
        refused(&args, &[not_regular, kind, z], &dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fifos_and_directories_are_refused_without_blocking() {
    let dir = scratch("fifo");
    let fifo = dir.join("plan.vramlab.json");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let fifo = fifo.display().to_string();
    refused(&["plan", "--config", &fifo], &["a FIFO"], &dir);
    refused(
        &["plan", "--model", &fifo, "--batch", "1"],
        &["a FIFO"],
        &dir,
    );
    refused(&["doctor", "--snapshot", &fifo], &["a FIFO"], &dir);
    let d = dir.display().to_string();
    refused(
        &["plan", "--model", &d, "--batch", "1"],
        &["a directory"],
        &dir,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn files_above_their_kind_limit_are_refused_naming_it() {
    let dir = scratch("big");
    let model = sparse(&dir.join("big.json"), (128 << 20) + 1);
    refused(
        &["plan", "--model", &model, "--batch", "1"],
        &[
            "larger than the 128.00 MiB limit for a model file",
            "big.json",
        ],
        &dir,
    );
    let plan = sparse(&dir.join("big.vramlab.json"), (4 << 20) + 1);
    refused(
        &["plan", "--config", &plan],
        &["larger than the 4.00 MiB limit for a saved plan"],
        &dir,
    );
    let run_file = sparse(&dir.join("big.run.json"), (64 << 20) + 1);
    refused(
        &["doctor", "--run", &run_file],
        &["larger than the 64.00 MiB limit for a run record"],
        &dir,
    );
    let snap = sparse(&dir.join("big.pickle"), (4 << 30) + 1);
    refused(
        &["doctor", "--snapshot", &snap],
        &["larger than the 4.00 GiB limit for a memory snapshot"],
        &dir,
    );
    let msg = sparse(&dir.join("big.txt"), (16 << 20) + 1);
    refused(
        &["doctor", "--message-file", &msg],
        &["larger than the 16.00 MiB limit for an OOM message file"],
        &dir,
    );
    let rows = sparse(&dir.join("big.jsonl"), (256 << 20) + 1);
    refused(
        &["validate", &rows],
        &["larger than the 256.00 MiB limit for a measurement file"],
        &dir,
    );
    // Standard input has no size to check first: it is read up to the limit, then refused.
    let zero = std::fs::File::open("/dev/zero").expect("/dev/zero");
    refused_with(
        &["doctor", "--message-file", "-"],
        Stdio::from(zero),
        &["larger than the 16.00 MiB limit"],
        &dir,
    );
    let _ = std::fs::remove_dir_all(&dir);
}
