//! The headless command line: the same capabilities as the GUI, with `--json`.

mod args;
#[cfg(feature = "app")]
mod bench;
pub mod capture;
mod dist_args;
mod dist_plan;
pub mod doctor;
mod exit;
mod fit;
mod plan_bench;
mod plan_text;

use std::io::Write;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use args::{Resolved, resolve};
pub use args::{TrainArgs, load_model, resolve_model};
pub use exit::{EXIT_NOTHING_FITS, Exit, is_broken_pipe};

use vramlab_core::answer::PlanReport;
use vramlab_core::answer::report::PlanRequest;
use vramlab_core::model::preset::builtin_presets;
use vramlab_core::plan::Planner;
use vramlab_core::plan::config::{MAX_ACCUM, MAX_BATCH};
use vramlab_core::plan::gpus::{self, Gpu};
use vramlab_core::plan::search::{Budget, accumulation_for, max_batch};
use vramlab_core::units::Bytes;

/// vramlab — will this training run fit on my GPU, and with which batch size?
#[derive(Debug, Parser)]
#[command(name = "vramlab", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Predict the peak memory of one training step.
    Plan(PlanArgs),
    /// Write the plan as a vramlab config or a framework config.
    Export(ExportArgs),
    /// Find the largest micro-batch that fits a GPU.
    MaxBatch(MaxBatchArgs),
    /// Search combinations of remedies that make the configuration fit a GPU, ranked by
    /// predicted time per sample.
    Fit(fit::FitArgs),
    /// List model presets and GPUs.
    Presets {
        #[arg(long)]
        json: bool,
    },
    /// Compare the planner with measured runs (JSON lines from tools/torch_runner.py).
    Validate {
        /// Measurement files.
        files: Vec<std::path::PathBuf>,
        /// Print a markdown table.
        #[arg(long)]
        markdown: bool,
    },
    /// Run the configuration on the GPU and compare with the prediction.
    #[cfg(feature = "app")]
    Bench(bench::BenchArgs),
    /// Explain a "CUDA out of memory" error or a memory snapshot, and what to change.
    Doctor(doctor::DoctorArgs),
    /// List the GPUs NVML sees.
    #[cfg(feature = "app")]
    Gpus {
        #[arg(long)]
        json: bool,
    },
    /// Measure the GPU: GEMM TFLOP/s per dtype, bandwidth, usable memory.
    #[cfg(feature = "app")]
    Profile {
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
        #[arg(long)]
        json: bool,
    },
    /// Record one training step of any PyTorch model on fake tensors (a graph file for --model).
    Capture(capture::CaptureArgs),
    /// Time the planner itself (planning speed benchmark).
    BenchPlan {
        #[arg(long, default_value = "Llama-2-7b-hf")]
        model: String,
        #[arg(long, default_value_t = 1024)]
        sweep_to: u64,
        /// Timed repetitions of each measurement (the sweep runs a tenth as often).
        #[arg(long, default_value_t = 200)]
        reps: usize,
        #[arg(long)]
        json: bool,
    },
    /// Time the make-it-fit search (`vramlab fit`) itself.
    BenchFit {
        #[arg(long, default_value = "Meta-Llama-3-8B")]
        model: String,
        /// Sequence length or image side [default: the preset's].
        #[arg(long)]
        size: Option<u64>,
        #[arg(long, default_value_t = 4)]
        batch: u64,
        #[arg(long, default_value_t = 4)]
        accum: u64,
        #[arg(long, default_value = "rtx-4090")]
        gpu: String,
        #[arg(long, default_value_t = 5)]
        reps: usize,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// Micro-batch size: samples per forward/backward pass, at least 1 (required unless
    /// --config gives it).
    #[arg(long, required_unless_present = "config", allow_negative_numbers = true,
          value_parser = args::parse_batch)]
    pub batch: Option<u64>,
    /// Include the allocated-bytes timeline of the step in the JSON output.
    #[arg(long)]
    pub timeline: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// Micro-batch size: samples per forward/backward pass, at least 1 (required unless
    /// --config gives it).
    #[arg(long, required_unless_present = "config", allow_negative_numbers = true,
          value_parser = args::parse_batch)]
    pub batch: Option<u64>,
    /// vramlab, deepspeed, hf, lightning, pytorch, env or peft (LoraConfig, QLoRA's
    /// BitsAndBytesConfig, SFTConfig); with --gpus: accelerate, torchrun or fsdp2.
    #[arg(long)]
    pub format: String,
    /// Write to this file (atomically) instead of standard output.
    #[arg(short, long)]
    pub output: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct MaxBatchArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// Effective batch to reach with accumulation (prints the steps needed).
    #[arg(long)]
    pub target_batch: Option<u64>,
}

/// Runs a subcommand; output goes to `out`.
pub fn run(cmd: Command, out: &mut dyn Write) -> Result<()> {
    match cmd {
        Command::Plan(a) => cmd_plan(a, out),
        Command::Doctor(a) => doctor::cmd_doctor(a, out),
        Command::Capture(a) => capture::cmd_capture(a, out),
        #[cfg(feature = "app")]
        Command::Bench(a) => bench::cmd_bench(a, out),
        #[cfg(feature = "app")]
        Command::Gpus { json } => bench::cmd_gpus(json, out),
        #[cfg(feature = "app")]
        Command::Profile { device, json } => bench::cmd_profile(device, json, out),
        Command::Export(a) => cmd_export(a, out),
        Command::MaxBatch(a) => cmd_max_batch(a, out),
        Command::Fit(a) => fit::cmd_fit(a, out),
        Command::Presets { json } => cmd_presets(json, out),
        Command::Validate { files, markdown } => cmd_validate(&files, markdown, out),
        Command::BenchPlan {
            model,
            sweep_to,
            reps,
            json,
        } => plan_bench::run(&load_model(&model)?, sweep_to, reps, json, out),
        Command::BenchFit {
            model,
            size,
            batch,
            accum,
            gpu,
            reps,
            json,
        } => {
            let cfg = vramlab_core::plan::TrainConfig {
                batch,
                accum,
                size,
                ..Default::default()
            };
            plan_bench::run_fit(
                &load_model(&model)?,
                &cfg,
                &gpus::find(&gpu)?,
                reps,
                json,
                out,
            )
        }
    }
}

fn cmd_plan(a: PlanArgs, out: &mut dyn Write) -> Result<()> {
    let Resolved {
        preset,
        config: cfg,
        gpu,
        budget,
        ..
    } = resolve(&a.train, a.batch)?;
    let cfg = dist_plan::resolve_auto(&a.train.dist, &preset, cfg, budget)?;
    let report = PlanReport::new(PlanRequest {
        preset: &preset,
        config: cfg,
        gpu,
        budget,
        assumed: a.train.assumed(),
        fit_command: fit::command_for(&a.train, a.batch),
        search_next_step: !a.train.json,
        timeline_in_json: a.timeline,
    })?;
    if a.train.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    plan_text::write(out, &report)
}

fn cmd_max_batch(a: MaxBatchArgs, out: &mut dyn Write) -> Result<()> {
    let Resolved {
        preset,
        config: cfg,
        gpu,
        budget,
        ..
    } = resolve(&a.train, Some(1))?;
    // `--gpus auto`: the fewest GPUs where micro-batch 1 fits.
    let cfg = dist_plan::resolve_auto(&a.train.dist, &preset, cfg, budget)?;
    for w in vramlab_core::answer::warnings::for_config(&cfg, &gpu) {
        eprintln!("warning: {w}");
    }
    let planner = Planner::new(&preset, &cfg)?;
    let max = max_batch(&planner, budget, MAX_BATCH)?;
    if max.is_none() {
        return nothing_fits(&a, &planner, &preset.id, &gpu, budget, out);
    }
    if a.target_batch == Some(0) {
        bail!("--target-batch: must be at least 1");
    }
    let accum = match (a.target_batch, max) {
        (Some(t), Some(m)) => {
            let steps = accumulation_for(t, m);
            if steps > MAX_ACCUM {
                bail!(
                    "--target-batch: {t} needs {steps} accumulation steps of micro-batch {m}, more than the limit {MAX_ACCUM}"
                );
            }
            Some(steps)
        }
        _ => None,
    };
    let at_max = match max {
        Some(m) => Some(planner.plan(m)?),
        None => None,
    };
    // What the cache really reaches on this GPU: near its limit PyTorch frees cached
    // segments instead of reserving more, so the uncapped figure can exceed the card.
    let cap = budget.allocator_cap(planner.context);
    let capped = match max {
        Some(m) => planner.reserved_within(m, cap)?,
        None => None,
    };
    let capped_smi = capped.and_then(|r| r.checked_add(planner.context));
    if a.train.json {
        let v = serde_json::json!({
            "model": preset.id,
            "loop": cfg.loop_shape,
            "target_seq": planner.target_seq,
            "gpu": gpu.id,
            "gpu_memory_bytes": gpu.memory().0,
            "usable_bytes": budget.usable().0,
            "max_batch": max,
            "accumulation_steps": accum,
            "target_batch": a.target_batch,
            "peak_allocated_bytes": at_max.as_ref().map(|p| p.peak_allocated_bytes.0),
            "peak_reserved_bytes": at_max.as_ref().map(|p| p.peak_reserved_bytes.0),
            "nvidia_smi_bytes": at_max.as_ref().map(|p| p.nvidia_smi_bytes.0),
            "peak_reserved_on_gpu_bytes": capped.map(|b| b.0),
            "nvidia_smi_on_gpu_bytes": capped_smi.map(|b| b.0),
            // The batch runs only because the allocator frees its cache and retries (slower).
            "needs_cache_flush": at_max
                .as_ref()
                .zip(capped_smi)
                .map(|(p, c)| p.nvidia_smi_bytes > c),
            "error_band": at_max
                .as_ref()
                .map(|p| vramlab_core::answer::PlanBand::new(p, &planner.band())),
        });
        writeln!(out, "{v}")?;
        return Ok(());
    }
    match (max, at_max) {
        (Some(m), Some(p)) => {
            let on_gpu = capped_smi.unwrap_or(p.nvidia_smi_bytes);
            writeln!(
                out,
                "{} on {}: largest micro-batch {} ({} of {} usable)",
                preset.id,
                gpu.name,
                m,
                on_gpu,
                budget.usable()
            )?;
            writeln!(
                out,
                "judged at the upper edge of the measured reserved band: {}",
                planner.band().describe()
            )?;
            writeln!(out, "training loop: {}", cfg.loop_shape.describe())?;
            if cfg.step.is_eval() {
                writeln!(
                    out,
                    "step planned: {} (training at the same batch before it)",
                    cfg.step.describe()
                )?;
            }
            if p.nvidia_smi_bytes > on_gpu {
                writeln!(
                    out,
                    "(peak allocated {}; with unlimited memory the cache would grow to {}: \
                     on this GPU it runs only because PyTorch frees its cached blocks and \
                     retries before it runs out, slower — num_alloc_retries counts it; \
                     a smaller batch avoids it)",
                    p.peak_allocated_bytes, p.peak_reserved_bytes
                )?;
            }
            if let (Some(t), Some(k)) = (a.target_batch, accum) {
                writeln!(
                    out,
                    "effective batch {t}: micro-batch {m} × {k} accumulation steps"
                )?;
            }
        }
        _ => writeln!(
            out,
            "{} does not fit on {} even at batch 1",
            preset.id, gpu.name
        )?,
    }
    Ok(())
}

/// `max-batch` when even batch 1 does not fit: its requirement and the shortfall, then exit
/// status [`EXIT_NOTHING_FITS`].
fn nothing_fits(
    a: &MaxBatchArgs,
    planner: &Planner,
    model: &str,
    gpu: &Gpu,
    budget: Budget,
    out: &mut dyn Write,
) -> Result<()> {
    let p1 = planner.plan(1)?;
    let usable = budget.usable();
    let short = Bytes(p1.nvidia_smi_bytes.0.saturating_sub(usable.0));
    if a.train.json {
        let v = serde_json::json!({
            "model": model,
            "gpu": gpu.id,
            "gpu_memory_bytes": gpu.memory().0,
            "usable_bytes": usable.0,
            "max_batch": null,
            "batch1_peak_allocated_bytes": p1.peak_allocated_bytes.0,
            "batch1_nvidia_smi_bytes": p1.nvidia_smi_bytes.0,
            "shortfall_bytes": short.0,
            "fit_command": fit::command_for(&a.train, None),
        });
        writeln!(out, "{v}")?;
    } else {
        writeln!(
            out,
            "{model} does not fit on {} even at batch 1: batch 1 needs {} (nvidia-smi; peak \
             allocated {}) of {} usable, {} short",
            gpu.name, p1.nvidia_smi_bytes, p1.peak_allocated_bytes, usable, short
        )?;
        writeln!(
            out,
            "to search combinations of remedies that fit (precision, checkpointing, LoRA, \
             optimizer, micro-batch with accumulation): {}",
            fit::command_for(&a.train, None)
        )?;
    }
    Err(Exit {
        code: EXIT_NOTHING_FITS,
        message: format!(
            "nothing fits: {model} at batch 1 is {short} over {}",
            gpu.name
        ),
    }
    .into())
}

fn cmd_presets(json: bool, out: &mut dyn Write) -> Result<()> {
    let presets = builtin_presets()?;
    let gpus = gpus::catalog();
    if json {
        let models: Vec<_> = presets
            .iter()
            .map(|p| {
                let params = p
                    .build(p.default_size(), vramlab_core::model::families::transformer::AttnImpl::Sdpa)
                    .map(|g| g.param_count())
                    .ok();
                serde_json::json!({"id": p.id, "family": p.spec.family(), "display_name": p.display_name,
                    "input": p.input, "params": params})
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::json!({"models": models, "gpus": gpus})
        )?;
        return Ok(());
    }
    writeln!(out, "Models:")?;
    for p in &presets {
        writeln!(
            out,
            "  {:<22} {:<13} {}",
            p.id,
            p.spec.family(),
            p.display_name
        )?;
    }
    writeln!(out, "\nGPUs:")?;
    for g in &gpus {
        writeln!(
            out,
            "  {:<12} {:<28} {:>10}",
            g.id,
            g.name,
            g.memory().to_string()
        )?;
    }
    Ok(())
}

fn cmd_validate(files: &[std::path::PathBuf], markdown: bool, out: &mut dyn Write) -> Result<()> {
    if files.is_empty() {
        bail!("validate: give one or more measurement files (JSON lines)");
    }
    let mut measured = Vec::new();
    for f in files {
        let text = vramlab_core::fsutil::read_bounded_string(
            f,
            vramlab_core::fsutil::FileKind::Measurements,
        )?;
        measured.extend(vramlab_core::validate::parse_lines(&text));
    }
    let rows = vramlab_core::validate::compare(&measured)?;
    if markdown {
        write!(out, "{}", vramlab_core::validate::markdown(&rows))?;
    } else {
        for r in &rows {
            writeln!(
                out,
                "{:<20} {:<40} alloc {:>7.2}/{:>7.2} GiB {:+6.1} %  reserved {:>7.2}/{:>7.2} GiB {:+6.1} %",
                r.model,
                r.config,
                r.measured_allocated as f64 / (1u64 << 30) as f64,
                r.predicted_allocated as f64 / (1u64 << 30) as f64,
                r.allocated_error(),
                r.measured_reserved as f64 / (1u64 << 30) as f64,
                r.predicted_reserved as f64 / (1u64 << 30) as f64,
                r.reserved_error()
            )?;
        }
        writeln!(out, "{}", vramlab_core::validate::summary(&rows))?;
    }
    Ok(())
}

fn cmd_export(a: ExportArgs, out: &mut dyn Write) -> Result<()> {
    let format = vramlab_core::vocabulary::format(&a.format).context("--format")?;
    if let Some(n) = &format.note {
        args::note(n);
    }
    let format = format.value;
    let Resolved {
        preset,
        config: mut cfg,
        gpu,
        budget,
        custom,
    } = resolve(&a.train, a.batch)?;
    // HF Trainer, Lightning and the exported PyTorch loop release the model output before
    // backward: what they run is the trainer loop shape, whatever was planned.
    if let Some(loop_shape) = vramlab_core::export::frameworks::implied_loop(format) {
        cfg.loop_shape = loop_shape;
    }
    let plan = Planner::new(&preset, &cfg)?.plan(cfg.batch)?;
    let doc = vramlab_core::export::VramlabConfig::new(
        &preset,
        custom,
        cfg,
        &gpu.id,
        budget.margin,
        Some(&plan),
    )
    .to_json();
    // A custom preset may reuse a built-in id for other weights: only built-ins name a Hub id.
    let hub_id = if custom { None } else { preset.hub_id() };
    let text = vramlab_core::export::render(format, &cfg, &plan, &doc, hub_id)?;
    match &a.output {
        Some(path) => {
            vramlab_core::fsutil::write_atomic(path, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            writeln!(out, "wrote {} ({})", path.display(), format.as_str())?;
        }
        None => write!(out, "{text}")?,
    }
    Ok(())
}
