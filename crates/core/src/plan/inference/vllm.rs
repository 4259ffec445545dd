//! vLLM's KV-cache capacity (`vramlab vllm`): the KV-cache blocks and tokens vLLM's V1 engine
//! would allocate on a GPU and the concurrency of `max_model_len`-token requests, computed as
//! vLLM computes them. **Planned from vLLM's source, not measured** (vLLM does not run on the
//! project's GPU). Read from github.com/vllm-project/vllm:
//!
//! - `vllm/v1/worker/gpu_worker.py` at 0012cf691b7e (`Worker.determine_available_memory`):
//!   `available = total_gpu_memory × gpu_memory_utilization − peak`, where `peak` is
//!   `allocated_bytes.all.peak` over `model_runner.profile_run()` (the weights, already
//!   loaded, plus the dummy forward of `max_num_batched_tokens` tokens and the sampler's dummy
//!   run) plus the memory allocated outside torch (`mem_get_info` used − torch's allocated:
//!   the CUDA context; NCCL with tensor parallelism). CUDA graphs are captured after the KV
//!   cache is allocated (`compile_or_warm_up_model`), outside this budget, in that version.
//! - `vllm/v1/worker/gpu_model_runner.py` (`profile_run`): `_dummy_run(max_num_tokens)` split
//!   into `min(max_num_seqs, max_num_batched_tokens)` requests, attention without a KV
//!   cache, then `_dummy_sampler_run` over one row per request (`compute_logits`, then the
//!   sampler's fp32 logits).
//! - `vllm/v1/core/kv_cache_utils.py` at 001cabc1be16: `get_num_blocks`: `available //
//!   page_size // num_layers` with `page_size = 2 × block_size × num_kv_heads × head_size ×
//!   dtype bytes` (`FullAttentionSpec.page_size_bytes`); `get_max_concurrency_for_kv_cache_config`:
//!   `num_blocks / cdiv(max_model_len, block_size)` for one group of full-attention layers;
//!   `_check_enough_kv_cache_memory`: vLLM refuses to start when one `max_model_len` request
//!   does not fit, and `estimate_max_model_len` says the longest that would.
//!
//! Approximated: the profiling forward's activation peak is this project's prefill plan of
//! the same tokens (`plan::inference`, transformers' forward: padded `[batch, tokens]`
//! instead of vLLM's flattened tokens, SDPA instead of vLLM's attention backend, the last
//! position's logits only) less its `DynamicCache` (vLLM's profiling forward writes no KV
//! cache); the sampler's run as the logits in the model dtype plus two fp32 copies
//! (`[rows, vocab]`). Models with sliding-window layers (vLLM's hybrid KV-cache groups) are
//! refused.

use serde::Serialize;

use super::{DecoderShape, InferConfig, InferPlanner};
use crate::model::Preset;
use crate::plan::PlanError;
use crate::plan::config::DType;
use crate::units::Bytes;

/// What every output of this answer says.
pub const PLANNED_NOTE: &str = "planned from vLLM's source, not measured";

/// The vLLM sources this answer mirrors.
pub const VLLM_SOURCE: &str = "vllm-project/vllm V1 engine: v1/worker/gpu_worker.py @0012cf691b7e \
     (determine_available_memory), v1/core/kv_cache_utils.py @001cabc1be16 (get_num_blocks, \
     get_max_concurrency_for_kv_cache_config)";

/// vLLM's engine arguments that size the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VllmArgs {
    /// `--gpu-memory-utilization` (vLLM's default 0.9).
    pub gpu_memory_utilization: f64,
    /// `--max-model-len`; `None`: the model's `max_position_embeddings`.
    pub max_model_len: Option<u64>,
    /// `--block-size` (16).
    pub block_size: u64,
    /// `--max-num-seqs` (256).
    pub max_num_seqs: u64,
    /// `--max-num-batched-tokens` (8192, the OpenAI server's default with chunked prefill).
    pub max_num_batched_tokens: u64,
    /// `--dtype` of the weights and the KV cache (`kv_cache_dtype="auto"`).
    #[serde(skip)]
    pub dtype: DType,
}

impl Default for VllmArgs {
    fn default() -> Self {
        VllmArgs {
            gpu_memory_utilization: 0.9,
            max_model_len: None,
            block_size: 16,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            dtype: DType::BF16,
        }
    }
}

/// vLLM's KV-cache capacity on one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct VllmCapacity {
    /// [`PLANNED_NOTE`].
    pub note: &'static str,
    /// [`VLLM_SOURCE`].
    pub vllm_source: &'static str,
    pub model: String,
    pub args: VllmArgs,
    pub max_model_len: u64,
    /// `torch.cuda.mem_get_info()`'s total.
    pub total_bytes: Bytes,
    /// total × gpu_memory_utilization.
    pub requested_bytes: Bytes,
    pub weights_bytes: Bytes,
    /// The profiling forward's peak above the weights (approximated, see the module).
    pub activation_peak_bytes: Bytes,
    /// The sampler's dummy run (approximated).
    pub sampler_bytes: Bytes,
    /// Memory outside torch: the CUDA context.
    pub non_torch_bytes: Bytes,
    /// weights + activation peak + sampler + non-torch.
    pub non_kv_peak_bytes: Bytes,
    /// requested − non-KV peak (0 when negative: vLLM refuses to start).
    pub available_kv_bytes: Bytes,
    pub num_layers: u64,
    /// One block of one layer: 2 × block_size × kv_heads × head_size × dtype bytes.
    pub page_size_bytes: u64,
    pub num_blocks: u64,
    /// num_blocks × block_size: token slots of every layer.
    pub kv_tokens: u64,
    /// cdiv(max_model_len, block_size).
    pub blocks_per_request: u64,
    /// num_blocks / blocks_per_request: concurrent `max_model_len`-token requests.
    pub max_concurrency: f64,
    /// Whether one `max_model_len` request fits (else vLLM raises a ValueError at start).
    pub starts: bool,
    /// `estimate_max_model_len` when it does not: the longest that would fit.
    pub estimated_max_model_len: Option<u64>,
}

fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// vLLM's KV-cache capacity of `preset` on a GPU of `total` bytes (`mem_get_info`'s total)
/// with `context` bytes of CUDA context. Errors name the field.
pub fn capacity(
    preset: &Preset,
    args: VllmArgs,
    total: Bytes,
    context: Bytes,
) -> Result<VllmCapacity, PlanError> {
    let shape = DecoderShape::of(preset)?;
    if shape.windows.iter().any(Option::is_some) {
        return Err(PlanError::Field {
            field: "model",
            reason: format!(
                "{} has sliding-window layers, which vLLM keeps in hybrid KV-cache groups; \
                 only models whose every layer attends to the whole context are planned",
                preset.id
            ),
        });
    }
    let u = args.gpu_memory_utilization;
    if !(u > 0.0 && u <= 1.0) {
        return Err(PlanError::Field {
            field: "gpu_memory_utilization",
            reason: format!("{u} is not in (0, 1]; vLLM's default is 0.9"),
        });
    }
    if args.block_size == 0 {
        return Err(PlanError::Field {
            field: "block_size",
            reason: "must be at least 1; vLLM's default is 16".into(),
        });
    }
    if args.max_num_seqs == 0 || args.max_num_batched_tokens == 0 {
        return Err(PlanError::Field {
            field: if args.max_num_seqs == 0 {
                "max_num_seqs"
            } else {
                "max_num_batched_tokens"
            },
            reason: "must be at least 1 (defaults: 256 sequences, 8192 tokens)".into(),
        });
    }
    let max_pos = shape.max_positions;
    let max_model_len = args.max_model_len.unwrap_or(max_pos);
    if max_model_len == 0 || max_model_len > max_pos {
        return Err(PlanError::Field {
            field: "max_model_len",
            reason: format!(
                "{max_model_len} is not in 1..={max_pos} ({}'s max_position_embeddings)",
                preset.id
            ),
        });
    }
    let d = args.dtype.size();
    // the profiling forward: max_num_batched_tokens tokens as whole prompts of at most
    // max_model_len (transformers' padded batch; vLLM flattens them)
    let tokens = args.max_num_batched_tokens;
    let prompt = tokens.min(max_model_len.min(max_pos - 1));
    let batch = ceil_div(tokens, prompt);
    let cfg = InferConfig::generate(batch, prompt, 1, args.dtype);
    let planner = InferPlanner::new(preset, &cfg)?;
    let plan = planner.plan(batch)?;
    let activation = plan
        .peak_allocated_bytes
        .saturating_sub(plan.weights_bytes)
        .saturating_sub(plan.kv_cache_bytes);
    let rows = args.max_num_seqs.min(tokens);
    let sampler = Bytes(rows * shape.vocab * (d + 2 * 4));
    let requested = Bytes((total.0 as f64 * u) as u64);
    let non_kv = Bytes(plan.weights_bytes.0 + activation.0 + sampler.0 + context.0);
    let available = requested.saturating_sub(non_kv);
    let page = 2 * args.block_size * shape.kv_heads * shape.head_dim * d;
    let layers = shape.layers;
    let num_blocks = available.0 / page / layers;
    let blocks_per_request = ceil_div(max_model_len, args.block_size);
    let starts = available.0 > 0 && layers * blocks_per_request * page <= available.0;
    let estimated = (!starts).then(|| (available.0 / (page * layers)) * args.block_size);
    Ok(VllmCapacity {
        note: PLANNED_NOTE,
        vllm_source: VLLM_SOURCE,
        model: preset.id.clone(),
        args,
        max_model_len,
        total_bytes: total,
        requested_bytes: requested,
        weights_bytes: plan.weights_bytes,
        activation_peak_bytes: activation,
        sampler_bytes: sampler,
        non_torch_bytes: context,
        non_kv_peak_bytes: non_kv,
        available_kv_bytes: available,
        num_layers: layers,
        page_size_bytes: page,
        num_blocks,
        kv_tokens: num_blocks * args.block_size,
        blocks_per_request,
        max_concurrency: num_blocks as f64 / blocks_per_request as f64,
        starts,
        estimated_max_model_len: estimated,
    })
}
