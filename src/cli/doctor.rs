//! `vramlab doctor`: reads an OOM message and/or a memory snapshot, prints the diagnosis,
//! and with `--model …` adds what the planner says (the batch that fits, planned remedies).

use std::io::Write;
use std::path::{Path, PathBuf};

use super::args::{TrainArgs, load_model, resolve_model};
use anyhow::{Context, Result, bail};
use clap::Args;
use vramlab_core::answer::doctor_advice::{PlanAdvice, advise};
pub use vramlab_core::answer::doctor_report::{self, DoctorReport};
use vramlab_core::doctor::SnapshotReport;
use vramlab_core::units::Bytes;

#[derive(Debug, Args, Clone, Default)]
pub struct DoctorArgs {
    /// A file as it comes: a memory snapshot (`torch.cuda.memory._dump_snapshot`'s pickle), a
    /// saved bench run (`.run.json`) or the OOM error text; "-" reads the text from standard
    /// input. Told apart by their first byte (a pickle's protocol marker, a JSON object).
    #[arg(value_name = "FILE", conflicts_with_all = ["message", "message_file", "snapshot", "run"])]
    pub file: Option<PathBuf>,
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
    /// Model, as for `plan --model` (a preset, a file, a model folder or a Hub id
    /// ORG/NAME[@REVISION]), to add the planner's answer (largest batch, remedies).
    #[arg(long)]
    pub model: Option<String>,
    /// The micro-batch that ran out of memory.
    #[arg(long)]
    pub batch: Option<u64>,
    /// With --model: the precision of the step that failed, as for `plan`.
    #[arg(long, default_value = "amp-bf16")]
    pub precision: String,
    /// With --model: the optimizer, as for `plan`.
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// With --model: the sequence length (token models).
    #[arg(long)]
    pub seq: Option<u64>,
    /// With --model: the image side in pixels (image models).
    #[arg(long)]
    pub image: Option<u64>,
    /// With --model: gradient accumulation steps.
    #[arg(long, default_value_t = 1)]
    pub accum: u64,
    /// With --model: activation checkpointing was on.
    #[arg(long)]
    pub checkpointing: bool,
    /// With --model: the attention kernel, as for `plan`.
    #[arg(long, default_value = "sdpa")]
    pub attention: String,
    /// Training-loop shape, as for `plan`: plain (the output stays referenced through
    /// backward, the default) or trainer (`loss = model(**batch).loss`, HF Trainer, Lightning).
    #[arg(long = "loop", value_name = "plain|trainer|lightning")]
    pub loop_shape: Option<String>,
    /// The step that failed: train (default), eval (validation under `no_grad`) or eval-grad
    /// (validation without `no_grad`).
    #[arg(long, value_name = "train|eval|eval-grad")]
    pub step: Option<String>,
    /// Catalog GPU (default: the message's total capacity).
    #[arg(long)]
    pub gpu: Option<String>,
    /// With --model: the safety margin the planner's answer keeps (a fraction of the GPU).
    #[arg(long, default_value_t = 0.05)]
    pub margin: f64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
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
        do_sample: false,
        temperature: None,
        top_k: None,
        top_p: None,
        num_beams: None,
        device_map: None,
        max_gpu_memory: None,
        max_cpu_memory: None,
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
        int8_outliers: None,
        fp32_cpu_offload: false,
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
        (Some(g), _) => vramlab_words::find_gpu(g.trim()).context("--gpu")?.memory(),
        (None, Some(c)) => c,
        (None, None) => {
            bail!("--model: give --gpu (no GPU capacity is known from the message or snapshot)")
        }
    };
    check_margin(a.margin)?;
    Ok(Some(advise(
        &preset, cfg, capacity, allowed, a.margin, a.batch,
    )?))
}

/// `--margin`: a fraction in [0, 1).
fn check_margin(margin: f64) -> Result<()> {
    if !(0.0..1.0).contains(&margin) {
        bail!("--margin: must be a fraction in [0, 1), got {margin}");
    }
    Ok(())
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
    check_margin(margin)?;
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
    Ok(doctor_report::load_snapshot(path, device, progress)?)
}

/// What a positional `FILE` is, from its first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileKind {
    Snapshot,
    Run,
    Message,
}

/// Reads the first non-blank byte of `path` ("-": the message on standard input).
fn file_kind(path: &Path) -> Result<FileKind> {
    use std::io::Read;
    if path.as_os_str() == "-" {
        return Ok(FileKind::Message);
    }
    let mut head = [0u8; 64];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .with_context(|| format!("doctor: reading {}", path.display()))?;
    // Pickle protocol 2 and later start with PROTO (0x80); `_dump_snapshot` writes 4 or 5.
    Ok(match head[..n].iter().find(|b| !b.is_ascii_whitespace()) {
        Some(0x80) => FileKind::Snapshot,
        Some(b'{') => FileKind::Run,
        _ => FileKind::Message,
    })
}

/// `a` with its positional `FILE` moved to the option its kind takes.
fn with_file_placed(a: &DoctorArgs) -> Result<DoctorArgs> {
    let mut a = a.clone();
    if let Some(f) = a.file.take() {
        match file_kind(&f)? {
            FileKind::Snapshot => a.snapshot = Some(f),
            FileKind::Run => a.run = Some(f),
            FileKind::Message => a.message_file = Some(f),
        }
    }
    Ok(a)
}

/// Builds the report from the arguments (no printing).
pub fn report(a: &DoctorArgs) -> Result<DoctorReport> {
    let a = &with_file_placed(a)?;
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
        bail!(
            "doctor: give a FILE (a snapshot, a bench run or the OOM text), --message TEXT, \
             --message-file FILE, --snapshot FILE or --run FILE"
        );
    }
    let message = match &text {
        Some(t) => Some(doctor_report::parse_message(t)?),
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
    let capacity = message.as_ref().and_then(|m| m.total_capacity_bytes);
    let allowed = message.as_ref().and_then(|m| m.allowed_bytes);
    let plan = match run_plan {
        Some(p) => Some(p),
        None => plan_advice(a, capacity, allowed)?,
    };
    Ok(DoctorReport::new(message, snapshot, plan))
}

/// `vramlab doctor`.
pub fn cmd_doctor(a: DoctorArgs, out: &mut dyn Write) -> Result<()> {
    let r = report(&a)?;
    if a.json {
        let r = if a.timeline { r } else { r.without_timelines() };
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
        for (label, b) in d.figures.labelled() {
            writeln!(out, "  {label:<28} {:>12}", b.to_string())?;
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
