//! `vramlab bench-plan`: times the planner itself. Every cold-plan repetition builds the
//! graph, generates the events and evaluates the full plan, as `vramlab plan` does.

use std::io::Write;
use std::time::Instant;

use anyhow::Result;

use vramlab_core::model::Preset;
use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::plan::config::MAX_BATCH;
use vramlab_core::plan::gpus;
use vramlab_core::plan::search::{Budget, max_batch, sweep_allocated};
use vramlab_core::plan::{Planner, TrainConfig};

/// Milliseconds of repeated runs: min, median, 90th percentile, mean.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Stats {
    pub min: f64,
    pub median: f64,
    pub p90: f64,
    pub mean: f64,
}

impl Stats {
    fn of(mut ms: Vec<f64>) -> Stats {
        ms.sort_by(f64::total_cmp);
        let n = ms.len().max(1);
        let at = |q: f64| ms.get(((n - 1) as f64 * q).round() as usize).copied();
        Stats {
            min: at(0.0).unwrap_or(0.0),
            median: at(0.5).unwrap_or(0.0),
            p90: at(0.9).unwrap_or(0.0),
            mean: ms.iter().sum::<f64>() / n as f64,
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "median {:.3} ms (min {:.3}, p90 {:.3}, mean {:.3})",
            self.median, self.min, self.p90, self.mean
        )
    }
}

/// Times `reps` runs of `f` one by one.
fn time<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<Stats> {
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(f()?);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Stats::of(ms))
}

/// Runs the benchmark on `preset` and writes a report (or one JSON object).
pub fn run(
    preset: &Preset,
    sweep_to: u64,
    reps: usize,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    let cfg = TrainConfig::default();
    let gpu = vramlab_words::find_gpu("h200")?;
    let budget = Budget {
        capacity: gpu.memory(),
        margin: 0.05,
    };
    let reps = reps.max(1);
    // Cold plan: graph + events + evaluation, nothing kept between repetitions.
    let plan = time(reps, || Ok(Planner::new(preset, &cfg)?.plan(cfg.batch)?))?;
    let graph = time(reps, || {
        Ok(preset.build(preset.default_size(), AttnImpl::Sdpa)?)
    })?;
    let prepare = time(reps, || Ok(Planner::new(preset, &cfg)?))?;
    let planner = Planner::new(preset, &cfg)?;
    let evaluate = time(reps, || Ok(planner.peaks(cfg.batch)?))?;
    let mut points = 0;
    let mut max = None;
    let sweep = time(reps.div_ceil(10), || {
        points = sweep_allocated(&planner, 1..=sweep_to).len();
        max = max_batch(&planner, budget, MAX_BATCH)?;
        Ok(())
    })?;
    let events = planner.events.events.len();
    if json {
        writeln!(
            out,
            "{}",
            serde_json::json!({"model": preset.id, "reps": reps, "events": events,
                "plan_ms": plan, "graph_ms": graph, "graph_and_events_ms": prepare,
                "evaluate_ms": evaluate, "sweep_points": points,
                "sweep_and_max_batch_ms": sweep, "max_batch": max})
        )?;
        return Ok(());
    }
    let max = max.map_or("none".to_string(), |m| m.to_string());
    writeln!(
        out,
        "{}: {events} events per plan, {reps} repetitions",
        preset.id
    )?;
    writeln!(out, "  cold plan (graph + events + evaluation): {plan}")?;
    writeln!(out, "    graph:                                 {graph}")?;
    writeln!(out, "    graph + events:                        {prepare}")?;
    writeln!(out, "  one evaluation with the allocator model: {evaluate}")?;
    writeln!(
        out,
        "  sweep of peak allocated 1..={sweep_to} ({points} points) + max-batch on the H200 ({max}): {sweep}"
    )?;
    Ok(())
}

/// `vramlab bench-fit`: times the make-it-fit search (`plan::fit`) for one model, sequence
/// length or image side, micro-batch × accumulation and GPU.
pub fn run_fit(
    preset: &Preset,
    cfg: &TrainConfig,
    gpu: &gpus::Gpu,
    reps: usize,
    json: bool,
    out: &mut dyn Write,
) -> Result<()> {
    use vramlab_core::plan::fit::{FitRequest, fit};
    let req = FitRequest::for_gpu(gpu, 0.05);
    let reps = reps.max(1);
    let mut last = None;
    let stats = time(reps, || {
        last = Some(fit(preset, cfg, &req)?);
        Ok(())
    })?;
    let Some(r) = last else {
        return Ok(());
    };
    if json {
        writeln!(
            out,
            "{}",
            serde_json::json!({"model": preset.id, "gpu": gpu.id, "size": cfg.size,
                "batch": cfg.batch, "accum": cfg.accum, "reps": reps, "fit_ms": stats,
                "combinations": r.combinations, "planned": r.planned,
                "pruned_dead": r.pruned_dead, "dominated": r.dominated,
                "candidates": r.candidates.len()})
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "{} (size {}) batch {} × accum {} on {}: {} combinations, {} planned, {} pruned, {} dominated, {} fit",
        preset.id,
        cfg.size.unwrap_or_else(|| preset.default_size()),
        cfg.batch,
        cfg.accum,
        gpu.name,
        r.combinations,
        r.planned,
        r.pruned_dead,
        r.dominated,
        r.candidates.len()
    )?;
    writeln!(out, "  fit search ({reps} repetitions): {stats}")?;
    Ok(())
}
