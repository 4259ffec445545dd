//! Inference trials (issue 29: `vramlab bench --engine torch --step generate|prefill`, the
//! Run tab in Inference mode). The shipped `infer_runner.py serve` measures
//! `model.generate()` or a plain forward under `torch.no_grad()` exactly as the lab measured
//! `tests/data/infer/` (it is the lab's runner): the model built from its config with random
//! weights in the target dtype (or saved and loaded with a `quantization_config` or
//! `device_map="auto"`), a warm-up call, then `max_memory_allocated` / `max_memory_reserved`
//! of one call. Each trial runs in a fresh runner process, as the lab ran one process per
//! row; the core's [`InferPlanner`] predicts every trial.

use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result};
use serde_json::json;

use super::engine::{Control, cancelled_trial};
use super::request::BenchRequest;
pub use super::request::InferBench;
use super::torch::TorchEngine;
use super::trials::{guarded_trial, new_run, runner_env, sweep_trials};
use vramlab_core::model::Preset;
use vramlab_core::plan::inference::InferStep;
use vramlab_core::plan::inference::quant::Int8Outliers;
use vramlab_core::plan::inference::setting::dtype_name;
use vramlab_core::plan::search::Budget;
use vramlab_core::record::{
    BenchEvent, DeviceInfo, EngineKind, InferRun, Outcome, Predicted, Run, Trial,
};
use vramlab_core::sweep::BatchPlan;

/// The runner shipped for inference (with its siblings: [`super::runners`]).
pub const RUNNER: &str = super::runners::INFER_RUNNER;

/// Why `engine` cannot measure `bench` as planned (a message naming the flag), if it
/// cannot: the native engine replays training steps only; inference is planned on one
/// GPU; LLM.int8 weights are measured random-init (their outlier columns planned so).
pub fn check(engine: EngineKind, req: &BenchRequest, bench: &InferBench) -> Result<(), String> {
    if engine != EngineKind::Torch {
        return Err(format!(
            "--engine {}: the native engine replays training steps; an inference call \
             (--step {}) runs with --engine torch (the shipped infer_runner.py, in your PyTorch \
             and transformers)",
            engine.as_str(),
            bench.planner.config.step
        ));
    }
    if req.config.distributed.active() {
        return Err(
            "--gpus / --strategy: inference is planned and measured on one GPU".to_string(),
        );
    }
    if let Some(q) = &bench.planner.quant
        && !q.quant.quant.is_4bit()
        && q.outliers == Int8Outliers::None
    {
        return Err(
            "--int8-outliers none: the PyTorch engine measures random-init weights, whose \
             LLM.int8 outlier columns a trained checkpoint does not have; bench it with \
             --int8-outliers random-init (the default of `vramlab bench`)"
                .to_string(),
        );
    }
    Ok(())
}

/// The runner's config line for `bench` at `batch` (the lab's row keys: see the docstring
/// of `crates/device/runners/infer_runner.py`).
pub fn config_line(preset: &Preset, bench: &InferBench, batch: u64) -> Result<String> {
    let p = &bench.planner;
    let c = &p.config;
    let preset_json = serde_json::to_value(preset).context("serialising the preset")?;
    let mut row = json!({
        "id": format!("bench-b{batch}"),
        "model": preset_json,
        "model_id": preset.id,
        "step": c.step.as_str(),
        "batch": batch,
        "prompt": c.prompt,
        "precision": dtype_name(c.dtype),
        "attention": c.attention.as_str(),
    });
    if c.step == InferStep::Generate {
        row["new_tokens"] = json!(c.new_tokens);
        row["kv_cache"] = json!(c.kv_cache.as_str());
        let d = &p.decoding;
        if d.do_sample {
            row["do_sample"] = json!(true);
            row["temperature"] = json!(d.temperature);
            row["top_k"] = json!(d.top_k);
            row["top_p"] = json!(d.top_p);
        }
        if d.num_beams > 1 {
            row["num_beams"] = json!(d.num_beams);
        }
    }
    if let Some(q) = &p.quant {
        row["quant"] = json!(q.quant.quant.as_str());
        if q.quant.quant.is_4bit() {
            row["double_quant"] = json!(q.quant.double_quant);
        }
    }
    if let Some(pl) = &p.placement {
        row["device_map"] = json!("auto");
        // accelerate reads byte counts as they are
        row["max_gpu_memory"] = json!(pl.offload.max_gpu_memory_bytes);
        if let Some(cpu) = pl.offload.max_cpu_memory_bytes {
            row["max_cpu_memory"] = json!(cpu);
        }
        if pl
            .offload
            .quantizer
            .is_some_and(|q| q.llm_int8_enable_fp32_cpu_offload)
        {
            row["fp32_cpu_offload"] = json!(true);
        }
    }
    if let Some(cfg) = &bench.hf_config {
        row["hf_config"] = cfg.clone();
    }
    Ok(row.to_string())
}

/// One inference trial to run.
pub struct InferJob<'a> {
    pub preset: &'a Preset,
    pub bench: &'a InferBench,
    pub index: u32,
    pub batch: u64,
}

/// An engine that measures inference calls (the PyTorch engine through
/// `infer_runner.py`; tests script one).
pub trait InferEngine {
    fn device(&self) -> DeviceInfo;

    /// Measures the warm-up-then-measured call of `job` at `job.batch`; OOM and errors are
    /// outcomes.
    fn trial(&mut self, job: &InferJob<'_>, ctl: &mut Control<'_>) -> Trial;
}

impl InferEngine for TorchEngine {
    fn device(&self) -> DeviceInfo {
        super::engine::Engine::device(self)
    }

    fn trial(&mut self, job: &InferJob<'_>, ctl: &mut Control<'_>) -> Trial {
        let (index, batch) = (job.index, job.batch);
        let fail = |message: String| Trial::failed(index, batch, Outcome::Error { message });
        if ctl.cancelled() {
            return cancelled_trial(index, batch);
        }
        if self.used || !self.alive() {
            // A fresh process, as the lab measured one process per row: the cuBLAS
            // workspace and the pool's segments are the trial's own.
            ctl.progress(index, batch, "PyTorch: starting a fresh runner", 0.02);
            if let Err(e) = self.restart() {
                return fail(format!("restarting the PyTorch runner: {e:#}"));
            }
        }
        let line = match config_line(job.preset, job.bench, batch) {
            Ok(l) => l,
            Err(e) => return fail(format!("{e:#}")),
        };
        let phase = format!(
            "PyTorch: building the model, warm-up and measured {}",
            job.bench.planner.config.step
        );
        let mut t = self.exchange(index, batch, &line, &phase, ctl);
        // the process ends with the trial: there is no baseline for the next to return to
        t.baseline_before = None;
        t.baseline_after = None;
        t
    }
}

/// Starts `infer_runner.py serve` for `req` (a clear error without Python, PyTorch or a
/// CUDA GPU).
pub fn open(req: &BenchRequest, bench: &InferBench) -> Result<TorchEngine> {
    check(req.engine, req, bench).map_err(anyhow::Error::msg)?;
    let env = runner_env(req, bench.planner.config.allocator);
    TorchEngine::open_runner(
        req.python.clone(),
        req.device_index,
        &env,
        "infer_runner.py",
    )
}

/// The predicted peaks of `bench` at `batch`, as a trial records them.
pub fn predicted(bench: &InferBench, batch: u64) -> Option<Predicted> {
    bench.planner.peaks(batch).ok().map(Predicted::from)
}

/// Runs every trial of `req` (its batch list, or a sweep until OOM seeded from the
/// planner's max batch on the engine's device) on `engine`; returns the run record (also
/// sent as [`BenchEvent::Finished`]).
pub fn run_with(
    req: &BenchRequest,
    bench: &InferBench,
    engine: &mut dyn InferEngine,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(BenchEvent),
) -> Result<Run> {
    let device = engine.device();
    emit(BenchEvent::Started {
        engine: req.engine,
        device: device.clone(),
        planned: req.batches.planned(),
    });
    let mut run = new_run(req, device, bench.planner.config.prompt);
    run.config.allocator = bench.planner.config.allocator;
    run.inference = Some(Box::new(InferRun::of(&bench.planner)));
    let mut batches = req.batches.clone();
    if let BatchPlan::UntilOom { seed: 0, limit } = batches {
        let budget = Budget {
            capacity: run.device.total_bytes,
            margin: 0.0,
        };
        let seed = bench.planner.max_batch(budget, limit)?.unwrap_or(1);
        run.predicted_max_batch = Some(seed);
        batches = BatchPlan::UntilOom { seed, limit };
    }
    let mut trial = |index: u32, batch: u64, ctl: &mut Control<'_>| {
        let job = InferJob {
            preset: &req.preset,
            bench,
            index,
            batch,
        };
        guarded_trial(index, batch, ctl, |ctl| engine.trial(&job, ctl))
    };
    let predict = |batch: u64| predicted(bench, batch);
    sweep_trials(batches, &mut run, cancel, emit, &mut trial, &predict);
    emit(BenchEvent::Finished { run: run.clone() });
    Ok(run)
}

/// Opens the PyTorch engine and runs; a failure to start is reported as
/// [`BenchEvent::Failed`] and returned.
pub fn run_blocking(
    req: &BenchRequest,
    bench: &InferBench,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(BenchEvent),
) -> Result<Run> {
    let result =
        open(req, bench).and_then(|mut engine| run_with(req, bench, &mut engine, cancel, emit));
    if let Err(e) = &result {
        emit(BenchEvent::Failed {
            message: format!("{e:#}"),
        });
    }
    result
}

#[cfg(test)]
mod tests;
