//! `vramlab plan`'s text: the plan report ([`PlanReport`], computed in the core) as lines
//! for people — the configuration, the peaks and their breakdown, the verdict with its
//! measured band, the remedies and, when nothing fits, the next step.

use std::io::Write;

use anyhow::Result;

use vramlab_core::answer::next_step::NextStep;
use vramlab_core::answer::{PlanReport, Verdict};
use vramlab_core::plan::finetune::FineTuneMode;
use vramlab_core::plan::gpus::Gpu;
use vramlab_core::plan::remedies::Remedy;
use vramlab_core::plan::search::Budget;
use vramlab_core::plan::{Attention, Plan, TrainConfig};
use vramlab_core::units::Bytes;

/// Said of a plan that runs on its GPU only through the caching allocator's free-and-retry
/// (`max-batch`, `max-context`, an inference `plan`).
pub(super) const RUNS_BY_FREEING_CACHE: &str =
    "it runs only because PyTorch frees its cached blocks and retries before it runs out, slower";
/// What follows it where the batch is the user's to change.
pub(super) const RETRIES_COUNTED: &str =
    " — num_alloc_retries counts it; a smaller batch avoids it";

/// Writes `r` as `vramlab plan` prints it. When the next step's fit search failed, its
/// error comes after the remedies are written.
pub fn write(out: &mut dyn Write, r: &PlanReport) -> Result<()> {
    let max = r.max_batch.clone()?;
    let fixes = r.remedies.as_ref().map_err(Clone::clone)?;
    let mut extra = Vec::new();
    if !r.assumed.is_empty() {
        extra.push(format!(
            "assumed (not given): {}",
            r.assumed
                .iter()
                .map(|a| format!("{} {}", a.setting, a.value))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    extra.extend(r.warnings.iter().map(|w| format!("warning: {w}")));
    if let Some(p) = &r.per_rank {
        extra.extend(super::dist_plan::lines(p, r.config()));
    }
    write_plan(out, &r.plan, &r.gpu, r.budget, &r.verdict, max, &extra)?;
    write_remedies(out, &r.plan, fixes)?;
    match &r.next_step {
        Some(n) => write_next_step(out, n),
        None => Ok(()),
    }
}

/// The what-if table: remedies first, then the changes that add memory (costs).
fn write_remedies(out: &mut dyn Write, plan: &Plan, fixes: &[Remedy]) -> Result<()> {
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
    for r in fixes {
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
    Ok(())
}

/// When neither the plan nor any single remedy fits: the best answer of the fit search in
/// one line, the `vramlab fit` command for the rest, and LoRA / QLoRA where they apply.
fn write_next_step(out: &mut dyn Write, n: &NextStep) -> Result<()> {
    let s = match &n.search {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err(e.clone().into()),
        None => return Ok(()),
    };
    writeln!(out, "\nNext step: no single remedy fits.")?;
    match &s.best {
        Some(c) => writeln!(
            out,
            "  best combination: {} — {} nvidia-smi, {:.2} ms/sample",
            c.summary(),
            c.nvidia_smi,
            c.time.ms_per_sample
        )?,
        None => writeln!(out, "  no combination fits either: {}", s.reason)?,
    }
    writeln!(
        out,
        "  the ranked list and each change's cost: {}",
        n.fit_command
    )?;
    if s.adapters_apply {
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
fn write_finetune(out: &mut dyn Write, c: &TrainConfig, plan: &Plan) -> Result<()> {
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
                FineTuneMode::Qlora => format!(
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

/// The plan, its verdict and band, and the largest micro-batch (`extra`: lines under the
/// configuration).
fn write_plan(
    out: &mut dyn Write,
    plan: &Plan,
    gpu: &Gpu,
    budget: Budget,
    verdict: &Verdict,
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
        if c.attention == Attention::Eager {
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

fn pct(part: Bytes, whole: Bytes) -> f64 {
    if whole.0 == 0 {
        0.0
    } else {
        100.0 * part.0 as f64 / whole.0 as f64
    }
}
