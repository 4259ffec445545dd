//! DeepSpeed ZeRO-1/2/3 per rank (`crates/device/runners/ds_runner.py`, DeepSpeed 0.19.8, H200, torch 2.11):
//! rank 0 of an emulated world (PyTorch's fake process group), each phase of the step.

use vramlab_core::model::preset::{Preset, find_builtin};
use vramlab_core::plan::Planner;
use vramlab_core::plan::allocator::round_size;
use vramlab_core::plan::events::Phase;
use vramlab_core::validate::{Measured, compare, max_abs, median_abs, model_file, parse_lines};

/// Planned allocated bytes at the phases the runner records.
#[derive(Debug, Default, Clone, Copy)]
pub struct Phases {
    pub after_init: u64,
    pub start: u64,
    pub after_forward: u64,
    pub peak_after_forward: u64,
    pub after_backward: u64,
    pub peak_after_backward: u64,
    pub peak: u64,
}

pub fn phases(planner: &Planner, batch: u64) -> Phases {
    let ev = &planner.events;
    let size = |b: u32| {
        let buf = &ev.buffers[b as usize];
        round_size(buf.per_sample * batch + buf.fixed)
    };
    let mut cur = 0u64;
    let mut out = Phases::default();
    let mut init_done = false;
    let last_micro = ev.events[ev.measured_start..]
        .iter()
        .map(|e| e.micro)
        .max()
        .unwrap_or(0);
    let mut prev: Option<(Phase, u16)> = None;
    let mut peak = 0u64;
    for (i, e) in ev.events.iter().enumerate() {
        if !init_done && e.phase != Phase::Setup {
            out.after_init = cur;
            init_done = true;
        }
        if i == ev.measured_start {
            out.start = cur;
            peak = cur;
        }
        if i >= ev.measured_start {
            let now = (e.phase, e.micro);
            if prev == Some((Phase::Forward, last_micro)) && now != (Phase::Forward, last_micro) {
                out.after_forward = cur;
                out.peak_after_forward = peak;
            }
            if prev == Some((Phase::Backward, last_micro)) && now != (Phase::Backward, last_micro) {
                out.after_backward = cur;
                out.peak_after_backward = peak;
            }
            prev = Some(now);
        }
        if e.alloc {
            cur += size(e.buffer);
        } else {
            cur -= size(e.buffer);
        }
        if i >= ev.measured_start {
            peak = peak.max(cur);
        }
    }
    if prev == Some((Phase::Backward, last_micro)) {
        out.after_backward = cur;
        out.peak_after_backward = peak;
    }
    out.peak = peak;
    out
}

fn model(m: &Measured) -> Preset {
    if m.model.ends_with(".json") {
        let path = crate::data("../..").join(&m.model);
        model_file(path.to_str().expect("utf-8 path")).expect("model file")
    } else {
        find_builtin(&m.model).expect("preset")
    }
}

/// The measured rows with their raw JSON (phase numbers), models resolved from the
/// repository root.
fn measured() -> Vec<(Measured, serde_json::Value)> {
    rows_of("distributed_deepspeed.jsonl")
}

/// The rows of `file` (under `tests/data`) with their raw JSON.
fn rows_of(file: &str) -> Vec<(Measured, serde_json::Value)> {
    let text = std::fs::read_to_string(crate::data(file)).expect("rows");
    let raw: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let rows = parse_lines(&text);
    assert_eq!(rows.len(), raw.len());
    rows.into_iter().zip(raw).collect()
}

/// Each phase the runner records, planned and measured (`after_init`: after
/// `deepspeed.initialize`, the model states; `start`: the measured step's start, with the
/// optimizer state; after forward / backward and their peaks): every row within 0.75 % of
/// its measured step peak, phase by phase (most within 0.1 %; the backward peak of fp32
/// GPT-2 ZeRO-2 with checkpointing is 31 MB, 0.7 %, under), but two, left as measured:
/// - fp32 ZeRO-3 (row 7) holds one more partition-sized fp32 buffer (62 MB, −1.0 %) from
///   `deepspeed.initialize` on, although `_create_fp32_partitions` (stage3.py:1162-1167)
///   shares the fp32 "fp16" partition as the master copy instead of cloning it;
/// - GPT-2 ZeRO-3 with `stage3_max_live_parameters` 1e7 and reuse distance 0 (row 9): the
///   measured backward peak is one bf16 `wte` (77 MB, −1.2 %) above the plan, whose peak
///   comes before the LM head's pre-backward gathers it again.
#[test]
fn deepspeed_phases_within_three_quarters_of_a_percent() {
    let mut worst = 0.0f64;
    for (m, v) in measured() {
        let fp32_zero3 = m.precision == "fp32" && m.strategy.as_deref() == Some("zero3");
        let reuse0 = m.stage3_max_reuse_distance == Some(0);
        let known = fp32_zero3 || reuse0;
        let limit = if known { 0.0125 } else { 0.0075 };
        let err = phase_errors(&m, &v, limit);
        if !known {
            worst = worst.max(err);
        }
    }
    println!("worst phase error {:.2} % of the peak", 100.0 * worst);
}

/// Each phase's planned − measured allocated bytes, in parts of the measured step peak,
/// printed; asserts each within `limit`; returns the largest.
fn phase_errors(m: &Measured, v: &serde_json::Value, limit: f64) -> f64 {
    let cfg = m.config().expect("config");
    let planner = Planner::new(&model(m), &cfg).expect("planner");
    let p = phases(&planner, cfg.batch);
    let peak = v["peak_allocated"].as_u64().expect("peak_allocated") as f64;
    let mut line = format!("{} {}", v["index"], m.describe());
    let mut worst = 0.0f64;
    let mut fails = Vec::new();
    for (name, key, planned) in [
        ("init", "allocated_after_init", p.after_init),
        ("start", "allocated_start", p.start),
        ("fwd", "allocated_after_forward", p.after_forward),
        ("pk_fwd", "peak_after_forward", p.peak_after_forward),
        ("bwd", "allocated_after_backward", p.after_backward),
        ("pk_bwd", "peak_after_backward", p.peak_after_backward),
        ("peak", "peak_allocated", p.peak),
    ] {
        let meas = v[key].as_u64().unwrap_or_else(|| panic!("{key}")) as f64;
        let err = (planned as f64 - meas) / peak;
        line.push_str(&format!("  {name} {:+.2} %", 100.0 * err));
        if err.abs() > limit {
            fails.push(format!("{name} planned {planned}, measured {meas}"));
        }
        worst = worst.max(err.abs());
    }
    println!("{line}");
    assert!(fails.is_empty(), "{line}: {fails:?}");
    worst
}

/// The once held-out rows phase by phase (see `deepspeed_held_out_rows`): every phase
/// within 0.35 % of the row's peak but fp32 Llama-3.2-1B (4 layers) ZeRO-2 ×2 (row 4), whose
/// backward peak is 1.8 % (216 MiB) under, not explained.
#[test]
fn deepspeed_held_out_phases() {
    let mut worst = 0.0f64;
    for (m, v) in rows_of("distributed_deepspeed_holdout.jsonl") {
        let index = v["index"].as_u64().unwrap_or(0);
        let limit = if index == 4 { 0.02 } else { 0.0035 };
        worst = worst.max(phase_errors(&m, &v, limit));
    }
    println!("worst phase error {:.2} % of the peak", 100.0 * worst);
}

/// DeepSpeed ZeRO-1/2/3 per rank (`crates/device/runners/ds_runner.py`: DeepSpeed 0.19.8, torch 2.11,
/// transformers 5.17, H200), rank 0 of an emulated world of 2, 4 or 8 (PyTorch's fake
/// process group): GPT-2 (12 layers, medium), Llama-3.2-1B (4 layers), TinyLlama; fp32 and
/// bf16, checkpointing, accumulation, CPU optimizer offload, smaller reduce buckets,
/// `overlap_comm`, ZeRO-3 prefetch off and a small `stage3_max_live_parameters`. Achieved:
/// allocated median 0.05 %, worst 1.16 %; reserved median 1.25 % (the targets:
/// allocated median ≤ 3 %, worst ≤ 10 %, reserved median ≤ 5 %). Bounds: the achieved
/// numbers with a small margin.
#[test]
fn deepspeed_per_rank_within_targets() {
    std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
    let all = measured();
    let ms: Vec<Measured> = all.iter().map(|(m, _)| m.clone()).collect();
    let rows = compare(&ms).expect("every row plans");
    assert_eq!(rows.len(), 17);
    for r in &rows {
        println!(
            "{:<52} {:<44} alloc {:+6.2} %  reserved {:+6.2} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    for needle in [
        "zero1×2", "zero1×8", "zero2×4", "zero2×8", "zero3×2", "zero3×4", "zero3×8", " fp32 ",
        " ckpt ", "accum2",
    ] {
        assert!(
            rows.iter().any(|r| r.config.contains(needle)),
            "no {needle} row"
        );
    }
    assert!(ms.iter().any(|m| m.offload.is_some()), "no offload row");
    let alloc_median = median_abs(rows.iter().map(|r| r.allocated_error()));
    let alloc_worst = max_abs(rows.iter().map(|r| r.allocated_error()));
    let reserved_median = median_abs(rows.iter().map(|r| r.reserved_error()));
    println!(
        "allocated median {alloc_median:.2} % worst {alloc_worst:.2} %, reserved median {reserved_median:.2} %"
    );
    assert!(alloc_median <= 0.3, "allocated median {alloc_median:.2} %");
    assert!(alloc_worst <= 2.0, "allocated worst {alloc_worst:.2} %");
    assert!(
        reserved_median <= 4.5,
        "reserved median {reserved_median:.2} %"
    );
}

/// Twelve DeepSpeed rows measured before the plans above were written and never shown to
/// their author (`tests/data/distributed_deepspeed_holdout.jsonl`: Qwen2.5-0.5B, Qwen3-0.6B,
/// GPT-2 medium, Llama-3.2-1B, TinyLlama; ZeRO-1/2/3 ×2-8; fp32 / bf16; accumulation,
/// optimizer offload, `overlap_comm`, `contiguous_gradients` off, a smaller prefetch
/// bucket). First result: allocated median 0.20 %, reserved median 3.4 %, two rows beyond
/// 10 % (ZeRO-1 ×2 with accumulation 2: −13.4 %; TinyLlama ZeRO-2 ×8 with checkpointing:
/// −11.3 % at the backward peak). These two rows were then used to find two fixes, so the
/// file is no longer held out: stage 1 keeps its IPG buffer and every `.grad` between
/// micro-steps (the engine runs its epilogue only at the accumulation boundary), and each
/// reduced stage 1/2 bucket is flattened into a transient copy (`allreduce_bucket`); a
/// third fix came with them, the partition's gradients freed at the step (`averaged_gradients`
/// was kept past it without `contiguous_gradients`: +2.7 % on row 10). Now: allocated
/// median 0.09 %, worst 1.80 %; reserved median 1.70 %. Bounds: those numbers with a
/// small margin.
#[test]
fn deepspeed_held_out_rows() {
    std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
    let text =
        std::fs::read_to_string(crate::data("distributed_deepspeed_holdout.jsonl")).expect("rows");
    let rows = compare(&parse_lines(&text)).expect("every row plans");
    assert_eq!(rows.len(), 12);
    for r in &rows {
        println!(
            "{:<52} {:<44} alloc {:+6.2} %  reserved {:+6.2} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    let alloc_median = median_abs(rows.iter().map(|r| r.allocated_error()));
    let alloc_worst = max_abs(rows.iter().map(|r| r.allocated_error()));
    let reserved_median = median_abs(rows.iter().map(|r| r.reserved_error()));
    println!(
        "allocated median {alloc_median:.2} % worst {alloc_worst:.2} %, reserved median {reserved_median:.2} %"
    );
    assert!(alloc_median <= 0.2, "allocated median {alloc_median:.2} %");
    assert!(alloc_worst <= 2.0, "allocated worst {alloc_worst:.2} %");
    assert!(
        reserved_median <= 2.5,
        "reserved median {reserved_median:.2} %"
    );
}
