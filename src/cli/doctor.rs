//! `vramlab doctor`: reads an OOM message and/or a memory snapshot, prints the diagnosis,
//! and with `--model …` adds what the planner says (the batch that fits, planned remedies).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;

use super::args::{TrainArgs, load_model, resolve_model};
use vramlab_core::doctor::{self, Diagnosis, OomMessage, SnapshotReport};
use vramlab_core::plan::Planner;
use vramlab_core::plan::config::MAX_BATCH;
use vramlab_core::plan::search::{Budget, max_batch, max_batch_capped};
use vramlab_core::plan::step_kind::StepKind;
use vramlab_core::units::Bytes;

#[derive(Debug, Args, Clone, Default)]
pub struct DoctorArgs {
    /// The OOM error text (the whole traceback is fine).
    #[arg(long, conflicts_with = "message_file")]
    pub message: Option<String>,
    /// A file holding the OOM error text ("-" reads standard input).
    #[arg(long)]
    pub message_file: Option<PathBuf>,
    /// A `torch.cuda.memory._dump_snapshot` pickle.
    #[arg(long)]
    pub snapshot: Option<PathBuf>,
    /// A saved vramlab bench run (`.run.json`): its first OOM trial, with the run's model.
    #[arg(long, conflicts_with_all = ["message", "message_file", "model"])]
    pub run: Option<PathBuf>,
    /// The device whose trace to replay (default: the one with an OOM, else the longest).
    #[arg(long)]
    pub device: Option<usize>,
    /// Include the allocated/reserved timeline in the JSON output.
    #[arg(long)]
    pub timeline: bool,
    /// Model preset or preset file, to add the planner's answer (largest batch, remedies).
    #[arg(long)]
    pub model: Option<String>,
    /// The micro-batch that ran out of memory.
    #[arg(long)]
    pub batch: Option<u64>,
    #[arg(long, default_value = "amp-bf16")]
    pub precision: String,
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    #[arg(long)]
    pub seq: Option<u64>,
    #[arg(long)]
    pub image: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub accum: u64,
    #[arg(long)]
    pub checkpointing: bool,
    #[arg(long, default_value = "sdpa")]
    pub attention: String,
    /// Training-loop shape, as for `plan`: plain (the output stays referenced through
    /// backward, the default) or trainer (`loss = model(**batch).loss`, HF Trainer, Lightning).
    #[arg(long = "loop", value_name = "plain|trainer")]
    pub loop_shape: Option<String>,
    /// The step that failed: train (default), eval (validation under `no_grad`) or eval-grad
    /// (validation without `no_grad`).
    #[arg(long, value_name = "train|eval|eval-grad")]
    pub step: Option<String>,
    /// Catalog GPU (default: the message's total capacity).
    #[arg(long)]
    pub gpu: Option<String>,
    #[arg(long, default_value_t = 0.05)]
    pub margin: f64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// A planned remedy, as the doctor reports it.
#[derive(Debug, Clone, Serialize)]
pub struct PlannedRemedy {
    pub name: String,
    pub description: String,
    pub nvidia_smi_bytes: Bytes,
    pub saving_bytes: i64,
    pub fits: bool,
}

/// What the planner says about the model that ran out of memory.
#[derive(Debug, Clone, Serialize)]
pub struct PlanAdvice {
    pub model: String,
    /// The GPU's memory.
    pub capacity_bytes: Bytes,
    /// The per-process cap the plan is held to (`set_per_process_memory_fraction`, the
    /// message's "… allowed"): PyTorch's allocator may reserve at most this.
    pub allowed_bytes: Option<Bytes>,
    /// The training-loop shape planned (`--loop`).
    pub loop_shape: &'static str,
    pub batch: Option<u64>,
    pub predicted_nvidia_smi_bytes: Option<Bytes>,
    pub predicted_peak_allocated_bytes: Option<Bytes>,
    pub max_batch: Option<u64>,
    /// Accumulation steps that keep the failing batch as the effective batch.
    pub accumulation_for_batch: Option<u64>,
    pub remedies: Vec<PlannedRemedy>,
    /// The evaluation step with and without `torch.no_grad()`.
    pub evaluation: Option<EvalAdvice>,
    /// The planned allocated timeline at the failing batch (event index, bytes).
    #[serde(skip)]
    pub timeline: Vec<(u32, u64)>,
}

/// The planner's answer for a model on a GPU of `capacity` bytes, the allocator held to
/// `allowed` bytes when the message states a per-process cap.
pub fn plan_advice(
    a: &DoctorArgs,
    capacity: Option<Bytes>,
    allowed: Option<Bytes>,
) -> Result<Option<PlanAdvice>> {
    let Some(model) = &a.model else {
        return Ok(None);
    };
    let t = TrainArgs {
        model: Some(model.clone()),
        config: None,
        precision: Some(a.precision.clone()),
        optimizer: Some(a.optimizer.clone()),
        seq: a.seq,
        target_seq: None,
        image: a.image,
        accum: a.accum,
        checkpointing: a.checkpointing,
        checkpointing_reentrant: false,
        attention: a.attention.clone(),
        loop_shape: a.loop_shape.clone(),
        step: a.step.clone(),
        new_tokens: None,
        kv_cache: None,
        device_map: None,
        max_gpu_memory: None,
        finetune: None,
        lora_rank: None,
        lora_targets: None,
        lora_dropout: None,
        freeze_embeddings: false,
        freeze_blocks: None,
        lora_merged: false,
        dist: Default::default(),
        quant: None,
        no_double_quant: false,
        moe_imbalance: None,
        expandable_segments: false,
        max_split_size_mb: None,
        // Only the model and config are taken from here; the capacity comes below.
        gpu: Some(match &a.gpu {
            Some(g) => g.clone(),
            None => vramlab_core::plan::gpus::catalog()
                .first()
                .map(|g| g.id.clone())
                .unwrap_or_default(),
        }),
        margin: a.margin,
        json: false,
    };
    let (preset, cfg) = resolve_model(&t)?;
    let capacity = match (&a.gpu, capacity) {
        (Some(g), _) => vramlab_core::plan::gpus::find(g.trim())
            .context("--gpu")?
            .memory(),
        (None, Some(c)) => c,
        (None, None) => {
            bail!("--model: give --gpu (no GPU capacity is known from the message or snapshot)")
        }
    };
    advise(&preset, cfg, capacity, allowed, a.margin, a.batch).map(Some)
}

/// The planner's answer for `preset` under `cfg` on `capacity` bytes, PyTorch's allocator
/// held to `allowed` bytes when a per-process cap is known (`batch`: the one that failed,
/// if known).
pub fn advise(
    preset: &vramlab_core::model::Preset,
    mut cfg: vramlab_core::plan::TrainConfig,
    capacity: Bytes,
    allowed: Option<Bytes>,
    margin: f64,
    batch: Option<u64>,
) -> Result<PlanAdvice> {
    if !(0.0..1.0).contains(&margin) {
        bail!("--margin: must be a fraction in [0, 1), got {margin}");
    }
    if let Some(b) = batch {
        cfg.batch = b;
        cfg.validate()?;
    }
    let planner = Planner::new(preset, &cfg)?;
    // A cap limits what the allocator reserves; the CUDA context lies outside it
    // (`set_per_process_memory_fraction` checks `total_allocated_memory`, the allocator's
    // segments). The remedies and the evaluation step are held to the same bytes.
    let allowed = allowed.filter(|c| *c < capacity);
    let budget = match allowed {
        Some(c) => Budget {
            capacity: Bytes(c.0.saturating_add(planner.context.0)).min(capacity),
            margin,
        },
        None => Budget { capacity, margin },
    };
    let predicted = match batch {
        Some(b) => Some(planner.plan(b)?),
        None => None,
    };
    let max = match allowed {
        Some(c) => max_batch_capped(
            &planner,
            Budget {
                capacity: c,
                margin,
            }
            .usable()
            .min(Budget { capacity, margin }.allocator_cap(planner.context)),
            MAX_BATCH,
        )?,
        None => max_batch(&planner, budget, MAX_BATCH)?,
    };
    let mut fixes: Vec<PlannedRemedy> =
        vramlab_core::plan::remedies::remedies(preset, &cfg, budget)?
            .into_iter()
            .map(|r| PlannedRemedy {
                name: r.name.to_string(),
                description: r.description,
                nvidia_smi_bytes: r.nvidia_smi,
                saving_bytes: r.saving,
                fits: r.fits,
            })
            .collect();
    let evaluation = evaluation_advice(preset, &cfg, budget)?;
    if let Some(e) = &evaluation
        && cfg.step != StepKind::Eval
        && e.no_grad.peak_allocated_bytes < e.with_grad.peak_allocated_bytes
    {
        let (with, without) = (
            e.with_grad.peak_allocated_bytes,
            e.no_grad.peak_allocated_bytes,
        );
        fixes.push(PlannedRemedy {
            name: "eval-no-grad".into(),
            description: format!(
                "if it failed in validation: run evaluation under `torch.no_grad()` (or \
                 `torch.inference_mode()`) and accumulate `loss.item()`, not `loss` — at batch {} \
                 an evaluation step after training peaks at {with} allocated with autograd on, \
                 {without} without",
                e.batch,
            ),
            nvidia_smi_bytes: e.no_grad.nvidia_smi_bytes,
            saving_bytes: with.0 as i64 - without.0 as i64,
            fits: e.no_grad.fits,
        });
    }
    let accumulation_for_batch = match (batch, max) {
        (Some(b), Some(m)) if m < b => Some(vramlab_core::plan::search::accumulation_for(b, m)),
        _ => None,
    };
    Ok(PlanAdvice {
        model: preset.id.clone(),
        capacity_bytes: capacity,
        allowed_bytes: allowed,
        loop_shape: cfg.loop_shape.as_str(),
        batch,
        predicted_nvidia_smi_bytes: predicted.as_ref().map(|p| p.nvidia_smi_bytes),
        predicted_peak_allocated_bytes: predicted.as_ref().map(|p| p.peak_allocated_bytes),
        max_batch: max,
        accumulation_for_batch,
        remedies: fixes,
        evaluation,
        timeline: predicted
            .as_ref()
            .map(|p| {
                p.timeline
                    .iter()
                    .map(|t| (t.index, t.allocated.0))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// One planned evaluation step.
#[derive(Debug, Clone, Serialize)]
pub struct EvalPlan {
    pub peak_allocated_bytes: Bytes,
    pub nvidia_smi_bytes: Bytes,
    pub fits: bool,
}

/// The evaluation step after training, with and without `torch.no_grad()` (the seed
/// articles' validation OOM), at the configured batch.
#[derive(Debug, Clone, Serialize)]
pub struct EvalAdvice {
    pub batch: u64,
    pub no_grad: EvalPlan,
    pub with_grad: EvalPlan,
}

fn evaluation_advice(
    preset: &vramlab_core::model::Preset,
    cfg: &vramlab_core::plan::TrainConfig,
    budget: Budget,
) -> Result<Option<EvalAdvice>> {
    let plan_of = |step: StepKind| -> Result<EvalPlan> {
        let c = vramlab_core::plan::TrainConfig { step, ..*cfg };
        let p = Planner::new(preset, &c)?.plan(cfg.batch)?;
        Ok(EvalPlan {
            peak_allocated_bytes: p.peak_allocated_bytes,
            nvidia_smi_bytes: p.nvidia_smi_bytes,
            fits: p.nvidia_smi_bytes <= budget.usable(),
        })
    };
    Ok(Some(EvalAdvice {
        batch: cfg.batch,
        no_grad: plan_of(StepKind::Eval)?,
        with_grad: plan_of(StepKind::EvalGrad)?,
    }))
}

/// The first OOM of a saved bench run, and the planner's answer for its model.
fn from_run(path: &Path, margin: f64) -> Result<(Option<String>, Option<PlanAdvice>)> {
    let bytes = vramlab_core::fsutil::read_bounded(path, vramlab_core::fsutil::FileKind::Run)
        .context("--run: reading run record")?;
    let run = vramlab_core::export::results::run_from_json(&bytes)
        .with_context(|| format!("run file {}", path.display()))?;
    let oom = run
        .trials
        .iter()
        .filter_map(|t| match &t.outcome {
            vramlab_core::record::Outcome::Oom { message } => Some((t.batch, message.clone())),
            _ => None,
        })
        .min_by_key(|(b, _)| *b);
    let preset =
        load_model(&run.model).with_context(|| format!("run file {}: model", path.display()))?;
    let advice = advise(
        &preset,
        run.config,
        run.device.total_bytes,
        None,
        margin,
        oom.as_ref().map(|(b, _)| *b),
    )?;
    Ok((oom.map(|(_, m)| m), Some(advice)))
}

/// Reads and analyses a snapshot file, reporting progress on standard error for big files.
pub fn load_snapshot(
    path: &Path,
    device: Option<usize>,
    progress: &mut dyn FnMut(u64, u64) -> bool,
) -> Result<SnapshotReport> {
    let (file, total) =
        vramlab_core::fsutil::open_bounded(path, vramlab_core::fsutil::FileKind::Snapshot)
            .context("--snapshot: reading snapshot")?;
    let snap = doctor::read_snapshot(file, &mut |n| progress(n, total))
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(doctor::analyze(&snap, device)?)
}

/// Everything `doctor` found.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorReport {
    /// The cause, or null when nothing failed (a snapshot without an OOM).
    pub diagnosis: Option<&'static str>,
    /// The remedies of the diagnosis, most useful first (also under `details`).
    pub remedies: Vec<doctor::Remedy>,
    /// The figures the diagnosis used (also under `details`).
    pub figures: Option<doctor::Figures>,
    pub details: Option<Diagnosis>,
    pub message: Option<OomMessage>,
    pub peak_allocated_bytes: Option<Bytes>,
    pub peak_reserved_bytes: Option<Bytes>,
    pub snapshot: Option<SnapshotReport>,
    pub plan: Option<PlanAdvice>,
    /// With a snapshot and `--model … --batch N`: the planned step laid over the trace
    /// (peaks aligned) and the two peaks.
    pub planned_overlay: Option<doctor::overlay::PlannedOverlay>,
}

/// Builds the report from the arguments (no printing).
pub fn report(a: &DoctorArgs) -> Result<DoctorReport> {
    let text = match (&a.message, &a.message_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(p)) if p.as_os_str() == "-" => Some(vramlab_core::fsutil::read_stream_string(
            std::io::stdin(),
            p,
            vramlab_core::fsutil::FileKind::OomMessage,
        )?),
        (None, Some(p)) => Some(
            vramlab_core::fsutil::read_bounded_string(
                p,
                vramlab_core::fsutil::FileKind::OomMessage,
            )
            .context("--message-file: reading OOM message")?,
        ),
        (None, None) => None,
    };
    let (run_text, run_plan) = match &a.run {
        Some(p) => from_run(p, a.margin)?,
        None => (None, None),
    };
    if a.run.is_some() && run_text.is_none() && a.snapshot.is_none() {
        bail!("--run: no trial of this run ran out of memory");
    }
    let text = text.or(run_text);
    if text.is_none() && a.snapshot.is_none() {
        bail!("doctor: give --message TEXT, --message-file FILE, --snapshot FILE or --run FILE");
    }
    let message = match &text {
        Some(t) => Some(doctor::parse_message(t).ok_or(doctor::DoctorError::NoMessage)?),
        None => None,
    };
    let snapshot = match &a.snapshot {
        Some(p) => {
            let big = std::fs::metadata(p)
                .map(|m| m.len() > 64 << 20)
                .unwrap_or(false);
            let mut last = 0u64;
            Some(load_snapshot(p, a.device, &mut |n, total| {
                if big && !a.json && n >= last + (32 << 20) {
                    last = n;
                    eprintln!("reading snapshot: {} of {}", Bytes(n), Bytes(total));
                }
                true
            })?)
        }
        None => None,
    };
    let mut details = doctor::diagnose(message.as_ref(), snapshot.as_ref());
    let capacity = message.as_ref().and_then(|m| m.total_capacity_bytes);
    let allowed = message.as_ref().and_then(|m| m.allowed_bytes);
    let plan = match run_plan {
        Some(p) => Some(p),
        None => plan_advice(a, capacity, allowed)?,
    };
    if let (Some(d), Some(p)) = (details.as_mut(), plan.as_ref()) {
        add_plan_verdict(d, p);
    }
    let planned_overlay = match (&snapshot, &plan) {
        (Some(s), Some(p)) => doctor::overlay::overlay(&s.timeline, &p.timeline),
        _ => None,
    };
    Ok(DoctorReport {
        diagnosis: details.as_ref().map(|d| d.cause.as_str()),
        remedies: details
            .as_ref()
            .map(|d| d.remedies.clone())
            .unwrap_or_default(),
        figures: details.as_ref().map(|d| d.figures.clone()),
        peak_allocated_bytes: snapshot.as_ref().map(|s| s.peak_allocated_bytes),
        peak_reserved_bytes: snapshot.as_ref().map(|s| s.peak_reserved_bytes),
        details,
        message,
        snapshot,
        plan,
        planned_overlay,
    })
}

/// When the planner says the failing batch does not fit this GPU at all, fixing the
/// allocator alone cannot help: say so, and put the batch that fits first.
fn add_plan_verdict(d: &mut Diagnosis, p: &PlanAdvice) {
    let (Some(batch), Some(need)) = (p.batch, p.predicted_nvidia_smi_bytes) else {
        return;
    };
    let too_big = p.max_batch.is_none_or(|m| m < batch);
    let under = match p.allowed_bytes {
        Some(c) => format!("the {c} cap of a {} GPU", p.capacity_bytes),
        None => format!("a {} GPU", p.capacity_bytes),
    };
    if !too_big {
        d.evidence.push(format!(
            "The planner predicts {need} for batch {batch} of {} ({} loop): it fits {under} with \
             the margin, so the failure is not the model's size.",
            p.model, p.loop_shape
        ));
        return;
    }
    d.evidence.push(format!(
        "The planner predicts {need} for batch {batch} of {} ({} loop) under {under}: this batch \
         does not fit even without fragmentation or other holders.",
        p.model, p.loop_shape
    ));
    let detail = match (p.max_batch, p.accumulation_for_batch) {
        (Some(m), Some(k)) => format!(
            "The largest micro-batch that fits is {m}; {k} gradient-accumulation steps of {} \
             keep the effective batch of {batch}.",
            batch.div_ceil(k)
        ),
        (Some(m), None) => format!("The largest micro-batch that fits is {m}."),
        _ => "Even batch 1 does not fit: see the planned remedies.".to_string(),
    };
    d.remedies.insert(
        0,
        doctor::Remedy {
            title: "Use a batch that fits (planner)".to_string(),
            detail,
            setting: p.max_batch.map(|m| format!("batch_size={m}")),
        },
    );
}

/// `vramlab doctor`.
pub fn cmd_doctor(a: DoctorArgs, out: &mut dyn Write) -> Result<()> {
    let mut r = report(&a)?;
    if a.json {
        if !a.timeline {
            if let Some(s) = r.snapshot.as_mut() {
                s.timeline.clear();
            }
            if let Some(o) = r.planned_overlay.as_mut() {
                o.points.clear();
            }
        }
        writeln!(out, "{}", serde_json::to_string(&r)?)?;
        return Ok(());
    }
    write_text(&r, out)
}

fn write_text(r: &DoctorReport, out: &mut dyn Write) -> Result<()> {
    if let Some(d) = &r.details {
        writeln!(out, "Diagnosis: {} — {}", d.cause.as_str(), d.cause.label())?;
        writeln!(out, "  {}", d.summary)?;
        writeln!(out, "\nEvidence:")?;
        for e in &d.evidence {
            writeln!(out, "  - {e}")?;
        }
        writeln!(out, "\nFigures:")?;
        let f = &d.figures;
        for (label, v) in [
            ("requested", f.requested_bytes),
            ("GPU total capacity", f.total_capacity_bytes),
            ("GPU free", f.device_free_bytes),
            ("allowed (fraction cap)", f.allowed_bytes),
            ("allocated by PyTorch", f.allocated_bytes),
            ("reserved by PyTorch", f.reserved_bytes),
            ("reserved but unallocated", f.reserved_unallocated_bytes),
            ("largest free cached block", f.largest_free_block_bytes),
            ("this process (NVML)", f.this_process_bytes),
            ("outside the allocator", f.outside_allocator_bytes),
            ("other processes", f.other_processes_bytes),
        ] {
            if let Some(b) = v {
                writeln!(out, "  {label:<28} {:>12}", b.to_string())?;
            }
        }
        writeln!(out, "\nWhat to change (most useful first):")?;
        for (i, m) in d.remedies.iter().enumerate() {
            writeln!(out, "  {}. {}", i + 1, m.title)?;
            writeln!(out, "     {}", m.detail)?;
            if let Some(s) = &m.setting {
                writeln!(out, "     {s}")?;
            }
        }
    } else {
        writeln!(
            out,
            "Diagnosis: none — the snapshot records no out-of-memory error."
        )?;
    }
    if let Some(s) = &r.snapshot {
        writeln!(
            out,
            "\nSnapshot ({} trace entries, device {}):",
            s.trace_entries, s.device
        )?;
        writeln!(
            out,
            "  peak allocated {:>12}   (torch.cuda.max_memory_allocated)",
            s.peak_allocated_bytes.to_string()
        )?;
        writeln!(
            out,
            "  peak reserved  {:>12}   (torch.cuda.max_memory_reserved)",
            s.peak_reserved_bytes.to_string()
        )?;
        if let Some(m) = &s.segment_map {
            writeln!(
                out,
                "  at the {}: {} segments, {} free inside them, largest free block {}, fragmentation {:.0} %",
                m.at,
                m.segment_count,
                m.free_in_segments_bytes,
                m.largest_free_block_bytes,
                m.fragmentation * 100.0
            )?;
        }
        if let Some(o) = &r.planned_overlay {
            writeln!(
                out,
                "  planned peak allocated {} vs {} in the snapshot ({:+.1} %){}",
                Bytes(o.planned_peak_allocated_bytes),
                Bytes(o.snapshot_peak_allocated_bytes),
                o.peak_difference_percent,
                if o.peak_difference_percent < -20.0 {
                    ": the snapshot holds much more than the planned step (a kept graph, a \
                     leak, another model, or other settings than planned)"
                } else {
                    ""
                }
            )?;
        }
        writeln!(
            out,
            "  allocator: expandable_segments {}, max_split_size {}",
            s.expandable_segments,
            s.max_split_size_bytes
                .map_or("unlimited".to_string(), |b| b.to_string())
        )?;
        if !s.top_sites.is_empty() {
            writeln!(out, "  live at the peak, by allocation site:")?;
            for site in s.top_sites.iter().take(8) {
                writeln!(
                    out,
                    "    {:>12}  {:>5} blocks  {}",
                    site.bytes_at_peak.to_string(),
                    site.blocks_at_peak,
                    site.site
                )?;
            }
        }
    }
    if let Some(p) = &r.plan {
        match p.allowed_bytes {
            Some(c) => writeln!(
                out,
                "\nPlanner ({}, {} loop, on {} capped at {c} allowed):",
                p.model, p.loop_shape, p.capacity_bytes
            )?,
            None => writeln!(
                out,
                "\nPlanner ({}, {} loop, on {}):",
                p.model, p.loop_shape, p.capacity_bytes
            )?,
        }
        if let (Some(b), Some(n)) = (p.batch, p.predicted_nvidia_smi_bytes) {
            writeln!(out, "  batch {b} needs {n} (nvidia-smi)")?;
        }
        match p.max_batch {
            Some(m) => writeln!(out, "  largest micro-batch that fits: {m}")?,
            None => writeln!(out, "  even batch 1 does not fit")?,
        }
        if let (Some(b), Some(k)) = (p.batch, p.accumulation_for_batch) {
            writeln!(
                out,
                "  keep an effective batch of {b}: {k} accumulation steps of {}",
                b.div_ceil(k)
            )?;
        }
        for m in &p.remedies {
            writeln!(
                out,
                "  {:<36} {:>11}  {}",
                m.name,
                m.nvidia_smi_bytes.to_string(),
                if m.fits { "fits" } else { "does not fit" }
            )?;
        }
    }
    Ok(())
}
