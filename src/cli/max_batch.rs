//! `vramlab max-batch`: the core's [`MaxBatchReport`] as text or JSON; exit status
//! [`EXIT_NOTHING_FITS`] when even batch 1 does not fit.

use std::io::Write;

use anyhow::Result;
use clap::Args;

use vramlab_core::answer::max_batch::{BatchOne, MaxBatchReport, Outcome};
use vramlab_words::train_words;

use super::args::{self, TrainArgs};
use super::exit::{EXIT_NOTHING_FITS, Exit};

#[derive(Debug, Args)]
pub struct MaxBatchArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// Effective batch to reach with accumulation (prints the steps needed).
    #[arg(long)]
    pub target_batch: Option<u64>,
}

pub fn cmd_max_batch(a: MaxBatchArgs, out: &mut dyn Write) -> Result<()> {
    if super::infer::is_inference(&a.train) {
        return super::infer::cmd_max_batch(&a.train, out);
    }
    super::infer::refuse_decoding_flags(&a.train)?;
    let report = a.train.words_loaded()?.0.max_batch_report(
        a.target_batch,
        &args::detect_gpu,
        &mut args::say,
    )?;
    let l = match &report.outcome {
        Outcome::NothingFits(b) => return nothing_fits(a.train.json, &report, b, out),
        Outcome::Fits(l) => l,
    };
    train_words::check_target_batch(&report, a.target_batch)?;
    if a.train.json {
        writeln!(out, "{}", serde_json::to_string(&report)?)?;
        return Ok(());
    }
    let (m, p) = (l.max_batch, &l.plan);
    let on_gpu = l.nvidia_smi_on_gpu.unwrap_or(p.nvidia_smi_bytes);
    writeln!(
        out,
        "{} on {}: largest micro-batch {} ({} of {} usable)",
        report.model,
        report.gpu.name,
        m,
        on_gpu,
        report.budget.usable()
    )?;
    writeln!(
        out,
        "judged at the upper edge of the measured reserved band: {}",
        report.band_note
    )?;
    writeln!(out, "training loop: {}", report.loop_shape.describe())?;
    if p.config.step.is_eval() {
        writeln!(
            out,
            "step planned: {} (training at the same batch before it)",
            p.config.step.describe()
        )?;
    }
    if p.nvidia_smi_bytes > on_gpu {
        writeln!(
            out,
            "(peak allocated {}; with unlimited memory the cache would grow to {}: \
             on this GPU {}{})",
            p.peak_allocated_bytes,
            p.peak_reserved_bytes,
            super::plan_text::RUNS_BY_FREEING_CACHE,
            super::plan_text::RETRIES_COUNTED
        )?;
    }
    if let Some((t, k)) = l.target {
        writeln!(
            out,
            "effective batch {t}: micro-batch {m} × {k} accumulation steps"
        )?;
    }
    Ok(())
}

/// `max-batch` when even batch 1 does not fit: its requirement and the shortfall, then exit
/// status [`EXIT_NOTHING_FITS`].
fn nothing_fits(json: bool, r: &MaxBatchReport, b: &BatchOne, out: &mut dyn Write) -> Result<()> {
    let (model, gpu) = (&r.model, &r.gpu);
    if json {
        writeln!(out, "{}", serde_json::to_string(r)?)?;
    } else {
        writeln!(
            out,
            "{model} does not fit on {} even at batch 1: batch 1 needs {} (nvidia-smi; peak \
             allocated {}) of {} usable, {} short",
            gpu.name,
            b.plan.nvidia_smi_bytes,
            b.plan.peak_allocated_bytes,
            r.budget.usable(),
            b.shortfall
        )?;
        writeln!(
            out,
            "to search combinations of remedies that fit (precision, checkpointing, LoRA, \
             optimizer, micro-batch with accumulation): {}",
            b.fit_command
        )?;
    }
    Err(Exit {
        code: EXIT_NOTHING_FITS,
        message: format!(
            "nothing fits: {model} at batch 1 is {} over {}",
            b.shortfall, gpu.name
        ),
    }
    .into())
}
