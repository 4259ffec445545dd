//! `vramlab vllm`: vLLM's KV-cache capacity on a GPU (blocks, tokens, concurrency of
//! `--max-model-len` requests), the core's [`vramlab_core::answer::vllm`] as text or JSON.
//! Planned from vLLM's source, not measured: every output says so.

use std::io::Write;

use anyhow::{Context, Result};
use clap::Args;

use vramlab_core::answer::vllm::{PLANNED_NOTE, VllmArgs, capacity};
use vramlab_core::plan::DEFAULT_CUDA_CONTEXT;
use vramlab_core::plan::inference::setting::dtype_name;
use vramlab_words::parse_dtype;
use vramlab_words::train_words;

use super::args;

#[derive(Debug, Args)]
pub struct VllmCliArgs {
    /// Preset id, a config.json or a model folder / Hub id (as `plan --model`).
    #[arg(long)]
    pub model: String,
    /// Target GPU: a catalog id or name, or `detected` [default: rtx-4090].
    #[arg(long)]
    pub gpu: Option<String>,
    /// The weights' and KV cache's dtype: bf16, fp16 or fp32 [default: bf16].
    #[arg(long)]
    pub precision: Option<String>,
    /// vLLM's --gpu-memory-utilization.
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// vLLM's --max-model-len [default: the model's max_position_embeddings].
    #[arg(long, value_name = "L")]
    pub max_model_len: Option<u64>,
    /// vLLM's --block-size.
    #[arg(long, default_value_t = 16)]
    pub block_size: u64,
    /// vLLM's --max-num-seqs.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: u64,
    /// vLLM's --max-num-batched-tokens (the profiling forward's tokens).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn cmd_vllm(a: VllmCliArgs, out: &mut dyn Write) -> Result<()> {
    let preset = args::load_model(&a.model)?;
    let (gpu, _) = train_words::find_gpu(
        a.gpu.as_deref().unwrap_or(args::DEFAULT_GPU),
        &args::detect_gpu,
        &mut args::say,
    )
    .context("--gpu")?;
    let dtype = parse_dtype(a.precision.as_deref().unwrap_or("bf16")).context("--precision")?;
    let v = VllmArgs {
        gpu_memory_utilization: a.gpu_memory_utilization,
        max_model_len: a.max_model_len,
        block_size: a.block_size,
        max_num_seqs: a.max_num_seqs,
        max_num_batched_tokens: a.max_num_batched_tokens,
        dtype,
    };
    let c = capacity(&preset, v, gpu.memory(), DEFAULT_CUDA_CONTEXT)?;
    if a.json {
        let mut j = serde_json::to_value(&c)?;
        if let Some(o) = j.as_object_mut() {
            o.insert("gpu".into(), serde_json::json!(gpu.id));
            o.insert("dtype".into(), serde_json::json!(dtype_name(dtype)));
        }
        writeln!(out, "{}", serde_json::to_string(&j)?)?;
        return Ok(());
    }
    writeln!(
        out,
        "{} in vLLM on {} ({} total, {} dtype) — {PLANNED_NOTE}",
        c.model,
        gpu.name,
        c.total_bytes,
        dtype_name(dtype)
    )?;
    writeln!(
        out,
        "  requested   {:>12}   (total × gpu_memory_utilization {})",
        c.requested_bytes, a.gpu_memory_utilization
    )?;
    writeln!(out, "  weights     {:>12}", c.weights_bytes)?;
    writeln!(
        out,
        "  activations {:>12}   (profiling forward of {} tokens, approximated)",
        c.activation_peak_bytes, a.max_num_batched_tokens
    )?;
    writeln!(
        out,
        "  sampler     {:>12}   (approximated)",
        c.sampler_bytes
    )?;
    writeln!(
        out,
        "  non-torch   {:>12}   (CUDA context)",
        c.non_torch_bytes
    )?;
    writeln!(out, "  KV cache    {:>12}", c.available_kv_bytes)?;
    writeln!(
        out,
        "  {} blocks of {} tokens ({} bytes per block per layer, {} layers): {} tokens",
        c.num_blocks, a.block_size, c.page_size_bytes, c.num_layers, c.kv_tokens
    )?;
    if c.starts {
        writeln!(
            out,
            "  max concurrency for {}-token requests: {:.2}x",
            c.max_model_len, c.max_concurrency
        )?;
    } else {
        writeln!(
            out,
            "  vLLM would refuse to start: one {}-token request needs more KV cache than is \
             left; estimated maximum model length {} (--max-model-len)",
            c.max_model_len,
            c.estimated_max_model_len.unwrap_or(0)
        )?;
    }
    writeln!(
        out,
        "  CUDA graphs are captured after the KV cache, outside this budget (vLLM V1 as read)"
    )?;
    Ok(())
}
