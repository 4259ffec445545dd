//! DeepSpeed ZeRO-1/2/3 per rank (`tools/ds_runner.py`, DeepSpeed 0.19.8, H200, torch 2.11):
//! rank 0 of an emulated world (PyTorch's fake process group), each phase of the step.

use vramlab_core::model::preset::{Preset, find_builtin};
use vramlab_core::plan::Planner;
use vramlab_core::plan::allocator::round_size;
use vramlab_core::plan::events::Phase;
use vramlab_core::validate::{Measured, parse_lines};

/// Planned allocated bytes at the phases the runner records.
#[derive(Debug, Default, Clone, Copy)]
struct Phases {
    after_init: u64,
    start: u64,
    after_forward: u64,
    peak_after_forward: u64,
    after_backward: u64,
    peak_after_backward: u64,
    peak: u64,
}

fn phases(planner: &Planner, batch: u64) -> Phases {
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
        let text =
            std::fs::read_to_string(crate::data("../..").join(&m.model)).expect("model file");
        let stem = std::path::Path::new(&m.model)
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("");
        vramlab_core::model::hf::from_text_if_hf(&text, stem)
            .expect("hf")
            .expect("hf")
    } else {
        find_builtin(&m.model).expect("preset")
    }
}

#[test]
fn deepspeed_phases_print() {
    let text = std::fs::read_to_string(crate::data("distributed_deepspeed.jsonl")).expect("rows");
    let raw: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let rows = parse_lines(&text);
    let g = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or(0) as f64 / 1e6;
    for (m, v) in rows.iter().zip(&raw) {
        let cfg = m.config().expect("config");
        let planner = Planner::new(&model(m), &cfg).expect("planner");
        let p = phases(&planner, cfg.batch);
        let peaks = planner.peaks(cfg.batch).expect("peaks");
        println!("{} {}", v["index"], m.describe());
        let f = |x: u64| x as f64 / 1e6;
        for (name, key, pl) in [
            ("init", "allocated_after_init", p.after_init),
            ("start", "allocated_start", p.start),
            ("fwd", "allocated_after_forward", p.after_forward),
            ("pk_fwd", "peak_after_forward", p.peak_after_forward),
            ("bwd", "allocated_after_backward", p.after_backward),
            ("pk_bwd", "peak_after_backward", p.peak_after_backward),
            ("peak", "peak_allocated", p.peak),
            ("res", "peak_reserved", peaks.reserved.0),
        ] {
            let meas = g(v, key);
            print!("  {name} {:.1}/{:.1} ({:+.1})", f(pl), meas, f(pl) - meas);
        }
        println!();
    }
}
