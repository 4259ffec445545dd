//! The recorded H200 bench runs in tests/data/bench/ (CI has no GPU): they parse, the
//! sweeps ended at an exact boundary, every trial gave its memory back, today's planner
//! is within its accuracy bound of every PyTorch trial, and the quoted efficiency figures
//! are what the files hold.

use vramlab_core::export::results::run_from_json;
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::Planner;
use vramlab_core::plan::timing::DeviceProfile;
use vramlab_core::record::{Outcome, Run};
use vramlab_core::units::Bytes;

fn load(name: &str) -> Run {
    let path = format!(
        "{}/../../tests/data/bench/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    run_from_json(&bytes).unwrap_or_else(|e| panic!("{path}: {e:#}"))
}

const RUNS: [&str; 11] = [
    "resnet50-native",
    "resnet50-torch",
    "vit_b_16-native",
    "vit_b_16-torch",
    "gpt2-native",
    "gpt2-torch",
    "gpt2-torch-primed",
    "gpt2xl-native",
    "gpt2xl-torch",
    "llama7b-native",
    "llama7b-torch",
];

#[test]
fn sweeps_end_at_an_exact_boundary() {
    for name in ["resnet50", "vit_b_16", "gpt2"] {
        for engine in ["native", "torch"] {
            let run = load(&format!("{name}-{engine}"));
            let max = run.max_batch_ran().expect("a batch ran");
            assert_eq!(run.first_oom(), Some(max + 1), "{name}-{engine}");
            assert!(
                run.trials.len() <= 16,
                "{name}-{engine}: {} trials",
                run.trials.len()
            );
        }
    }
}

#[test]
fn native_trials_give_their_memory_back_and_match_the_planned_segments() {
    for name in RUNS.iter().filter(|n| n.ends_with("native")) {
        let run = load(name);
        for t in &run.trials {
            assert_eq!(
                t.memory_returned(Bytes(8 << 20)),
                Some(true),
                "{name} b={}",
                t.batch
            );
        }
    }
    // Far from capacity the native engine holds exactly the planned reserved bytes.
    let run = load("llama7b-native");
    for t in &run.trials {
        let p = t.predicted.expect("prediction");
        assert_eq!(t.peak_reserved, Some(p.reserved), "b={}", t.batch);
    }
}

#[test]
fn todays_planner_is_within_the_accuracy_bound_of_every_pytorch_trial() {
    // Recomputed with the current planner (the files keep what was predicted then).
    for name in RUNS.iter().filter(|n| n.contains("torch")) {
        let run = load(name);
        let preset = find_builtin(&run.model).expect("preset");
        let planner = Planner::new(&preset, &run.config).expect("planner");
        for t in run.trials.iter().filter(|t| t.outcome.ran()) {
            let p = planner.peaks(t.batch).expect("peaks");
            let m = t.peak_allocated.expect("measured").0 as f64;
            let e = (p.allocated.0 as f64 - m) / m * 100.0;
            assert!(e.abs() <= 10.0, "{name} b={}: allocated {e:+.1} %", t.batch);
        }
    }
}

#[test]
fn quoted_native_efficiency_is_in_the_files() {
    let path = format!(
        "{}/../../tests/data/bench/profile-h200.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let profile: DeviceProfile =
        serde_json::from_slice(&std::fs::read(path).expect("profile")).expect("profile json");
    let run = load("llama7b-native");
    let best = run
        .trials
        .iter()
        .filter_map(|t| t.tflops)
        .fold(0.0f64, f64::max);
    let share = best / profile.bf16_tflops;
    assert!(
        share >= 0.6,
        "native Llama-2-7b bf16 step at {best:.0} TFLOP/s = {share:.2} of peak"
    );
}

#[test]
fn primed_pytorch_trials_return_to_baseline_even_after_an_oom() {
    let run = load("gpt2-torch-primed");
    assert!(
        run.trials
            .iter()
            .any(|t| matches!(t.outcome, Outcome::Oom { .. }))
    );
    for t in &run.trials {
        assert_eq!(
            t.memory_returned(Bytes(8 << 20)),
            Some(true),
            "b={}",
            t.batch
        );
    }
}

/// `vramlab bench --engine torch --gpus N --strategy …` on the H200 (session 10): FSDP2 ×2,
/// DDP ×4 and torch-zero1 ×4 as rank 0 emulated on one GPU, DDP ×1 under torchrun with NCCL,
/// and an FSDP2 ×2 sweep to the first OOM. Every trial says how its world ran and reports
/// rank 0; today's per-rank plan is within 2 % of every measured rank-0 peak.
#[test]
fn distributed_bench_runs_report_their_ranks_and_match_the_plan() {
    use vramlab_core::record::WorldMode;
    let cases = [
        ("gpt2-torch-fsdp2_w2", 2, WorldMode::Emulated),
        ("gpt2-torch-ddp_w1", 1, WorldMode::Torchrun),
        ("gpt2-torch-ddp_w4", 4, WorldMode::Emulated),
        ("gpt2-torch-zero1_w4", 4, WorldMode::Emulated),
        ("gpt2-torch-fsdp2_sweep", 2, WorldMode::Emulated),
    ];
    for (name, world, mode) in cases {
        let run = load(name);
        assert_eq!(run.config.distributed.world(), world, "{name}");
        let preset = find_builtin(&run.model).expect("preset");
        let planner = Planner::new(&preset, &run.config).expect("planner");
        let mut ran = 0;
        for t in &run.trials {
            let w = t
                .world
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: no world"));
            assert_eq!((w.size, w.mode), (world, mode), "{name}");
            assert!(
                t.ranks.iter().any(|r| r.rank == 0),
                "{name} b={}: rank 0 reported",
                t.batch
            );
            if !t.outcome.ran() {
                assert!(
                    t.ranks.iter().any(|r| r.oom),
                    "{name} b={}: an OOM rank",
                    t.batch
                );
                continue;
            }
            ran += 1;
            let p = planner.peaks(t.batch).expect("peaks");
            let m = t.peak_allocated.expect("measured").0 as f64;
            let e = (p.allocated.0 as f64 - m) / m * 100.0;
            assert!(e.abs() <= 2.0, "{name} b={}: allocated {e:+.2} %", t.batch);
        }
        assert!(ran > 0, "{name}: a trial ran");
    }
}

/// `vramlab bench --gpus N --strategy zero2|zero3` through `crates/device/runners/ds_runner.py` on the H200
/// (session 10, DeepSpeed 0.19.8): ZeRO-2 ×2 and ZeRO-3 ×4 as rank 0 emulated, ZeRO-2 ×1
/// under torchrun with NCCL. Each trial ran, says how its world ran and reports rank 0
/// (how close the DeepSpeed plans are is asserted over `distributed_deepspeed*.jsonl`).
#[test]
fn deepspeed_bench_runs_report_rank_0() {
    use vramlab_core::record::WorldMode;
    for (name, world, mode) in [
        ("gpt2-torch-zero2_w2", 2, WorldMode::Emulated),
        ("gpt2-torch-zero3_w4", 4, WorldMode::Emulated),
        ("gpt2-torch-zero2_w1_torchrun", 1, WorldMode::Torchrun),
    ] {
        let run = load(name);
        assert_eq!(run.config.distributed.world(), world, "{name}");
        assert!(!run.trials.is_empty(), "{name}");
        for t in &run.trials {
            assert!(t.outcome.ran(), "{name} b={}", t.batch);
            let w = t
                .world
                .as_ref()
                .unwrap_or_else(|| panic!("{name}: no world"));
            assert_eq!((w.size, w.mode), (world, mode), "{name}");
            let r0 = t.ranks.iter().find(|r| r.rank == 0).expect("rank 0");
            assert_eq!(
                r0.peak_allocated, t.peak_allocated,
                "{name}: headline is rank 0's"
            );
        }
    }
}
