//! Inference (issue 29): the GPU memory of `model.generate()` and of a plain forward under
//! `torch.no_grad()` for the decoders of the Llama lineage, simulated op by op through the
//! same caching-allocator model as training steps.
//!
//! - [`setting`]: what is planned (`InferConfig`: step, batch, prompt, new tokens, dtype,
//!   attention, KV cache);
//! - [`shape`]: the decoder's sizes and what is refused as not modelled yet;
//! - [`kv`]: the KV cache's tokens per layer and bytes;
//! - [`forward`] and [`attention`]: one forward's allocations, op by op;
//! - [`decoding`]: greedy decoding or multinomial sampling (the logits warpers);
//! - [`device_map`]: `device_map="auto"`: which modules accelerate puts on GPU 0, the CPU
//!   or disk, and the weights an offloaded module copies to the GPU at each call;
//! - [`call`]: weights, prompt, the warm-up and the measured `generate` / forward;
//! - [`program`]: the event list under construction;
//! - [`quant`]: bitsandbytes-quantized weights (nf4 / fp4, LLM.int8): loading and the
//!   quantized projections;
//! - [`trace`]: the measured call's memory over its forwards (the GUI's timeline).
//!
//! The model is loaded directly in its dtype (`from_pretrained(..., dtype=...)`) and runs in
//! `model.eval()`; nothing trains, so there are no gradients, optimizer state or autocast
//! copies.

pub mod attention;
pub mod call;
pub mod decoding;
pub mod device_map;
pub mod forward;
pub mod kv;
pub mod linear;
pub mod moe;
pub mod outliers;
pub mod program;
pub mod quant;
pub mod setting;
pub mod shape;
pub mod trace;
pub mod vllm;

use std::borrow::Cow;

use serde::Serialize;

pub use decoding::Decoding;
pub use setting::{InferConfig, InferStep, KvCache};
pub use shape::DecoderShape;
pub use trace::TracePoint;

use super::events::{Category, Events};
use super::search::Budget;
use super::{DEFAULT_CUDA_CONTEXT, PlanError, Share, eval};
use crate::model::Preset;
use crate::model::families::transformer::AttnImpl;
use crate::plan::config::Attention;
use crate::plan::policy::QuantStorage;
use crate::units::Bytes;
use quant::QuantModel;

/// The prediction for one inference call.
#[derive(Debug, Clone, Serialize)]
pub struct InferPlan {
    pub model: String,
    pub model_type: String,
    pub params: u64,
    pub config: InferConfig,
    /// The decoding settings of a `generate` that is not greedy (absent for greedy decoding
    /// and a prefill).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decoding: Option<Decoding>,
    /// The bitsandbytes quantization of the linears (absent: every weight in the dtype).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quant: Option<QuantStorage>,
    /// `torch.cuda.max_memory_allocated()` over the measured call.
    pub peak_allocated_bytes: Bytes,
    /// `torch.cuda.max_memory_reserved()` over the measured call.
    pub peak_reserved_bytes: Bytes,
    /// What `nvidia-smi` shows for the process: reserved + CUDA context.
    pub nvidia_smi_bytes: Bytes,
    pub cuda_context_bytes: Bytes,
    /// The KV cache at its largest (all layers, the whole batch).
    pub kv_cache_bytes: Bytes,
    /// The weights (and the model's buffers) in their dtype (quantized linears as
    /// bitsandbytes stores them); with a device map, those that stay on GPU 0.
    pub weights_bytes: Bytes,
    /// Where the peak is: `prefill` or `decode step k`.
    pub peak_at: String,
    /// Bytes per category at the peak, then allocator overhead and CUDA context.
    pub breakdown: Vec<Share>,
    /// `device_map="auto"`: where accelerate puts each module (`device_map`, in its naming)
    /// and the bytes per device (`offload`); both absent without a device map.
    #[serde(flatten)]
    pub device_map: Option<device_map::Placement>,
}

/// A model + inference config with its event list built once; evaluating a batch is a pass
/// of the allocator model.
#[derive(Debug, Clone)]
pub struct InferPlanner {
    pub model: String,
    pub shape: DecoderShape,
    pub config: InferConfig,
    /// How `generate` picks tokens (greedy unless built by [`InferPlanner::with_decoding`]).
    pub decoding: Decoding,
    pub params: u64,
    pub weights: Bytes,
    /// The events at `config.batch` (a quantized model's 4-bit kernels depend on the batch:
    /// [`InferPlanner::events_at`]).
    pub events: Events,
    pub context: Bytes,
    /// `device_map="auto"`'s placement (`None`: the whole model on the GPU).
    pub placement: Option<device_map::Placement>,
    /// The bitsandbytes-quantized model ([`quant`]), `None` for weights in the dtype.
    pub quant: Option<QuantModel>,
    /// Parameter and fp32 buffer elements, to rebuild a quantized model's events.
    param_elems: Vec<u64>,
    buffer_elems: Vec<u64>,
}

impl InferPlanner {
    /// Builds the event list of `cfg` (its batch is a default for [`InferPlanner::plan`]).
    pub fn new(preset: &Preset, cfg: &InferConfig) -> Result<InferPlanner, PlanError> {
        InferPlanner::with_decoding(preset, cfg, &Decoding::default())
    }

    /// [`InferPlanner::new`] for a `generate` decoding with `dec` (greedy or multinomial
    /// sampling; beam search is refused).
    pub fn with_decoding(
        preset: &Preset,
        cfg: &InferConfig,
        dec: &Decoding,
    ) -> Result<InferPlanner, PlanError> {
        InferPlanner::with_quant(preset, cfg, dec, None)
    }

    /// [`InferPlanner::with_decoding`] of a model loaded with `quantization_config`
    /// (`quant`: bitsandbytes nf4 / fp4 with or without double quantization, or LLM.int8;
    /// `None`: the weights in the dtype).
    pub fn with_quant(
        preset: &Preset,
        cfg: &InferConfig,
        dec: &Decoding,
        quant: Option<QuantStorage>,
    ) -> Result<InferPlanner, PlanError> {
        cfg.validate()?;
        dec.validate()?;
        if cfg.step == InferStep::Prefill && !dec.is_greedy() {
            return Err(PlanError::Field {
                field: "do_sample",
                reason: "a prefill picks no token; sampling and beam search are generate \
                         settings (--step generate)"
                    .into(),
            });
        }
        let shape = DecoderShape::of(preset)?;
        // gpt-oss: transformers 5.17 refuses SDPA (`_supports_sdpa = False`) and falls back
        // to eager when none is asked for; its attention sinks run only there
        let forced;
        let cfg = if shape.sinks && cfg.attention != Attention::Eager {
            forced = InferConfig {
                attention: Attention::Eager,
                ..*cfg
            };
            &forced
        } else {
            cfg
        };
        if cfg.total_tokens() > shape.max_positions {
            return Err(PlanError::Field {
                field: "seq",
                reason: format!(
                    "prompt {} + new tokens {} = {} is beyond {}'s max_position_embeddings {}",
                    cfg.prompt,
                    cfg.new_tokens,
                    cfg.total_tokens(),
                    preset.id,
                    shape.max_positions
                ),
            });
        }
        if let (Some(_), Some(q)) = (&shape.moe, quant) {
            return Err(PlanError::Field {
                field: "quant",
                reason: format!(
                    "{} with bitsandbytes {} is not modelled yet: bitsandbytes converts the \
                     nn.Linear layers, and a mixture-of-experts model's experts are 3-D \
                     parameters it leaves as they are; plan it without --quant",
                    preset.id,
                    q.quant.as_str()
                ),
            });
        }
        let graph = preset.build(1, AttnImpl::Sdpa)?;
        let params: Vec<u64> = graph.params.iter().map(|p| p.elems).collect();
        let rotaries = if shape.two_rotaries { 2 } else { 1 };
        // `inv_freq` and `original_inv_freq` per rotary embedding (fp32).
        let buffers = vec![shape.head_dim / 2; 2 * rotaries];
        let qmodel = quant.map(|q| QuantModel::of(&graph, q, cfg.dtype));
        let held = match &qmodel {
            Some(q) => q.weights_bytes(),
            None => params.iter().sum::<u64>() * cfg.dtype.size(),
        };
        let weights = held + buffers.iter().sum::<u64>() * 4;
        let events = call::session_quant(&shape, cfg, dec, &params, &buffers, qmodel.as_ref());
        Ok(InferPlanner {
            model: preset.id.clone(),
            params: params.iter().sum(),
            weights: Bytes(weights),
            shape,
            config: *cfg,
            decoding: *dec,
            events,
            context: DEFAULT_CUDA_CONTEXT,
            placement: None,
            quant: qmodel,
            param_elems: params,
            buffer_elems: buffers,
        })
    }

    /// The measured call's memory at `batch`, after every event (and when it begins), thinned
    /// to about `max_points` points by keeping each stretch's lowest and highest allocated
    /// point (so the prefill spike and every decode step's top survive). Its largest allocated
    /// and reserved bytes are the plan's peaks.
    pub fn trace(&self, batch: u64, max_points: usize) -> Result<Vec<TracePoint>, PlanError> {
        trace::of(
            &self.events_at(batch),
            batch,
            self.config.allocator,
            max_points,
        )
    }

    /// The events at `batch`: those built, unless a 4-bit model's `gemm_4bit` dispatch
    /// (fused kernel or dequantized weight, by the rows `batch × tokens`) or LLM.int8's
    /// outlier columns make them depend on the batch — then rebuilt for it.
    pub fn events_at(&self, batch: u64) -> Cow<'_, Events> {
        match &self.quant {
            Some(q)
                if (q.quant.quant.is_4bit() || q.outliers != quant::Int8Outliers::None)
                    && batch != self.config.batch =>
            {
                Cow::Owned(self.session_at(batch))
            }
            _ => Cow::Borrowed(&self.events),
        }
    }

    /// The planner with LLM.int8's outlier columns `outliers` (a quantized model; see
    /// [`quant::Int8Outliers`]); its events rebuilt.
    pub fn with_int8_outliers(mut self, outliers: quant::Int8Outliers) -> InferPlanner {
        if let Some(q) = &mut self.quant {
            q.outliers = outliers;
            self.rebuild();
        }
        self
    }

    /// [`InferPlanner::with_decoding`] for a model loaded with `device_map="auto"` and
    /// `max_memory` = `budget` ([`device_map`]): the modules that do not fit GPU 0 stay on
    /// the CPU (or disk) and their weights are copied in as they run. `weights` is then what
    /// stays on the GPU.
    pub fn with_device_map(
        preset: &Preset,
        cfg: &InferConfig,
        dec: &Decoding,
        budget: device_map::MaxMemory,
    ) -> Result<InferPlanner, PlanError> {
        InferPlanner::with_device_map_quant(preset, cfg, dec, budget, None, false)
    }

    /// [`InferPlanner::with_device_map`] of a model loaded with
    /// `quantization_config=BitsAndBytesConfig(...)` too (`quant`; `None`: weights in the
    /// dtype) and `llm_int8_enable_fp32_cpu_offload=fp32_cpu_offload`: the placement of the
    /// quantized model ([`device_map::Placement::of_quant`]: quantized sizes, `max_memory` ×
    /// 0.90, transformers' refusal of an offloading map without the flag), the GPU 0 keys
    /// loaded and quantized as [`quant::QuantModel::load`] loads them, the offloaded decoder
    /// layers' quantized tensors copied in as they run.
    ///
    /// 4-bit weights (`--quant nf4|fp4`) with any module off GPU 0 are refused
    /// ([`device_map::BNB_4BIT_OFFLOAD_ERRORS`]: the first forward fails in
    /// [`device_map::BNB_4BIT_OFFLOAD_VERSIONS`], measured); a 4-bit model that fits GPU 0
    /// whole is planned.
    pub fn with_device_map_quant(
        preset: &Preset,
        cfg: &InferConfig,
        dec: &Decoding,
        budget: device_map::MaxMemory,
        quant: Option<QuantStorage>,
        fp32_cpu_offload: bool,
    ) -> Result<InferPlanner, PlanError> {
        InferPlanner::device_map_planner(preset, cfg, dec, budget, quant, fp32_cpu_offload, true)
    }

    /// [`InferPlanner::with_device_map_quant`]; `refuse_4bit_offload: false` plans the copies
    /// an offloaded 4-bit layer would make (what the device-map tests check of the streams,
    /// for when a release runs it).
    pub(crate) fn device_map_planner(
        preset: &Preset,
        cfg: &InferConfig,
        dec: &Decoding,
        budget: device_map::MaxMemory,
        quant: Option<QuantStorage>,
        fp32_cpu_offload: bool,
        refuse_4bit_offload: bool,
    ) -> Result<InferPlanner, PlanError> {
        let mut planner = InferPlanner::with_quant(preset, cfg, dec, quant)?;
        if planner.shape.moe.is_some() {
            return Err(PlanError::Field {
                field: "device_map",
                reason: format!(
                    "device_map=\"auto\" for {} is not modelled yet: the placement mirrors \
                     accelerate's module sizes of dense decoders, not a mixture-of-experts \
                     model's experts",
                    preset.id
                ),
            });
        }
        let crate::model::ModelSpec::Llama(p) = &preset.spec else {
            return Err(PlanError::Field {
                field: "model",
                reason: "device_map is planned for the decoders of the Llama lineage".into(),
            });
        };
        let placement =
            device_map::Placement::of_quant(p, cfg.dtype.size(), budget, quant, fp32_cpu_offload)?;
        if placement.nothing_on_gpu() {
            return Err(PlanError::Field {
                field: "max_gpu_memory",
                reason: format!(
                    "device_map {}: no module fits GPU 0 beside accelerate's reserve for the \
                     largest layer, so the model runs on the CPU; give more GPU memory",
                    serde_json::to_string(&placement.device_map).unwrap_or_default()
                ),
            });
        }
        if let Some(q) = quant.filter(|q| q.quant.is_4bit() && refuse_4bit_offload)
            && placement.device_map.offloads()
        {
            return Err(PlanError::Field {
                field: "quant",
                reason: format!(
                    "{} with device_map {}: 4-bit weights with modules off GPU 0 do not \
                     run in {}: measured on an H100 (session 30b), the first forward raised \
                     \"{}\" (prefill) and \"{}\" (generate, double quantization); \
                     accelerate's offload hook moves the offloaded Params4bit to meta and its \
                     QuantState goes with it. Use --quant int8 (planned and measured with \
                     offloaded layers), a --max-gpu-memory large enough that every module stays \
                     on GPU 0, or no --quant with the offload",
                    q.quant,
                    serde_json::to_string(&placement.device_map).unwrap_or_default(),
                    device_map::BNB_4BIT_OFFLOAD_VERSIONS,
                    device_map::BNB_4BIT_OFFLOAD_ERRORS[0],
                    device_map::BNB_4BIT_OFFLOAD_ERRORS[1],
                ),
            });
        }
        planner.placement = Some(placement);
        planner.rebuild();
        Ok(planner)
    }

    /// The events (and, with a device map, the weights on GPU 0) of the planner's settings
    /// at `config.batch`.
    fn rebuild(&mut self) {
        self.events = self.session_at(self.config.batch);
        if let Some(pl) = &self.placement {
            self.weights = Bytes(match &self.quant {
                Some(q) => {
                    q.weights_bytes_where(|key| !pl.device_of(key).offloaded())
                        + pl.tensors.resident_buffers().iter().sum::<u64>()
                }
                None => pl.resident_bytes(),
            });
        }
    }

    /// The session's events at `batch` sequences.
    fn session_at(&self, batch: u64) -> Events {
        let mut cfg = self.config;
        cfg.batch = batch;
        match &self.placement {
            Some(pl) => call::device_map_session_quant(
                &self.shape,
                &cfg,
                &self.decoding,
                pl,
                self.quant.as_ref(),
            ),
            None => call::session_quant(
                &self.shape,
                &cfg,
                &self.decoding,
                &self.param_elems,
                &self.buffer_elems,
                self.quant.as_ref(),
            ),
        }
    }

    /// Peak allocated, reserved and nvidia-smi bytes at `batch`.
    pub fn peaks(&self, batch: u64) -> Result<eval::Peaks, PlanError> {
        eval::peaks(
            &self.events_at(batch),
            batch,
            self.config.allocator,
            self.context,
        )
    }

    /// The plan at `batch`.
    pub fn plan(&self, batch: u64) -> Result<InferPlan, PlanError> {
        let mut cfg = self.config;
        cfg.batch = batch;
        cfg.validate()?;
        let e = eval::evaluate(&self.events_at(batch), batch, cfg.allocator, false)?;
        let smi = e
            .peak_reserved
            .checked_add(self.context)
            .ok_or(PlanError::Overflow("nvidia-smi bytes"))?;
        let mut breakdown: Vec<Share> = [
            Category::Parameters,
            Category::KvCache,
            Category::Activations,
            Category::Transient,
        ]
        .iter()
        .map(|&c| Share {
            category: category_key(c),
            label: c.label(),
            bytes: Bytes(e.breakdown[c.index()]),
        })
        .collect();
        breakdown.push(Share {
            category: "allocator_overhead".into(),
            label: "Allocator overhead (reserved − allocated)",
            bytes: e.peak_reserved.saturating_sub(e.peak_allocated),
        });
        breakdown.push(Share {
            category: "cuda_context".into(),
            label: "CUDA context",
            bytes: self.context,
        });
        let peak_at = match e.peak_node {
            Some(0) | None => "prefill".to_string(),
            Some(k) => format!("decode step {k}"),
        };
        Ok(InferPlan {
            model: self.model.clone(),
            model_type: self.shape.model_type.clone(),
            params: self.params,
            config: cfg,
            decoding: (!self.decoding.is_greedy()).then_some(self.decoding),
            quant: self.quant.as_ref().map(|q| q.quant),
            peak_allocated_bytes: e.peak_allocated,
            peak_reserved_bytes: e.peak_reserved,
            nvidia_smi_bytes: smi,
            cuda_context_bytes: self.context,
            // beam search holds `num_beams` sequences a prompt (its `reorder_cache` copies one
            // layer more for a moment: in the peak, not here)
            kv_cache_bytes: Bytes(
                kv::peak_cache_bytes(&self.shape, &cfg)
                    .saturating_mul(self.decoding.num_beams.max(1)),
            ),
            weights_bytes: self.weights,
            peak_at,
            breakdown,
            device_map: self.placement.clone(),
        })
    }

    /// Whether `batch` runs without a CUDA OOM on `budget`'s GPU.
    pub fn fits(&self, budget: Budget, batch: u64) -> Result<bool, PlanError> {
        let cap = budget.allocator_cap(self.context);
        match eval::runs_within(&self.events_at(batch), batch, self.config.allocator, cap) {
            Err(PlanError::Overflow(_)) => Ok(false),
            other => other,
        }
    }

    /// The largest batch (≤ `limit`) that runs on `budget`'s GPU, `None` when 1 does not.
    pub fn max_batch(&self, budget: Budget, limit: u64) -> Result<Option<u64>, PlanError> {
        if !self.fits(budget, 1)? {
            return Ok(None);
        }
        let mut lo = 1u64;
        let mut hi = 2u64;
        while hi <= limit && self.fits(budget, hi)? {
            lo = hi;
            hi = hi.saturating_mul(2);
        }
        let bad = hi.min(limit.saturating_add(1));
        Ok(Some(super::search::bisect(lo, bad, &mut |b| {
            self.fits(budget, b)
        })?))
    }
}

fn category_key(c: Category) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::config::{AllocatorConfig, Attention, DType};
    use crate::plan::events::Event;

    fn preset(name: &str) -> Preset {
        let path = format!(
            "{}/../../tests/data/hf_configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).expect("config");
        crate::model::hf::from_config_text(&text, name).expect("preset")
    }

    fn cfg(step: InferStep, kv_cache: KvCache, prompt: u64, new_tokens: u64) -> InferConfig {
        InferConfig {
            step,
            batch: 2,
            prompt,
            new_tokens,
            dtype: DType::BF16,
            attention: Attention::Sdpa,
            kv_cache,
            allocator: AllocatorConfig::default(),
        }
    }

    fn measured(p: &InferPlanner) -> &[Event] {
        &p.events.events[p.events.measured_start..]
    }

    fn kv_allocs(p: &InferPlanner) -> Vec<(u32, u64)> {
        measured(p)
            .iter()
            .filter(|e| e.alloc)
            .map(|e| (e.node, p.events.buffers[e.buffer as usize]))
            .filter(|(_, b)| b.category == Category::KvCache)
            .map(|(n, b)| (n, b.per_sample))
            .collect()
    }

    /// Every buffer is allocated once and freed once; each call frees what it allocated.
    #[test]
    fn calls_free_what_they_allocate() {
        for (name, step, cache, new) in [
            ("Llama-3.2-1B", InferStep::Generate, KvCache::Dynamic, 5),
            ("gemma-3-1b-pt", InferStep::Generate, KvCache::Static, 5),
            ("gemma-2-2b", InferStep::Generate, KvCache::Dynamic, 3),
            (
                "Phi-3-mini-4k-instruct",
                InferStep::Generate,
                KvCache::Dynamic,
                3,
            ),
            ("Qwen3-0.6B", InferStep::Prefill, KvCache::Dynamic, 0),
        ] {
            for attention in [Attention::Sdpa, Attention::Eager] {
                for dtype in [DType::BF16, DType::F32] {
                    let c = InferConfig {
                        attention,
                        dtype,
                        ..cfg(step, cache, 700, new)
                    };
                    let p = InferPlanner::new(&preset(name), &c).expect("planner");
                    let ev = &p.events;
                    let mut state = vec![0u8; ev.buffers.len()];
                    for e in &ev.events {
                        let s = &mut state[e.buffer as usize];
                        assert_eq!(*s, u8::from(!e.alloc), "{name}: buffer {}", e.buffer);
                        *s += 1;
                    }
                    // left allocated: weights, buffers, the prompt and the cuBLAS workspace
                    let live = state.iter().filter(|&&s| s == 1).count();
                    let params = p.shape.layers as usize; // at least one weight per layer
                    assert!(live > params, "{name}");
                    let live_in_call = measured(&p)
                        .iter()
                        .filter(|e| e.alloc && state[e.buffer as usize] == 1)
                        .count();
                    assert_eq!(live_in_call, 0, "{name} {attention:?} {dtype:?}");
                }
            }
        }
    }

    /// `torch.cat` of a dynamic cache: every forward allocates each layer's keys and values
    /// anew, one token longer, while the old ones still exist; a static cache allocates
    /// them once, in the prefill, to prompt + new tokens.
    #[test]
    fn dynamic_cache_grows_by_cat_static_is_preallocated() {
        let llama = preset("Llama-3.2-1B");
        let row = 2 * 8 * 64; // kv_heads × head_dim × bf16 bytes
        let d = InferPlanner::new(&llama, &cfg(InferStep::Generate, KvCache::Dynamic, 100, 4))
            .expect("dynamic");
        let allocs = kv_allocs(&d);
        assert_eq!(allocs.len(), 16 * 2 * 4, "K and V per layer per forward");
        for (forward, size) in &allocs {
            assert_eq!(*size, (100 + u64::from(*forward)) * row);
        }
        // the old K of a layer is freed after its new K is allocated
        let ev = measured(&d);
        let first_decode = ev
            .iter()
            .position(|e| {
                e.alloc
                    && e.node == 1
                    && d.events.buffers[e.buffer as usize].category == Category::KvCache
            })
            .expect("a decode step's cat");
        let next = ev[first_decode + 1];
        assert!(!next.alloc, "the old keys go right after the cat");
        assert_eq!(d.events.buffers[next.buffer as usize].per_sample, 100 * row);
        let s = InferPlanner::new(&llama, &cfg(InferStep::Generate, KvCache::Static, 100, 4))
            .expect("static");
        let allocs = kv_allocs(&s);
        assert_eq!(allocs.len(), 16 * 2);
        assert!(allocs.iter().all(|&(f, size)| f == 0 && size == 104 * row));
    }

    /// A sliding layer (Gemma 3: five of six layers, window 512) keeps the prompt after the
    /// prefill, then at most the window; the full layers grow with every token.
    #[test]
    fn sliding_layers_shrink_to_the_window() {
        let g = InferPlanner::new(
            &preset("gemma-3-1b-pt"),
            &cfg(InferStep::Generate, KvCache::Dynamic, 2000, 3),
        )
        .expect("gemma3");
        let row = 256 * 2; // one kv head of 256, bf16
        let sizes: Vec<u64> = kv_allocs(&g)
            .iter()
            .filter(|(f, _)| *f == 2)
            .map(|(_, s)| s / row)
            .collect();
        assert_eq!(sizes.len(), 26 * 2);
        let full = sizes.iter().filter(|&&t| t == 2002).count();
        let sliding = sizes.iter().filter(|&&t| t == 512).count();
        assert_eq!((full, sliding), (2 * 4, 2 * 22), "{sizes:?}");
    }

    /// `logits_to_keep=1`: generate's prefill computes one position's logits; a plain forward
    /// all of them.
    #[test]
    fn generate_keeps_the_last_positions_logits() {
        let llama = preset("Llama-3.2-1B");
        let vocab_row = 128_256 * 2;
        let largest = |p: &InferPlanner| {
            measured(p)
                .iter()
                .filter(|e| e.alloc)
                .map(|e| p.events.buffers[e.buffer as usize].per_sample)
                .max()
                .unwrap_or(0)
        };
        let g = InferPlanner::new(&llama, &cfg(InferStep::Generate, KvCache::Dynamic, 64, 1))
            .expect("generate");
        let f = InferPlanner::new(&llama, &cfg(InferStep::Prefill, KvCache::Dynamic, 64, 0))
            .expect("prefill");
        assert_eq!(largest(&f), 64 * vocab_row);
        assert!(largest(&g) < 64 * vocab_row / 4, "{}", largest(&g));
    }

    /// Gemma 2's attention soft-cap (transformers 5.17): eager attention divides, `tanh`s
    /// and multiplies the scores, three more score-sized tensors per layer and forward, one
    /// alive beside the one before it; SDPA drops the `softcap` keyword and plans as the same
    /// model without it.
    #[test]
    fn gemma2_softcap_is_eager_attentions_only() {
        let capped = preset("gemma-2-2b");
        let mut uncapped = capped.clone();
        if let crate::model::ModelSpec::Llama(p) = &mut uncapped.spec {
            p.attn_logit_softcapping = None;
        }
        let (prompt, batch) = (300, 2);
        // bf16 scores of the prefill: heads × prompt × prompt per sequence
        let scores = 8 * prompt * prompt * 2;
        let count = |p: &Preset, attention| {
            let c = InferConfig {
                attention,
                ..cfg(InferStep::Prefill, KvCache::Dynamic, prompt, 0)
            };
            let planner = InferPlanner::new(p, &c).expect("gemma2 plans");
            let n = measured(&planner)
                .iter()
                .filter(|e| {
                    e.alloc && planner.events.buffers[e.buffer as usize].per_sample == scores
                })
                .count();
            (n, planner.plan(batch).expect("plan").peak_allocated_bytes)
        };
        let (eager_capped, _) = count(&capped, Attention::Eager);
        let (eager_plain, _) = count(&uncapped, Attention::Eager);
        assert_eq!(eager_capped, eager_plain + 3 * 26, "three per layer");
        assert_eq!(
            count(&capped, Attention::Sdpa),
            count(&uncapped, Attention::Sdpa),
            "SDPA runs uncapped"
        );
    }
}
