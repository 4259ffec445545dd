//! The OOM doctor on real messages and snapshots recorded on an H200 (lab/device/oom_cases.py,
//! tests/data/doctor/cases.jsonl), and on hostile pickles.

use std::path::PathBuf;

use clap::Parser;
use proptest::prelude::*;
use vramlab_core::doctor::pickle::{Limits, read_pickle_bytes};
use vramlab_core::doctor::{self, Cause};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/doctor")
        .join(name)
}

struct Case {
    name: String,
    oom: bool,
    max_allocated: u64,
    max_reserved: u64,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(data("cases.jsonl")).expect("cases.jsonl");
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            assert_eq!(v["device"], "NVIDIA H200");
            assert!(v["torch"].as_str().is_some_and(|t| t.starts_with("2.")));
            Case {
                name: v["case"].as_str().expect("case").to_string(),
                oom: v["oom"].as_bool().expect("oom"),
                max_allocated: v["max_memory_allocated"].as_u64().expect("alloc"),
                max_reserved: v["max_memory_reserved"].as_u64().expect("reserved"),
            }
        })
        .collect()
}

fn expected(case: &str) -> Option<Cause> {
    match case {
        "capacity" | "no_grad_eval" => Some(Cause::Capacity),
        "fragmentation" => Some(Cause::Fragmentation),
        "outside" => Some(Cause::OutsideAllocator),
        "process_cap" => Some(Cause::ProcessCap),
        "other_process" => Some(Cause::OtherProcesses),
        _ => None,
    }
}

fn report(name: &str) -> doctor::SnapshotReport {
    let bytes = std::fs::read(data(&format!("{name}.snapshot.pickle"))).expect("snapshot");
    let snap = doctor::read_snapshot(&bytes[..], &mut |_| true).expect("readable snapshot");
    doctor::analyze(&snap, None).expect("analysis")
}

#[test]
fn every_recorded_case_is_in_the_data() {
    let names: Vec<String> = cases().into_iter().map(|c| c.name).collect();
    for n in [
        "capacity",
        "fragmentation",
        "fragmentation_expandable",
        "outside",
        "process_cap",
        "other_process",
        "no_grad_eval",
        "normal",
    ] {
        assert!(names.iter().any(|c| c == n), "missing case {n}");
    }
}

#[test]
fn real_messages_are_diagnosed() {
    for c in cases() {
        let text = std::fs::read_to_string(data(&format!("{}.message.txt", c.name)))
            .expect("message file");
        assert_eq!(!text.is_empty(), c.oom, "{}", c.name);
        let Some(want) = expected(&c.name) else {
            assert!(
                !c.oom || doctor::parse_message(&text).is_none(),
                "{}",
                c.name
            );
            continue;
        };
        let m = doctor::parse_message(&text).unwrap_or_else(|| panic!("{}: not parsed", c.name));
        assert!(m.requested_bytes.is_some() && m.total_capacity_bytes.is_some());
        assert!(m.allocated_bytes.is_some() && m.reserved_unallocated_bytes.is_some());
        let d = doctor::diagnose(Some(&m), None).expect("diagnosis");
        assert_eq!(d.cause, want, "{}: {:?}", c.name, d.evidence);
        assert!(!d.remedies.is_empty());
        assert_eq!(
            d.validation_without_no_grad,
            c.name == "no_grad_eval",
            "{}",
            c.name
        );
    }
}

#[test]
fn fragmentation_remedies_are_derived_from_the_request() {
    let text = std::fs::read_to_string(data("fragmentation.message.txt")).expect("message");
    let m = doctor::parse_message(&text).expect("parsed");
    assert_eq!(
        m.requested_bytes,
        Some(vramlab_core::units::Bytes::mib(256))
    );
    let d = doctor::diagnose(Some(&m), None).expect("diagnosis");
    let settings: Vec<_> = d
        .remedies
        .iter()
        .filter_map(|r| r.setting.clone())
        .collect();
    assert_eq!(
        settings[..2],
        [
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".to_string(),
            "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:256".to_string()
        ]
    );
}

#[test]
fn snapshot_peaks_match_max_memory_within_one_percent() {
    for c in cases() {
        let r = report(&c.name);
        let err = |got: u64, want: u64| (got as f64 - want as f64).abs() / want as f64;
        assert!(
            err(r.peak_allocated_bytes.0, c.max_allocated) <= 0.01,
            "{}: peak allocated {} vs max_memory_allocated {}",
            c.name,
            r.peak_allocated_bytes.0,
            c.max_allocated
        );
        assert!(
            err(r.peak_reserved_bytes.0, c.max_reserved) <= 0.01,
            "{}: peak reserved {} vs max_memory_reserved {}",
            c.name,
            r.peak_reserved_bytes.0,
            c.max_reserved
        );
        assert_eq!(r.ooms.is_empty(), !c.oom, "{}", c.name);
        assert!(!r.timeline.is_empty());
    }
}

#[test]
fn snapshot_peaks_are_exact_for_the_block_replay() {
    // The replay rounds requests and keeps unsplittable remainders like the allocator.
    for c in cases() {
        let r = report(&c.name);
        assert_eq!(r.peak_allocated_bytes.0, c.max_allocated, "{}", c.name);
        assert_eq!(r.peak_reserved_bytes.0, c.max_reserved, "{}", c.name);
    }
}

#[test]
fn snapshots_alone_diagnose_fragmentation_and_capacity() {
    let r = report("fragmentation");
    let m = r.segment_map.as_ref().expect("map at the oom");
    assert_eq!(m.at, "oom");
    assert_eq!(
        m.largest_free_block_bytes,
        vramlab_core::units::Bytes::mib(128)
    );
    assert!(m.free_in_segments_bytes >= vramlab_core::units::Bytes::gib(4));
    assert!(m.fragmentation > 0.9, "{}", m.fragmentation);
    let d = doctor::diagnose(None, Some(&r)).expect("diagnosis");
    assert_eq!(d.cause, Cause::Fragmentation);
    let d = doctor::diagnose(None, Some(&report("capacity"))).expect("diagnosis");
    assert_eq!(d.cause, Cause::Capacity);
    assert!(doctor::diagnose(None, Some(&report("normal"))).is_none());
    let exp = report("fragmentation_expandable");
    assert!(exp.expandable_segments && exp.ooms.is_empty());
    // Backward runs on autograd's C++ threads: those blocks have no Python frame.
    let top = &report("normal").top_sites;
    assert!(
        top.iter().any(|s| s.site.contains("oom_cases.py")),
        "{top:?}"
    );
    assert!(
        top.iter().any(|s| s.site.starts_with("(no Python frame")),
        "{top:?}"
    );
}

#[test]
fn cli_json_for_message_and_snapshot() {
    let cli = vramlab::cli::Cli::try_parse_from([
        "vramlab",
        "doctor",
        "--message-file",
        data("fragmentation.message.txt").to_str().expect("path"),
        "--snapshot",
        data("fragmentation.snapshot.pickle")
            .to_str()
            .expect("path"),
        "--json",
    ])
    .expect("args");
    let mut out = Vec::new();
    vramlab::cli::run(cli.command.expect("command"), &mut out).expect("doctor runs");
    let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(v["diagnosis"], "fragmentation");
    let want = cases()
        .into_iter()
        .find(|c| c.name == "fragmentation")
        .expect("case");
    assert_eq!(v["peak_allocated_bytes"], want.max_allocated);
    assert_eq!(v["peak_reserved_bytes"], want.max_reserved);
    assert!(v["remedies"].as_array().is_some_and(|r| r.len() >= 2));
    assert!(v["message"]["requested_bytes"].as_u64().is_some());
    assert_eq!(v["figures"]["largest_free_block_bytes"], 128u64 << 20);
    assert_eq!(v["figures"]["requested_bytes"], 256u64 << 20);
}

#[test]
fn cli_adds_the_planner_for_a_capacity_oom() {
    let cli = vramlab::cli::Cli::try_parse_from([
        "vramlab",
        "doctor",
        "--message-file",
        data("capacity.message.txt").to_str().expect("path"),
        "--model",
        "gpt2",
        "--seq",
        "1024",
        "--batch",
        "512",
        "--json",
    ])
    .expect("args");
    let mut out = Vec::new();
    vramlab::cli::run(cli.command.expect("command"), &mut out).expect("doctor runs");
    let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(v["diagnosis"], "capacity");
    let max = v["plan"]["max_batch"].as_u64().expect("max batch");
    assert!(max > 0 && max < 512, "{max}");
    assert!(v["plan"]["accumulation_for_batch"].as_u64().is_some());
    assert!(
        !v["plan"]["remedies"]
            .as_array()
            .expect("remedies")
            .is_empty()
    );
    // The seed articles' validation OOM: the evaluation step with and without no_grad,
    // and the remedy that points at it.
    let e = &v["plan"]["evaluation"];
    let with = e["with_grad"]["peak_allocated_bytes"]
        .as_u64()
        .expect("eval-grad");
    let without = e["no_grad"]["peak_allocated_bytes"].as_u64().expect("eval");
    assert!(with > without, "{with} <= {without}");
    let remedies = v["plan"]["remedies"].as_array().expect("remedies");
    let r = remedies
        .iter()
        .find(|r| r["name"] == "eval-no-grad")
        .expect("eval-no-grad remedy");
    assert!(
        r["description"]
            .as_str()
            .is_some_and(|d| d.contains("torch.no_grad()"))
    );
    assert_eq!(
        r["saving_bytes"].as_i64(),
        Some(with as i64 - without as i64)
    );
}

#[test]
fn cli_reads_a_saved_bench_run() {
    // A real torch-engine sweep on the H200 (tests/data/bench): its first OOM, its model.
    let bench = |name: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/bench")
            .join(name)
    };
    let run = |file: &str| {
        let cli = vramlab::cli::Cli::try_parse_from([
            "vramlab",
            "doctor",
            "--run",
            bench(file).to_str().expect("path"),
            "--json",
        ])
        .expect("args");
        let mut out = Vec::new();
        vramlab::cli::run(cli.command.expect("command"), &mut out).expect("doctor runs");
        serde_json::from_slice::<serde_json::Value>(&out).expect("json")
    };
    let v = run("gpt2-torch.json");
    assert!(v["diagnosis"].is_string());
    let max = v["plan"]["max_batch"].as_u64().expect("max batch");
    let batch = v["plan"]["batch"].as_u64().expect("failing batch");
    assert!(max < batch, "{max} < {batch}");
    assert_eq!(v["remedies"][0]["title"], "Use a batch that fits (planner)");
    let v = run("gpt2-native.json");
    assert_eq!(v["message"]["format"], "vramlab_native");
    assert_eq!(v["diagnosis"], "capacity");
}

/// `vramlab doctor FILE` takes the file as it comes, as a user passes what they have: the
/// snapshot, the saved run or the error text each give the report their option gives.
#[test]
fn a_file_is_read_as_what_it_is() {
    let json = doctor_json;
    let snapshot = path("fragmentation.snapshot.pickle");
    assert_eq!(json(&[&snapshot]), json(&["--snapshot", &snapshot]));
    let message = path("capacity.message.txt");
    assert_eq!(json(&[&message]), json(&["--message-file", &message]));
    let run = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/bench/gpt2-torch.json");
    let run = run.to_str().expect("path");
    assert_eq!(json(&[run]), json(&["--run", run]));
    // With an option for the same input it is refused, naming both.
    let e = vramlab::cli::Cli::try_parse_from([
        "vramlab",
        "doctor",
        &snapshot,
        "--snapshot",
        &snapshot,
    ])
    .map(|_| ())
    .expect_err("both");
    assert!(e.to_string().contains("--snapshot"), "{e}");
}

#[test]
fn cli_errors_are_clear() {
    let run = |args: &[&str]| {
        let mut all = vec!["vramlab", "doctor"];
        all.extend_from_slice(args);
        let cli = vramlab::cli::Cli::try_parse_from(all).expect("args");
        let mut out = Vec::new();
        vramlab::cli::run(cli.command.expect("command"), &mut out)
            .map(|_| ())
            .map_err(|e| format!("{e:#}"))
    };
    let e = run(&[]).expect_err("nothing given");
    assert!(e.contains("--message"), "{e}");
    let e = run(&["--message", "ValueError: bad shape"]).expect_err("no oom");
    assert!(e.contains("out of memory"), "{e}");
    let e = run(&["--snapshot", "/nonexistent.pickle"]).expect_err("missing");
    assert!(e.contains("/nonexistent.pickle"), "{e}");
    let e = run(&["/nonexistent.txt"]).expect_err("missing");
    assert!(e.contains("/nonexistent.txt"), "{e}");
    let e = run(&[
        "--snapshot",
        data("capacity.message.txt").to_str().expect("p"),
    ])
    .expect_err("text is no pickle");
    assert!(e.contains("snapshot"), "{e}");
}

#[test]
fn hostile_pickles_are_refused() {
    for (bytes, what) in [
        (
            &b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R."[..],
            "STACK_GLOBAL",
        ),
        (b"\x80\x02cbuiltins\neval\nq\x00.", "GLOBAL"),
        (b"\x80\x02}b.", "BUILD"),
        (b"\x80\x02N\x81.", "NEWOBJ"),
        (b"\x80\x02(i__main__\nX\n.", "INST"),
    ] {
        let e = read_pickle_bytes(bytes, Limits::default()).expect_err(what);
        assert!(e.to_string().contains(what), "{what}: {e}");
    }
}

/// A pickle prefix that opens a snapshot-shaped dict.
fn header() -> Vec<u8> {
    b"\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x0ddevice_traces\x94]\x94]\x94(".to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut b = header();
        b.extend(&body);
        let _ = read_pickle_bytes(&b, Limits::default())
            .map(|p| vramlab_core::doctor::Snapshot::from_pickle(&p).map(|s| doctor::analyze(&s, None)));
    }

    #[test]
    fn mutated_real_snapshots_never_panic(
        seed_case in 0usize..3,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let name = ["normal", "fragmentation", "outside"][seed_case];
        let mut b = std::fs::read(data(&format!("{name}.snapshot.pickle"))).expect("snapshot");
        for (at, v) in flips {
            let i = at % b.len();
            b[i] = v;
        }
        b.truncate(cut % (b.len() + 1));
        let limits = Limits { max_nodes: 1 << 20, max_string_bytes: 1 << 20, max_stack: 1 << 16, max_memo: 1 << 20 };
        if let Ok(p) = read_pickle_bytes(&b, limits)
            && let Ok(s) = vramlab_core::doctor::Snapshot::from_pickle(&p)
        {
            let _ = doctor::analyze(&s, None);
        }
    }

    #[test]
    fn huge_length_fields_are_bounded(len in any::<u64>(), op in prop::sample::select(vec![0x8du8, 0x8e, 0x96])) {
        let mut b = b"\x80\x04".to_vec();
        b.push(op);
        b.extend(len.to_le_bytes());
        b.extend(b"abc");
        prop_assert!(read_pickle_bytes(&b, Limits::default()).is_err());
    }
}

/// Writes a synthetic snapshot of `entries` alloc/free pairs (about 330 bytes each).
fn synthetic_snapshot(entries: usize) -> Vec<u8> {
    fn s(out: &mut Vec<u8>, t: &str) {
        out.push(0x8c);
        out.push(t.len() as u8);
        out.extend(t.as_bytes());
    }
    fn int(out: &mut Vec<u8>, v: u64) {
        out.push(0x8a);
        out.push(8);
        out.extend(v.to_le_bytes());
    }
    let mut b = header();
    let base = 1u64 << 40;
    let seg = 1u64 << 34;
    let entry = |b: &mut Vec<u8>, action: &str, addr: u64, size: u64, i: usize| {
        b.extend(b"}(");
        s(b, "action");
        s(b, action);
        s(b, "addr");
        int(b, addr);
        s(b, "size");
        int(b, size);
        s(b, "stream");
        b.extend(b"K\x00");
        s(b, "time_us");
        int(b, i as u64);
        s(b, "frames");
        b.extend(b"](");
        for d in 0..3 {
            b.extend(b"}(");
            s(b, "filename");
            s(b, &format!("/home/user/project/train_{}.py", (i + d) % 50));
            s(b, "line");
            b.extend(b"M");
            b.extend(((i % 5000) as u16).to_le_bytes());
            s(b, "name");
            s(b, if d == 0 { "forward" } else { "train_step" });
            b.push(b'u');
        }
        b.push(b'e');
        b.push(b'u');
    };
    entry(&mut b, "segment_alloc", base, seg, 0);
    for i in 0..entries / 2 {
        let addr = base + (i as u64 % 1024) * (16 << 20);
        entry(&mut b, "alloc", addr, 8 << 20, i);
        if i >= 512 {
            let back = base + ((i as u64 - 512) % 1024) * (16 << 20);
            entry(&mut b, "free_requested", back, 8 << 20, i);
            entry(&mut b, "free_completed", back, 8 << 20, i);
        }
    }
    b.extend(b"eau.");
    b
}

#[test]
fn synthetic_snapshot_round_trip() {
    let b = synthetic_snapshot(4000);
    let snap = doctor::read_snapshot(&b[..], &mut |_| true).expect("synthetic snapshot");
    let r = doctor::analyze(&snap, None).expect("report");
    assert_eq!(r.peak_reserved_bytes.0, 1 << 34);
    assert!(r.peak_allocated_bytes.0 >= 512 * (8 << 20));
}

/// `cargo test --release --test doctor -- --ignored big --nocapture`
#[test]
#[ignore = "writes and reads a ≥ 100 MB snapshot; run in release (timed by lab/cpu/bench_snapshot.sh, not here)"]
fn big_snapshot_opens_in_seconds() {
    let b = synthetic_snapshot(330_000);
    assert!(b.len() >= 100 << 20, "{} bytes", b.len());
    let path = std::env::temp_dir().join("vramlab_big_snapshot.pickle");
    std::fs::write(&path, &b).expect("write");
    let t = std::time::Instant::now();
    let mut calls = 0u64;
    let r = vramlab::cli::doctor::load_snapshot(&path, None, &mut |_, _| {
        calls += 1;
        true
    })
    .expect("big snapshot");
    let secs = t.elapsed().as_secs_f64();
    println!(
        "big snapshot: {:.1} MB, {} trace entries, read + analysed in {secs:.2} s, {calls} progress calls",
        b.len() as f64 / 1e6,
        r.trace_entries
    );
    let _ = std::fs::remove_file(&path);
    assert!(calls >= 100);
}

#[test]
fn cli_lays_the_planned_step_over_a_snapshot() {
    let cli = vramlab::cli::Cli::try_parse_from([
        "vramlab",
        "doctor",
        "--snapshot",
        data("normal.snapshot.pickle").to_str().expect("path"),
        "--model",
        "gpt2",
        "--batch",
        "8",
        "--gpu",
        "h200",
        "--json",
        "--timeline",
    ])
    .expect("args");
    let mut out = Vec::new();
    vramlab::cli::run(cli.command.expect("command"), &mut out).expect("doctor runs");
    let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
    let o = &v["planned_overlay"];
    assert_eq!(
        o["planned_peak_allocated_bytes"],
        v["plan"]["predicted_peak_allocated_bytes"]
    );
    assert_eq!(
        o["snapshot_peak_allocated_bytes"],
        v["peak_allocated_bytes"]
    );
    let points = o["points"].as_array().expect("points");
    assert!(points.len() > 100, "{}", points.len());
    // Stretched onto the trace: from its first entry to its last.
    let xs: Vec<f64> = points.iter().filter_map(|p| p[0].as_f64()).collect();
    let trace = v["snapshot"]["timeline"].as_array().expect("timeline");
    let first = trace.first().and_then(|p| p["event"].as_f64());
    let last = trace.last().and_then(|p| p["event"].as_f64());
    assert_eq!(xs.first().copied(), first);
    assert_eq!(xs.last().copied(), last);
    assert!(xs.windows(2).all(|w| w[0] <= w[1]), "monotone");
}

// Snapshots with the stacks PyTorch records by default (`_record_memory_history()`:
// stacks="all", C++ frames interleaved with Python ones) and with stacks="python";
// lab/cpu/make_doctor_fixtures.py writes them.

fn doctor_json(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["vramlab", "doctor"];
    all.extend_from_slice(args);
    all.push("--json");
    let cli = vramlab::cli::Cli::try_parse_from(all).expect("args");
    let mut out = Vec::new();
    vramlab::cli::run(cli.command.expect("command"), &mut out).expect("doctor runs");
    serde_json::from_slice(&out).expect("json")
}

fn path(name: &str) -> String {
    data(name).to_str().expect("path").to_string()
}

#[test]
fn default_stacks_give_no_evaluation_hint_on_a_training_step() {
    for stacks in ["all", "python"] {
        let r = report(&format!("stacks_{stacks}_train"));
        assert!(
            r.eval_sites_at_peak.is_empty(),
            "{stacks}: {:?}",
            r.eval_sites_at_peak
        );
        let d = doctor::diagnose(None, Some(&r)).expect("diagnosis");
        assert_eq!(d.cause, Cause::Capacity, "{stacks}: {:?}", d.evidence);
        assert!(!d.validation_without_no_grad, "{stacks}");
        assert!(
            !d.remedies
                .iter()
                .any(|m| m.title == "Run validation without autograd"),
            "{stacks}: {:?}",
            d.remedies
        );
        assert!(!d.evidence.iter().any(|e| e.contains("evaluation code")));
    }
    // The frames that fooled it are there.
    let bytes = std::fs::read(data("stacks_all_train.snapshot.pickle")).expect("snapshot");
    let snap = doctor::read_snapshot(&bytes[..], &mut |_| true).expect("snapshot");
    assert!(
        snap.frames
            .iter()
            .any(|f| f.name == "_PyEval_EvalFrameDefault")
    );
    assert!(
        snap.frames
            .iter()
            .any(|f| f.name.contains("gather_with_cpp"))
    );
}

#[test]
fn default_stacks_still_find_a_validation_loop_without_no_grad() {
    for stacks in ["all", "python"] {
        let r = report(&format!("stacks_{stacks}_eval"));
        assert_eq!(r.eval_sites_at_peak, ["validate"], "{stacks}");
        let d = doctor::diagnose(None, Some(&r)).expect("diagnosis");
        assert!(d.validation_without_no_grad, "{stacks}");
        assert_eq!(d.remedies[0].title, "Run validation without autograd");
    }
}

#[test]
fn sites_name_python_frames_with_default_stacks() {
    for stacks in ["all", "python"] {
        let r = report(&format!("stacks_{stacks}_train"));
        let sites: Vec<&str> = r.top_sites.iter().map(|s| s.site.as_str()).collect();
        // The user's frame, past torch's and transformers' frames; never a C++ frame.
        assert_eq!(
            sites[0], "project/train.py:41 in train_step",
            "{stacks}: {sites:?}"
        );
        assert!(
            !sites
                .iter()
                .any(|s| s.contains(".cpp") || s.contains("gather_with_cpp")),
            "{stacks}: {sites:?}"
        );
        // Backward on autograd's thread has no Python frame under either setting.
        assert!(
            sites.contains(&"(no Python frame: autograd backward or C++)"),
            "{stacks}: {sites:?}"
        );
        assert!(sites.contains(&"project/train.py:70 in main"), "{sites:?}");
        for s in &r.top_sites {
            assert!(
                s.stack
                    .iter()
                    .all(|f| !f.name.contains("gather_with_cpp")
                        && !f.name.contains("PyEval_EvalFrame")),
                "{stacks}: {:?}",
                s.stack
            );
        }
        let oom = r.ooms.last().expect("oom");
        assert!(
            oom.stack
                .iter()
                .all(|f| !f.name.contains("gather_with_cpp")),
            "{:?}",
            oom.stack
        );
    }
    // The text output lists the Python site.
    let cli = vramlab::cli::Cli::try_parse_from([
        "vramlab",
        "doctor",
        "--snapshot",
        &path("stacks_all_train.snapshot.pickle"),
    ])
    .expect("args");
    let mut out = Vec::new();
    vramlab::cli::run(cli.command.expect("command"), &mut out).expect("doctor runs");
    let text = String::from_utf8(out).expect("utf-8");
    let sites = text
        .split("live at the peak, by allocation site:")
        .nth(1)
        .expect("sites listed");
    assert!(
        sites.contains("project/train.py:41 in train_step"),
        "{text}"
    );
    assert!(!sites.contains("memory_snapshot.cpp"), "{text}");
}

#[test]
fn fragmentation_under_a_cap_comes_first() {
    // Issue 27: 8 GiB cap, 3.73 GiB reserved but unallocated, a 1.40 GiB request.
    let v = doctor_json(&[
        "--message-file",
        &path("stacks_frag_cap.message.txt"),
        "--snapshot",
        &path("stacks_all_frag_cap.snapshot.pickle"),
    ]);
    assert_eq!(
        v["diagnosis"], "fragmentation",
        "{}",
        v["details"]["evidence"]
    );
    assert_eq!(v["figures"]["allowed_bytes"], 8u64 << 30);
    let titles: Vec<&str> = v["remedies"]
        .as_array()
        .expect("remedies")
        .iter()
        .filter_map(|r| r["title"].as_str())
        .collect();
    let settings: Vec<&str> = v["remedies"]
        .as_array()
        .expect("remedies")
        .iter()
        .filter_map(|r| r["setting"].as_str())
        .collect();
    assert_eq!(
        settings[..2],
        [
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:1024"
        ]
    );
    let cap = titles
        .iter()
        .position(|t| *t == "Raise the per-process cap")
        .expect("the cap follows");
    assert!(cap >= 2, "{titles:?}");
    // The snapshot agrees: the holes are smaller than the request.
    assert_eq!(v["figures"]["largest_free_block_bytes"], 955u64 << 20);
    // The real process_cap case (nearly all of the cap allocated) stays a cap OOM.
    let v = doctor_json(&["--message-file", &path("process_cap.message.txt")]);
    assert_eq!(v["diagnosis"], "process_cap");
    // And the message alone gives the same order as with the snapshot.
    let v = doctor_json(&["--message-file", &path("stacks_frag_cap.message.txt")]);
    assert_eq!(v["diagnosis"], "fragmentation");
}

#[test]
fn the_doctors_plan_honours_the_cap_and_the_loop() {
    // "34.95 GiB allowed" on a 139.80 GiB card (the real process_cap case).
    let capped = |extra: &[&str]| {
        let mut a = vec![
            "--message-file",
            "",
            "--model",
            "gpt2",
            "--seq",
            "1024",
            "--batch",
            "32",
        ];
        let p = path("process_cap.message.txt");
        a[1] = &p;
        a.extend_from_slice(extra);
        doctor_json(&a)
    };
    let v = capped(&[]);
    let allowed = v["message"]["allowed_bytes"].as_u64().expect("allowed");
    assert_eq!(v["plan"]["allowed_bytes"].as_u64(), Some(allowed));
    assert_eq!(
        v["plan"]["capacity_bytes"],
        v["message"]["total_capacity_bytes"]
    );
    assert_eq!(v["plan"]["loop_shape"], "plain");
    let max_capped = v["plan"]["max_batch"].as_u64().expect("max batch");
    // The same model on the whole card (a message without a cap) fits far more.
    let v_card = doctor_json(&[
        "--message-file",
        &path("capacity.message.txt"),
        "--model",
        "gpt2",
        "--seq",
        "1024",
        "--batch",
        "32",
    ]);
    assert!(v_card["plan"]["allowed_bytes"].is_null());
    let max_card = v_card["plan"]["max_batch"].as_u64().expect("max batch");
    assert!(
        (max_capped as f64) < max_card as f64 * 0.4,
        "capped {max_capped} vs card {max_card}"
    );
    // The cap is what the planner's max batch is held to: its plan fits under it.
    let preset = vramlab_core::model::preset::find_builtin("gpt2").expect("gpt2");
    let cfg = vramlab_core::plan::TrainConfig {
        batch: max_capped,
        size: Some(1024),
        precision: vramlab_core::plan::config::Precision::AmpBf16,
        ..Default::default()
    };
    let plan = vramlab_core::plan::Planner::new(&preset, &cfg)
        .and_then(|p| p.plan(max_capped))
        .expect("plan");
    assert!(
        plan.peak_allocated_bytes.0 <= allowed,
        "{} > {allowed}",
        plan.peak_allocated_bytes
    );
    // --loop is accepted and honoured: the trainer loop drops the logits before backward.
    let t = capped(&["--loop", "trainer"]);
    assert_eq!(t["plan"]["loop_shape"], "trainer");
    let plain = v["plan"]["predicted_peak_allocated_bytes"]
        .as_u64()
        .expect("peak");
    let trainer = t["plan"]["predicted_peak_allocated_bytes"]
        .as_u64()
        .expect("peak");
    assert!(trainer < plain, "trainer {trainer} vs plain {plain}");
    let msg = path("process_cap.message.txt");
    let e = vramlab::cli::Cli::try_parse_from([
        "vramlab",
        "doctor",
        "--message-file",
        &msg,
        "--loop",
        "trainr",
        "--model",
        "gpt2",
    ])
    .map_err(|e| e.to_string())
    .and_then(|cli| {
        let mut out = Vec::new();
        vramlab::cli::run(cli.command.expect("command"), &mut out).map_err(|e| format!("{e:#}"))
    })
    .expect_err("a misspelt loop");
    assert!(e.contains("trainer"), "{e}");
}

// Real OOMs recorded on an H200 with the default history settings
// (`lab/device/oom_cases.py --set stacks`, tests/data/doctor/real_cases.jsonl): stacks="all" for
// the `all_` cases, stacks="python" for the `py_` ones, written by `_dump_snapshot`.

struct RealCase {
    name: String,
    stacks: String,
    max_allocated: u64,
    max_reserved: u64,
}

fn real_cases() -> Vec<RealCase> {
    let text = std::fs::read_to_string(data("real_cases.jsonl")).expect("real_cases.jsonl");
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            assert_eq!(v["device"], "NVIDIA H200");
            assert_eq!(v["torch"], "2.11.0+cu130");
            assert_eq!(v["driver"], "580.159.04");
            assert_eq!(v["oom"], true, "{l}");
            assert_eq!(v["error"], "", "{l}");
            RealCase {
                name: v["case"].as_str().expect("case").to_string(),
                stacks: v["stacks"].as_str().expect("stacks").to_string(),
                max_allocated: v["max_memory_allocated"].as_u64().expect("alloc"),
                max_reserved: v["max_memory_reserved"].as_u64().expect("reserved"),
            }
        })
        .collect()
}

/// The cause each real case must get, and whether it ran evaluation without `no_grad`.
fn real_expected(case: &str) -> (Cause, bool) {
    match case.split_once('_').map(|x| x.1).unwrap_or(case) {
        "eval_unet" => (Cause::Capacity, true),
        "gpt2" | "capacity" => (Cause::Capacity, false),
        "frag_cap" | "fragmentation" => (Cause::Fragmentation, false),
        "optimizer" => (Cause::ProcessCap, false),
        "outside" => (Cause::OutsideAllocator, false),
        other => panic!("no expectation for {other}"),
    }
}

#[test]
fn real_default_snapshots_are_diagnosed_right() {
    let cases = real_cases();
    assert!(cases.len() >= 8, "{} cases", cases.len());
    for c in &cases {
        let (want, eval) = real_expected(&c.name);
        let text =
            std::fs::read_to_string(data(&format!("real_{}.message.txt", c.name))).expect("msg");
        let m = doctor::parse_message(&text).unwrap_or_else(|| panic!("{}: no message", c.name));
        let r = report(&format!("real_{}", c.name));
        for (what, d) in [
            ("message", doctor::diagnose(Some(&m), None)),
            ("message + snapshot", doctor::diagnose(Some(&m), Some(&r))),
        ] {
            let d = d.expect("diagnosis");
            assert_eq!(d.cause, want, "{} ({what}): {:?}", c.name, d.evidence);
            assert_eq!(d.validation_without_no_grad, eval, "{} ({what})", c.name);
            if eval {
                assert_eq!(d.remedies[0].title, "Run validation without autograd");
            }
        }
        // The snapshot alone: the evaluation hint only where evaluation ran.
        let d = doctor::diagnose(None, Some(&r)).expect("diagnosis");
        assert_eq!(d.validation_without_no_grad, eval, "{} (snapshot)", c.name);
        assert_eq!(r.eval_sites_at_peak.is_empty(), !eval, "{}", c.name);
    }
}

#[test]
fn real_default_snapshots_replay_exactly_and_name_python_sites() {
    for c in real_cases() {
        let r = report(&format!("real_{}", c.name));
        assert_eq!(r.peak_allocated_bytes.0, c.max_allocated, "{}", c.name);
        assert_eq!(r.peak_reserved_bytes.0, c.max_reserved, "{}", c.name);
        let bytes =
            std::fs::read(data(&format!("real_{}.snapshot.pickle", c.name))).expect("snapshot");
        let snap = doctor::read_snapshot(&bytes[..], &mut |_| true).expect("snapshot");
        let cpp = snap
            .frames
            .iter()
            .any(|f| f.name.contains("PyEval_EvalFrame"));
        assert_eq!(cpp, c.stacks == "all", "{}: C++ frames", c.name);
        for s in &r.top_sites {
            assert!(
                s.site.contains(".py:") || s.site.starts_with("(no Python frame"),
                "{}: {}",
                c.name,
                s.site
            );
        }
        // The largest site is the script's own code, past torch's and transformers' frames.
        assert!(
            r.top_sites[0].site.contains("oom_cases.py:"),
            "{}: {:?}",
            c.name,
            r.top_sites.iter().map(|s| &s.site).collect::<Vec<_>>()
        );
    }
}

#[test]
fn real_fragmentation_under_a_cap_puts_the_allocator_settings_first() {
    for name in ["all_frag_cap", "py_frag_cap"] {
        let v = doctor_json(&[
            "--message-file",
            &path(&format!("real_{name}.message.txt")),
            "--snapshot",
            &path(&format!("real_{name}.snapshot.pickle")),
        ]);
        assert_eq!(v["diagnosis"], "fragmentation", "{name}");
        let titles: Vec<&str> = v["remedies"]
            .as_array()
            .expect("remedies")
            .iter()
            .filter_map(|r| r["title"].as_str())
            .collect();
        assert_eq!(titles[0], "Use expandable segments", "{name}: {titles:?}");
        let cap = titles
            .iter()
            .position(|t| *t == "Raise the per-process cap")
            .expect("the cap follows");
        assert!(cap >= 2, "{name}: {titles:?}");
        assert_eq!(v["figures"]["largest_free_block_bytes"], 128u64 << 20);
    }
    // AdamW's state under a 6 GiB cap: the cap, and the failing frame is the optimizer's.
    let r = report("real_all_optimizer");
    let oom = r.ooms.last().expect("oom");
    assert!(
        oom.stack.iter().any(|f| f.name == "_init_group"),
        "{:?}",
        oom.stack
    );
}
