//! The headless command line: the same capabilities as the GUI, with `--json`.

mod args;
#[cfg(feature = "app")]
mod bench;
pub mod capture;
mod dist_args;
mod dist_plan;
pub mod doctor;
mod fit;
mod infer;
mod plan_bench;

use std::io::Write;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};

use args::resolve;
pub use args::{TrainArgs, load_model, resolve_model};

use vramlab_core::model::preset::builtin_presets;
use vramlab_core::plan::config::{MAX_ACCUM, MAX_BATCH};
use vramlab_core::plan::gpus::{self, Gpu};
use vramlab_core::plan::remedies::remedies;
use vramlab_core::plan::search::{Budget, accumulation_for, max_batch};
use vramlab_core::plan::{Plan, Planner};
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

fn pct(part: Bytes, whole: Bytes) -> f64 {
    if whole.0 == 0 {
        0.0
    } else {
        100.0 * part.0 as f64 / whole.0 as f64
    }
}

/// Exit status of `max-batch` when even batch 1 does not fit (documented in the README).
pub const EXIT_NOTHING_FITS: u8 = 3;

/// An error that exits with its own status instead of 1.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// Whether the error is a write to a closed pipe (`vramlab presets | head -1`): Unix tools
/// exit quietly then.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn cmd_plan(a: PlanArgs, out: &mut dyn Write) -> Result<()> {
    if infer::is_inference(&a.train) {
        return infer::cmd_plan(&a.train, a.batch, out);
    }
    let (preset, cfg, gpu, budget, _) = resolve(&a.train, a.batch)?;
    let cfg = dist_plan::resolve_auto(&a.train.dist, &preset, cfg, budget)?;
    let assumed = a.train.assumed();
    let warnings = args::warnings(&cfg, &gpu);
    let planner = Planner::new(&preset, &cfg)?;
    let plan = planner.plan(cfg.batch)?;
    let verdict = vramlab_core::answer::Verdict::new(&planner, &plan, budget)?;
    let fits = verdict.fits;
    let max = max_batch(&planner, budget, MAX_BATCH)?;
    let fixes = remedies(&preset, &cfg, budget)?;
    if a.train.json {
        let mut v = serde_json::to_value(&plan)?;
        if let Some(o) = v.as_object_mut() {
            if !a.timeline {
                o.remove("timeline");
            }
            let breakdown: serde_json::Map<String, serde_json::Value> = plan
                .breakdown
                .iter()
                .map(|s| (s.category.clone(), serde_json::json!(s.bytes.0)))
                .collect();
            o.insert("breakdown".into(), breakdown.into());
            o.insert("gpu".into(), serde_json::json!(gpu.id));
            o.insert("gpu_memory_bytes".into(), serde_json::json!(gpu.memory().0));
            o.insert("usable_bytes".into(), serde_json::json!(budget.usable().0));
            o.insert("fits".into(), serde_json::json!(fits));
            o.insert(
                "nvidia_smi_upper_bytes".into(),
                serde_json::json!(verdict.nvidia_smi_upper_bytes.0),
            );
            o.insert(
                "error_band".into(),
                serde_json::to_value(&verdict.error_band)?,
            );
            o.insert("max_batch".into(), serde_json::json!(max));
            o.insert(
                "effective_batch".into(),
                serde_json::json!(cfg.effective_batch()),
            );
            o.insert("remedies".into(), serde_json::to_value(&fixes)?);
            if !fits && !fixes.iter().any(|r| r.fits) {
                o.insert(
                    "fit_command".into(),
                    serde_json::json!(fit::command_for(&a.train, a.batch)),
                );
            }
            dist_plan::json(&planner, o);
            let assumed: serde_json::Map<String, serde_json::Value> = assumed
                .iter()
                .map(|(flag, v)| {
                    (
                        flag.trim_start_matches('-').to_string(),
                        serde_json::json!(v),
                    )
                })
                .collect();
            o.insert("assumed".into(), assumed.into());
            o.insert("warnings".into(), serde_json::json!(warnings));
        }
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
        return Ok(());
    }
    let mut extra = Vec::new();
    if !assumed.is_empty() {
        extra.push(format!(
            "assumed (not given): {}",
            assumed
                .iter()
                .map(|(flag, v)| format!("{flag} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    extra.extend(warnings.iter().map(|w| format!("warning: {w}")));
    extra.extend(dist_plan::lines(&planner));
    write_plan(out, &plan, &gpu, budget, &verdict, max, &extra)?;
    writeln!(
        out,
        "\nWhat-if remedies (vs {} nvidia-smi, {} allocated):",
        plan.nvidia_smi_bytes, plan.peak_allocated_bytes
    )?;
    writeln!(
        out,
        "  {:<36} {:>11}  {:<12} {:<12} verdict",
        "remedy", "nvidia-smi", "saving", "allocated"
    )?;
    let signed = |v: i64| {
        let sign = match v {
            0 => "±",
            1.. => "−",
            _ => "+",
        };
        format!("{sign}{}", Bytes(v.unsigned_abs()))
    };
    let mut costs_header = false;
    for r in &fixes {
        if r.adds_memory && !costs_header {
            costs_header = true;
            writeln!(out, "  adds memory here (costs, not remedies):")?;
        }
        writeln!(
            out,
            "  {:<36} {:>11}  {:<12} {:<12} {}",
            r.name,
            r.nvidia_smi.to_string(),
            signed(r.saving),
            signed(r.allocated_saving),
            r.verdict()
        )?;
        if let Some(n) = &r.note {
            writeln!(out, "      ({n})")?;
        }
    }
    if !fits && !fixes.iter().any(|r| r.fits) {
        next_step(&a, &preset, &cfg, &gpu, budget, out)?;
    }
    Ok(())
}

/// When neither the plan nor any single remedy fits: the best answer of the fit search in
/// one line, the `vramlab fit` command for the rest, and LoRA / QLoRA where they apply.
fn next_step(
    a: &PlanArgs,
    preset: &vramlab_core::model::Preset,
    cfg: &vramlab_core::plan::TrainConfig,
    gpu: &Gpu,
    budget: Budget,
    out: &mut dyn Write,
) -> Result<()> {
    let mut req = vramlab_core::plan::fit::FitRequest::for_gpu(gpu, budget.margin);
    req.budget = budget;
    req.top = 1;
    let report = vramlab_core::plan::fit::fit(preset, cfg, &req)?;
    writeln!(out, "\nNext step: no single remedy fits.")?;
    match report.candidates.first() {
        Some(c) => writeln!(
            out,
            "  best combination: {} — {} nvidia-smi, {:.2} ms/sample",
            c.summary(),
            c.nvidia_smi,
            c.time.ms_per_sample
        )?,
        None => writeln!(
            out,
            "  no combination fits either: {}",
            report
                .reason
                .as_deref()
                .unwrap_or("even the smallest settings exceed the GPU")
        )?,
    }
    writeln!(
        out,
        "  the ranked list and each change's cost: {}",
        fit::command_for(&a.train, a.batch)
    )?;
    let adapters_apply = preset.input.is_tokens()
        && cfg.finetune.is_full()
        && !report
            .candidates
            .first()
            .is_some_and(|c| c.config.finetune.mode.has_adapters());
    if adapters_apply {
        writeln!(
            out,
            "  fine-tuning a pretrained model? --finetune lora or --finetune qlora trains adapters \
             on a frozen (QLoRA: 4-bit) base: no gradients or optimizer state for the base weights"
        )?;
    }
    Ok(())
}

/// The fine-tuning line of a plan: LoRA / QLoRA with their trainable count, or a partial
/// full fine-tuning (frozen embeddings / blocks).
fn write_finetune(
    out: &mut dyn Write,
    c: &vramlab_core::plan::TrainConfig,
    plan: &Plan,
) -> Result<()> {
    if let Some(t) = plan.trainable_params.filter(|_| c.finetune.is_full()) {
        let mut what = Vec::new();
        if c.finetune.freeze_embeddings {
            what.push("embeddings".to_string());
        }
        if c.finetune.freeze_blocks > 0 {
            what.push(format!("the first {} blocks", c.finetune.freeze_blocks));
        }
        writeln!(
            out,
            "  fine-tuning: full, with {} frozen (no gradient, no optimizer state) · trainable \
         params: {t} of {} ({:.4} %)",
            what.join(" and "),
            plan.params,
            100.0 * t as f64 / plan.params.max(1) as f64
        )?;
    } else if let Some(t) = plan.trainable_params {
        writeln!(
            out,
            "  fine-tuning: {} r{} on {}{} (peft 0.21, fp32 adapters, base frozen) · trainable params: {t} of {} ({:.4} %)",
            match c.finetune.mode {
                vramlab_core::plan::finetune::FineTuneMode::Qlora => format!(
                    "QLoRA {}{} (bitsandbytes 0.50, bf16 compute)",
                    c.finetune.quant,
                    if c.finetune.double_quant && c.finetune.quant.is_4bit() {
                        " + double quant"
                    } else {
                        ""
                    }
                ),
                _ => "LoRA".to_string(),
            },
            c.finetune.lora_rank,
            c.finetune.lora_targets,
            if c.finetune.lora_dropout.is_zero() {
                String::new()
            } else {
                format!(", dropout {}", c.finetune.lora_dropout)
            },
            plan.params,
            100.0 * t as f64 / plan.params.max(1) as f64
        )?;
        if c.finetune.lora_merged {
            writeln!(
                out,
                "  adapters merged for this evaluation (merge_and_unload): no adapter ops in the \
                 forward; their parameters, gradients and optimizer state stay while the \
                 optimizer holds them (not yet measured on a GPU)"
            )?;
        }
    }
    Ok(())
}

fn write_plan(
    out: &mut dyn Write,
    plan: &Plan,
    gpu: &Gpu,
    budget: Budget,
    verdict: &vramlab_core::answer::Verdict,
    max: Option<u64>,
    extra: &[String],
) -> Result<()> {
    let fits = verdict.fits;
    let c = &plan.config;
    writeln!(
        out,
        "{} ({:.1} M params) · batch {} × accum {} = {} · size {} · {} · {}{}{}",
        plan.model,
        plan.params as f64 / 1e6,
        c.batch,
        c.accum,
        c.effective_batch(),
        plan.size,
        c.precision.label(),
        c.optimizer.label(),
        if c.checkpointing {
            " · checkpointing"
        } else {
            ""
        },
        if c.attention == vramlab_core::plan::Attention::Eager {
            " · eager attention"
        } else {
            ""
        },
    )?;
    if let Some(t) = plan.target_seq {
        writeln!(
            out,
            "  encoder-decoder: source {} tokens (--seq) · target {t} tokens ({})",
            plan.size,
            if c.target_seq.is_some() {
                "--target-seq"
            } else {
                "default; set --target-seq"
            }
        )?;
    }
    writeln!(out, "  training loop: {}", c.loop_shape.describe())?;
    if c.step.is_eval() {
        writeln!(out, "  step planned: {}", c.step.describe())?;
    }
    write_finetune(out, c, plan)?;
    if plan.paged_optimizer_bytes.0 > 0 {
        writeln!(
            out,
            "  paged optimizer: {} of state in unified memory (cudaMallocManaged) — evictable to host RAM, not in torch.cuda.memory_allocated() nor in the peaks above",
            plan.paged_optimizer_bytes
        )?;
    }
    for line in extra {
        writeln!(out, "  {line}")?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "  peak allocated   {:>12}   (torch.cuda.max_memory_allocated)",
        plan.peak_allocated_bytes.to_string()
    )?;
    writeln!(
        out,
        "  peak reserved    {:>12}   (torch.cuda.max_memory_reserved)",
        plan.peak_reserved_bytes.to_string()
    )?;
    writeln!(
        out,
        "  nvidia-smi       {:>12}   (reserved + CUDA context)",
        plan.nvidia_smi_bytes.to_string()
    )?;
    writeln!(
        out,
        "  peak during      {} {}",
        plan.peak_phase.label(),
        plan.peak_layer
    )?;
    writeln!(out)?;
    writeln!(out, "  breakdown at the peak:")?;
    for s in &plan.breakdown {
        writeln!(
            out,
            "    {:<42} {:>12}  {:>5.1} %",
            s.label,
            s.bytes.to_string(),
            pct(s.bytes, plan.nvidia_smi_bytes)
        )?;
        if s.category == "parameters"
            && let Some(w) = plan.weights_split
        {
            for (what, b) in [
                ("frozen weights", w.frozen_bytes),
                ("trainable weights", w.trainable_bytes),
            ] {
                writeln!(out, "      {what:<40} {:>12}", b.to_string())?;
            }
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "  {} on {}: {} of {} usable ({:.0} %, margin {:.0} %)",
        if fits { "FITS" } else { "DOES NOT FIT" },
        gpu.name,
        plan.nvidia_smi_bytes,
        budget.usable(),
        pct(plan.nvidia_smi_bytes, budget.usable()),
        budget.margin * 100.0
    )?;
    writeln!(
        out,
        "  judged at the upper edge of the measured band: {} nvidia-smi",
        verdict.nvidia_smi_upper_bytes
    )?;
    writeln!(out, "  {}", verdict.band_line())?;
    match max {
        Some(m) => writeln!(out, "  largest micro-batch that fits: {m}")?,
        None => writeln!(out, "  even batch 1 does not fit")?,
    }
    Ok(())
}

fn cmd_max_batch(a: MaxBatchArgs, out: &mut dyn Write) -> Result<()> {
    if infer::is_inference(&a.train) {
        return infer::cmd_max_batch(&a.train, out);
    }
    let (preset, cfg, gpu, budget, _) = resolve(&a.train, Some(1))?;
    // `--gpus auto`: the fewest GPUs where micro-batch 1 fits.
    let cfg = dist_plan::resolve_auto(&a.train.dist, &preset, cfg, budget)?;
    for w in args::warnings(&cfg, &gpu) {
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
    let (preset, mut cfg, gpu, budget, custom) = resolve(&a.train, a.batch)?;
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
