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
mod infer;
mod max_batch;
mod max_context;
mod model_source;
mod plan_bench;
mod plan_text;
mod stderr;
mod vllm;

use std::io::Write;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

pub use args::{TrainArgs, load_model, resolve_model};
pub use exit::{EXIT_NOTHING_FITS, Exit, is_broken_pipe};

use vramlab_core::model::preset::builtin_presets;
use vramlab_core::plan::gpus;

/// vramlab — will this training run fit on my GPU, and with which batch size?
#[derive(Debug, Parser)]
#[command(name = "vramlab", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Each subcommand's arguments are built only when that subcommand runs (`defer`): building
/// all of them was most of the parsing at every process start.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Predict the peak memory of one training step.
    Plan(PlanArgs),
    /// Write the plan as a vramlab config or a framework config.
    Export(ExportArgs),
    /// Find the largest micro-batch that fits a GPU.
    MaxBatch(max_batch::MaxBatchArgs),
    /// Find the longest prompt (or, with --prompt, the most new tokens) of an inference call
    /// (--step generate|prefill) that fits a GPU at a batch.
    MaxContext(max_context::MaxContextArgs),
    /// vLLM's KV-cache capacity on a GPU (blocks, tokens, max concurrency), planned from
    /// vLLM's source, not measured.
    Vllm(vllm::VllmCliArgs),
    /// Search combinations of remedies that make the configuration fit a GPU, ranked by
    /// predicted time per sample.
    Fit(fit::FitArgs),
    /// List model presets and GPUs.
    Presets {
        #[arg(long)]
        json: bool,
    },
    /// Compare the planner with measured runs (JSON lines from crates/device/runners/torch_runner.py).
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
    /// --config gives it; inference steps: sequences, default 1).
    #[arg(long, required_unless_present_any = ["config", "step"], allow_negative_numbers = true,
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
    /// --config gives it; inference steps: sequences, default 1).
    #[arg(long, required_unless_present_any = ["config", "step"], allow_negative_numbers = true,
          value_parser = args::parse_batch)]
    pub batch: Option<u64>,
    /// Training: vramlab, deepspeed, hf, lightning, pytorch, env or peft (LoraConfig, QLoRA's
    /// BitsAndBytesConfig, SFTConfig); with --gpus: accelerate, torchrun or fsdp2. Inference
    /// (--step generate|prefill): transformers (a runnable script of the planned call) or vllm
    /// (`vllm serve` sized from vLLM's source, generate only).
    #[arg(long)]
    pub format: String,
    /// With --format vllm: vLLM's --gpu-memory-utilization [default: 0.9].
    #[arg(long, value_name = "U")]
    pub gpu_memory_utilization: Option<f64>,
    /// Write to this file (atomically) instead of standard output.
    #[arg(short, long)]
    pub output: Option<std::path::PathBuf>,
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
        Command::MaxBatch(a) => max_batch::cmd_max_batch(a, out),
        Command::MaxContext(a) => max_context::cmd_max_context(a, out),
        Command::Vllm(a) => vllm::cmd_vllm(a, out),
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
                &vramlab_words::find_gpu(&gpu)?,
                reps,
                json,
                out,
            )
        }
    }
}

fn cmd_plan(a: PlanArgs, out: &mut dyn Write) -> Result<()> {
    if infer::is_inference(&a.train) {
        return infer::cmd_plan(&a.train, a.batch, out);
    }
    infer::refuse_decoding_flags(&a.train)?;
    let report = a.train.words_loaded()?.0.plan_report(
        a.batch,
        a.timeline,
        !a.train.json,
        &args::detect_gpu,
        &mut args::say,
    )?;
    if a.train.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    plan_text::write(out, &report)
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

/// The formats of a training step, for messages.
fn training_formats() -> String {
    let names = |fs: &[vramlab_core::export::Format]| {
        fs.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(", ")
    };
    format!(
        "{}; with --gpus: {}",
        names(&vramlab_core::export::Format::ALL),
        names(&vramlab_core::export::Format::DISTRIBUTED)
    )
}

fn cmd_export(a: ExportArgs, out: &mut dyn Write) -> Result<()> {
    use vramlab_core::export::InferFormat;
    let (text, format) = if infer::is_inference(&a.train) {
        let Some(format) = vramlab_words::parse::<InferFormat>(&a.format).ok() else {
            bail!(
                "--format {}: an inference step (--step generate|prefill) exports as {}; \
                 the training formats ({}) need a training step",
                a.format.trim(),
                InferFormat::choices(),
                training_formats()
            );
        };
        let text = infer::export_text(&a.train, a.batch, format, a.gpu_memory_utilization)?;
        (text, format.as_str())
    } else {
        if let Ok(f) = vramlab_words::parse::<InferFormat>(&a.format) {
            bail!(
                "--format {}: an inference export; it needs --step generate|prefill (a training \
                 step exports as {})",
                f.as_str(),
                training_formats()
            );
        }
        if a.gpu_memory_utilization.is_some() {
            bail!("--gpu-memory-utilization: a vLLM setting; it needs --format vllm");
        }
        infer::refuse_decoding_flags(&a.train)?;
        let (words, hub_repo) = a.train.words_loaded()?;
        words.export(
            &a.format,
            a.batch,
            hub_repo.as_deref(),
            &args::detect_gpu,
            &mut args::say,
        )?
    };
    match &a.output {
        Some(path) => {
            vramlab_core::fsutil::write_atomic(path, text.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
            writeln!(out, "wrote {} ({format})", path.display())?;
        }
        None => write!(out, "{text}")?,
    }
    Ok(())
}
