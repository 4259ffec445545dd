//! `vramlab max-context`: the longest prompt (with `--new-tokens` fixed) or, with `--prompt`,
//! the most new tokens of an inference call that fits a GPU at `--batch`: the core's
//! [`vramlab_core::answer::max_context`] as text or JSON.

use std::io::Write;

use anyhow::{Result, bail};
use clap::Args;

use vramlab_core::answer::max_context::{MaxContext, Searched, Weights, max_context_weights};
use vramlab_core::plan::inference::InferStep;

use super::args::{self, TrainArgs};
use super::exit::{EXIT_NOTHING_FITS, Exit};

#[derive(Debug, Args)]
pub struct MaxContextArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// Sequences in the batch [default: 1].
    #[arg(long, allow_negative_numbers = true, value_parser = args::parse_batch)]
    pub batch: Option<u64>,
    /// Fix the prompt at P tokens and search the new tokens (--step generate); without it
    /// the prompt is searched with --new-tokens fixed.
    #[arg(long, value_name = "P")]
    pub prompt: Option<u64>,
}

pub fn cmd_max_context(a: MaxContextArgs, out: &mut dyn Write) -> Result<()> {
    let mut t = a.train.clone();
    if t.seq.is_some() {
        bail!(
            "--seq: max-context searches the prompt length; to fix the prompt and search the \
             new tokens give --prompt P"
        );
    }
    let step: InferStep = match t.step.as_deref() {
        None => InferStep::Generate,
        Some(s) => vramlab_words::parse(s).map_err(|_| {
            anyhow::anyhow!(
                "--step: max-context plans inference calls: generate (the default) or prefill, \
                 not `{s}`"
            )
        })?,
    };
    t.step = Some(step.as_str().into());
    let searched = match a.prompt {
        Some(p) => {
            if step == InferStep::Prefill {
                bail!(
                    "--prompt: a prefill has no new tokens to search; leave --prompt out to \
                     search the prompt"
                );
            }
            if t.new_tokens.is_some() {
                bail!(
                    "--new-tokens: with --prompt the new tokens are what is searched; give one \
                     of --prompt P (search new tokens) or --new-tokens N (search the prompt)"
                );
            }
            if p == 0 {
                bail!("--prompt: the prompt must have at least 1 token");
            }
            t.seq = Some(p);
            t.new_tokens = Some(1);
            Searched::NewTokens
        }
        None => {
            t.seq = Some(1);
            Searched::Prompt
        }
    };
    let batch = a.batch.unwrap_or(1);
    let (preset, cfg, dec, quant) = super::infer::resolve_quant(&t, batch)?;
    let weights = match super::infer::device_map_budget(&t)? {
        Some(m) => match quant {
            Some(q) => Weights::QuantDeviceMap {
                max_memory: m,
                quant: q,
                fp32_cpu_offload: super::infer::fp32_cpu_offload(&t)?,
                outliers: super::infer::int8_outliers(&t, quant)?,
            },
            None => Weights::DeviceMap(m),
        },
        None => Weights::OnGpu {
            quant,
            outliers: super::infer::int8_outliers(&t, quant)?,
        },
    };
    let (gpu, budget) = t.budget()?;
    let m = max_context_weights(&preset, &cfg, &dec, weights, searched, budget)
        .map_err(super::infer::flag_error)?;
    if t.json {
        let v = vramlab_core::answer::inference_json::max_context(
            &m, step, batch, &gpu, budget, &dec, quant,
        )?;
        writeln!(out, "{}", serde_json::to_string(&v)?)?;
    } else {
        write_text(out, &m, &gpu.name, budget.usable(), batch)?;
    }
    if m.max_length.is_none() {
        return Err(Exit {
            code: EXIT_NOTHING_FITS,
            message: format!(
                "nothing fits: {} at batch {batch} with 1 token of {} is over {}",
                m.model,
                m.searched.as_str(),
                gpu.name
            ),
        }
        .into());
    }
    Ok(())
}

fn write_text(
    out: &mut dyn Write,
    m: &MaxContext,
    gpu: &str,
    usable: vramlab_core::units::Bytes,
    batch: u64,
) -> Result<()> {
    let (what, fixed) = match (m.searched, m.plan.as_ref()) {
        (Searched::Prompt, Some(p)) => (
            "longest prompt",
            format!("{} new tokens", p.config.new_tokens),
        ),
        (Searched::NewTokens, Some(p)) => {
            ("most new tokens", format!("prompt {}", p.config.prompt))
        }
        (Searched::Prompt, None) => ("longest prompt", String::new()),
        (Searched::NewTokens, None) => ("most new tokens", String::new()),
    };
    let (Some(l), Some(p)) = (m.max_length, m.plan.as_ref()) else {
        writeln!(
            out,
            "{}: even 1 token does not fit at batch {batch} on {gpu} ({usable} usable)",
            m.model
        )?;
        return Ok(());
    };
    writeln!(
        out,
        "{}: {what} for {} at batch {batch} ({fixed}) on {gpu} ({usable} usable): {l} \
         ({} nvidia-smi, KV cache {})",
        m.model,
        p.config.step,
        m.nvidia_smi_on_gpu_bytes.unwrap_or(p.nvidia_smi_bytes),
        p.kv_cache_bytes
    )?;
    if let Some(pl) = &p.device_map {
        let o = &pl.offload;
        writeln!(
            out,
            "device_map: {} of {} layers on GPU 0, {} on cpu, {} on disk (weights on GPU 0 {})",
            o.layers_gpu,
            o.layers,
            o.layers_cpu,
            o.layers_disk,
            vramlab_core::units::Bytes(o.gpu_bytes)
        )?;
    }
    if let Some(q) = p.quant {
        writeln!(
            out,
            "quantized linears: {} (weights {})",
            vramlab_core::plan::inference::quant::describe(q),
            p.weights_bytes
        )?;
    }
    if m.nvidia_smi_on_gpu_bytes
        .is_some_and(|b| b < p.nvidia_smi_bytes)
    {
        writeln!(
            out,
            "(peak allocated {}; with unlimited memory the cache would grow to {} nvidia-smi: \
             on this GPU {})",
            p.peak_allocated_bytes,
            p.nvidia_smi_bytes,
            super::plan_text::RUNS_BY_FREEING_CACHE
        )?;
    }
    if let Some(words) = m.limit_words() {
        writeln!(out, "{words}")?;
    }
    Ok(())
}
