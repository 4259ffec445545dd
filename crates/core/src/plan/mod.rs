//! The estimator: pure functions from (graph, training config) to a memory plan.
//! No I/O, no GPU, no UI.

pub mod allocator;
pub mod band;
pub mod captured;
pub mod config;
pub mod distributed;
pub mod error;
pub mod eval;
pub mod events;
pub mod finetune;
pub mod finetune_mode;
pub mod fit;
pub mod free_bins;
pub mod gpus;
pub mod inference;
pub mod kernel_temps;
pub mod multi_gpu;
pub mod numerics;
pub mod optimizer;
pub mod policy;
pub mod remedies;
pub mod rules;
pub mod sdpa_math;
pub mod search;
pub mod sim;
pub mod step_kind;
pub mod strategy_remedies;
#[cfg(test)]
mod tests;
pub mod timing;

use serde::Serialize;

pub use config::{Attention, DType, Optimizer, Precision, TrainConfig};
pub use error::PlanError;
pub use eval::TimelinePoint;
pub use events::{Category, Constants, Phase};
pub use gpus::Gpu;
pub use policy::ParamPolicy;

use crate::model::families::transformer::AttnImpl;
use crate::model::{Graph, Preset};
use crate::units::Bytes;

/// Measured per-process CUDA context + library handles beyond PyTorch's reserved bytes
/// (H200, driver 580, CUDA 13, PyTorch 2.11; see `tests/data/`).
pub const DEFAULT_CUDA_CONTEXT: Bytes = Bytes(782 << 20);

/// Bytes of one breakdown category at the peak.
#[derive(Debug, Clone, Serialize)]
pub struct Share {
    pub category: String,
    pub label: &'static str,
    pub bytes: Bytes,
}

/// The prediction for one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub model: String,
    pub params: u64,
    /// Parameters that train, when not all do (fine-tuning modes); `params` counts all,
    /// adapters included, as peft's `print_trainable_parameters` does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trainable_params: Option<u64>,
    pub config: TrainConfig,
    /// The input size used (sequence length or image side).
    pub size: u64,
    /// The target (decoder) length used, for an encoder-decoder model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_seq: Option<u64>,
    /// Peak of `torch.cuda.max_memory_allocated()` over a steady-state step.
    pub peak_allocated_bytes: Bytes,
    /// Peak of `torch.cuda.max_memory_reserved()` (caching-allocator segments).
    pub peak_reserved_bytes: Bytes,
    /// What `nvidia-smi` shows for the process: reserved + CUDA context.
    pub nvidia_smi_bytes: Bytes,
    pub cuda_context_bytes: Bytes,
    pub peak_phase: Phase,
    /// The layer whose forward/backward is running at the peak.
    pub peak_layer: String,
    /// Bytes per category at the peak, then allocator overhead and CUDA context (they sum
    /// to `nvidia_smi_bytes`).
    pub breakdown: Vec<Share>,
    /// With fine-tuning: the `parameters` share split into frozen and trainable weights.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_split: Option<WeightsSplit>,
    /// Optimizer state in unified memory (bitsandbytes paged optimizers): outside the
    /// caching allocator, so in neither peak above; evictable to host memory.
    #[serde(skip_serializing_if = "is_zero")]
    pub paged_optimizer_bytes: Bytes,
    pub timeline: Vec<TimelinePoint>,
}

impl Plan {
    /// Bytes of one named breakdown category.
    pub fn category_bytes(&self, c: Category) -> Bytes {
        let key = category_key(c);
        self.breakdown
            .iter()
            .find(|s| s.category == key)
            .map_or(Bytes::ZERO, |s| s.bytes)
    }
}

/// The parameters' bytes split by whether they train (fine-tuning modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WeightsSplit {
    /// Frozen weights (for QLoRA: the quantized storage plus the fp32 unquantized rest).
    pub frozen_bytes: Bytes,
    /// Trainable weights (LoRA adapters).
    pub trainable_bytes: Bytes,
}

fn is_zero(b: &Bytes) -> bool {
    *b == Bytes::ZERO
}

fn category_key(c: Category) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A model + config with the batch-independent work done once: the graph and its
/// event list. Evaluating a batch is a linear pass.
#[derive(Debug, Clone)]
pub struct Planner {
    pub model: String,
    /// Shared between the planners of one search that build the same graph
    /// ([`GraphCache`]).
    pub graph: std::sync::Arc<Graph>,
    pub config: TrainConfig,
    pub size: u64,
    /// The target (decoder) length of an encoder-decoder model (given or its default).
    pub target_seq: Option<u64>,
    /// Shared: a planner's clones (the allocator twins of the make-it-fit search, the
    /// `expandable_segments` remedy) replay the same events without copying them.
    pub events: std::sync::Arc<events::Events>,
    pub context: Bytes,
    /// Elements of the parameters that train (peft's `print_trainable_parameters`).
    pub trainable: u64,
    /// Bytes of the frozen and of the trainable parameters.
    pub param_split: (u64, u64),
    /// Optimizer state in unified memory (paged optimizers).
    pub paged_bytes: u64,
    /// The parameter count when there is no built graph (a captured model).
    pub params_override: Option<u64>,
    /// Op names of a captured model, indexed by an event's `node` (empty for built models).
    pub op_labels: Vec<String>,
    /// The mode whose measured error band this plan is shown with ([`band`]).
    pub mode: band::ModeKey,
    /// The measured step's live-bytes lines of `events`, built on first use
    /// ([`Planner::live_peaks`]).
    pub live: std::sync::OnceLock<eval::LivePeaks>,
    /// What the step runs that this plan does not model, naming the config key and why
    /// ([`crate::model::Preset::unmodelled`]); shown with the warnings.
    pub unmodelled: Vec<String>,
}

impl Planner {
    /// Builds the graph and the events. `cfg.batch` is ignored here.
    pub fn new(preset: &Preset, cfg: &TrainConfig) -> Result<Planner, PlanError> {
        Planner::new_unless_above(preset, cfg, |_, _| u64::MAX)?
            .ok_or(PlanError::Overflow("event generation"))
    }

    /// [`Planner::new`] with its graph and annotations taken from, or left in, `cache`
    /// (the same planner): what plans more configurations of the preset after it (the
    /// remedies) builds them once.
    pub fn new_cached(
        preset: &Preset,
        cfg: &TrainConfig,
        cache: &GraphCache,
    ) -> Result<Planner, PlanError> {
        Planner::new_unless_above_cached(preset, cfg, Some(cache), |_, _| u64::MAX)?
            .ok_or(PlanError::Overflow("event generation"))
    }

    /// [`Planner::new`], or `None` as soon as the event generation shows that a replay at
    /// batch 1 reserves more than `bound(context, band)` bytes at some point
    /// ([`sim::generate_unless_above`]): the make-it-fit search's combinations that cannot
    /// fit, or cannot come closer than its closest miss, stop there instead of being
    /// generated whole. A captured model's events are read, not generated: never `None`.
    pub fn new_unless_above(
        preset: &Preset,
        cfg: &TrainConfig,
        bound: impl FnOnce(Bytes, &band::ErrorBand) -> u64,
    ) -> Result<Option<Planner>, PlanError> {
        Planner::new_unless_above_cached(preset, cfg, None, bound)
    }

    /// [`Planner::new_unless_above`] with the graphs (and their parameter policies before
    /// the strategy shards them) taken from `cache` when it built them already: the
    /// make-it-fit search builds the same few graphs for many combinations.
    pub fn new_unless_above_cached(
        preset: &Preset,
        cfg: &TrainConfig,
        cache: Option<&GraphCache>,
        bound: impl FnOnce(Bytes, &band::ErrorBand) -> u64,
    ) -> Result<Option<Planner>, PlanError> {
        if let crate::model::ModelSpec::Captured(c) = &preset.spec {
            return captured_planner(preset, c, cfg).map(Some);
        }
        cfg.validate()?;
        let effective;
        let cfg = if cfg.effective_precision() == cfg.precision {
            cfg
        } else {
            effective = TrainConfig {
                precision: cfg.effective_precision(),
                ..*cfg
            };
            &effective
        };
        let size = cfg.size.unwrap_or_else(|| preset.default_size());
        let attn = match cfg.attention {
            Attention::Eager => AttnImpl::Eager,
            Attention::Sdpa => AttnImpl::Sdpa,
        };
        if cfg.moe_imbalance != 1.0 && !preset.is_moe() {
            return Err(PlanError::Field {
                field: "moe_imbalance",
                reason: format!(
                    "{} has no mixture-of-experts layers (the routing imbalance applies to \
                     mixtral, qwen2_moe and qwen3_moe models)",
                    preset.id
                ),
            });
        }
        let precision = cfg.distributed.module_precision(cfg.precision);
        let key = GraphKey {
            size,
            target_seq: cfg.target_seq,
            attention: cfg.attention,
            moe_imbalance: cfg.moe_imbalance,
            finetune: cfg.finetune,
            precision,
        };
        let (graph, mut policy) = match cache {
            Some(cache) => cache.get(preset, &key)?,
            None => key.build(preset)?,
        };
        let sim_cfg = distributed_sim_config(cfg, &graph, &mut policy);
        let context = DEFAULT_CUDA_CONTEXT
            .checked_add(cfg.distributed.nccl_bytes())
            .ok_or(PlanError::Overflow("CUDA context"))?;
        let mode = mode_key(preset, cfg);
        let stop_above = bound(context, &band::ErrorBand::of(&mode));
        let annotations = cache.map(|c| c.annotations(&key, &graph, &sim_cfg));
        let Some(events) = sim::generate_annotated(
            &graph,
            &sim_cfg,
            &policy,
            &Constants::default(),
            stop_above,
            annotations.as_deref(),
        ) else {
            return Ok(None);
        };
        let trainable = policy.trainable_elems(&graph);
        let param_split = policy.frozen_trainable_bytes(&graph);
        let paged_bytes = graph
            .params
            .iter()
            .enumerate()
            .filter(|&(i, _)| policy.trainable(i))
            .map(|(_, p)| optimizer::paged_bytes(cfg.optimizer, p))
            .sum();
        Ok(Some(Planner {
            model: preset.id.clone(),
            graph,
            config: *cfg,
            size,
            target_seq: preset.target_seq(cfg.target_seq),
            events: std::sync::Arc::new(events),
            context,
            trainable,
            param_split,
            paged_bytes,
            params_override: None,
            op_labels: Vec::new(),
            mode,
            live: std::sync::OnceLock::new(),
            unmodelled: preset.unmodelled(size, attn),
        }))
    }

    /// The measured error band of this plan's mode (from the embedded
    /// `presets/error_bands.json`).
    pub fn band(&self) -> band::ErrorBand {
        band::ErrorBand::of(&self.mode)
    }

    /// Peak allocated bytes of the measured step as a function of the batch (a lower bound
    /// of [`Planner::peaks`]' allocated: block rounding and the warm-up are left out), built
    /// once per planner.
    pub fn live_peaks(&self) -> &eval::LivePeaks {
        self.live.get_or_init(|| eval::LivePeaks::new(&self.events))
    }

    /// Peak allocated, reserved and nvidia-smi bytes at `batch` (no timeline).
    pub fn peaks(&self, batch: u64) -> Result<eval::Peaks, PlanError> {
        eval::peaks(&self.events, batch, self.config.allocator, self.context)
    }

    /// Whether `batch` runs without OOM on a GPU where the allocator may reserve `cap`
    /// bytes (device memory minus CUDA context minus margin).
    pub fn runs_within(&self, batch: u64, cap: Bytes) -> Result<bool, PlanError> {
        eval::runs_within(&self.events, batch, self.config.allocator, cap)
    }

    /// Peak reserved bytes at `batch` when the allocator may reserve at most `cap` bytes
    /// (cached segments released before an OOM, as PyTorch does); `None` when it runs out.
    pub fn reserved_within(&self, batch: u64, cap: Bytes) -> Result<Option<Bytes>, PlanError> {
        eval::reserved_within(&self.events, batch, self.config.allocator, cap)
    }

    /// [`Planner::reserved_within`] when the uncapped peak reserved bytes at `batch`
    /// (`uncapped`, from [`Planner::peaks`]) are known: within the cap, the capped allocator
    /// never reaches its cap (reserved only grows to its peak), so it runs exactly as the
    /// uncapped one and its peak is that one's; only above the cap is the capped run
    /// simulated (tested against it).
    pub fn reserved_within_given(
        &self,
        batch: u64,
        cap: Bytes,
        uncapped: Bytes,
    ) -> Result<Option<Bytes>, PlanError> {
        if uncapped <= cap {
            return Ok(Some(uncapped));
        }
        self.reserved_within(batch, cap)
    }

    /// The full plan at `batch`.
    pub fn plan(&self, batch: u64) -> Result<Plan, PlanError> {
        let mut cfg = self.config;
        cfg.batch = batch;
        cfg.validate()?;
        let e = eval::evaluate(&self.events, batch, cfg.allocator, true)?;
        let smi = e
            .peak_reserved
            .checked_add(self.context)
            .ok_or(PlanError::Overflow("nvidia-smi bytes"))?;
        let mut breakdown: Vec<Share> = Category::ALL
            .iter()
            .filter(|c| !c.inference_only())
            .filter(|c| cfg.distributed.active() || !c.distributed_only())
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
        let weights_split = (!cfg.finetune.is_full()).then_some(WeightsSplit {
            frozen_bytes: Bytes(self.param_split.0),
            trainable_bytes: Bytes(self.param_split.1),
        });
        let peak_layer = e
            .peak_node
            .and_then(|n| self.graph.nodes.get(n as usize))
            .map(|n| self.graph.name(n).to_string())
            .or_else(|| {
                e.peak_node
                    .and_then(|n| self.op_labels.get(n as usize))
                    .cloned()
            })
            .unwrap_or_default();
        Ok(Plan {
            model: self.model.clone(),
            params: self
                .params_override
                .unwrap_or_else(|| self.graph.param_count()),
            trainable_params: (!cfg.finetune.trains_everything()).then_some(self.trainable),
            config: cfg,
            size: self.size,
            target_seq: self.target_seq,
            peak_allocated_bytes: e.peak_allocated,
            peak_reserved_bytes: e.peak_reserved,
            nvidia_smi_bytes: smi,
            cuda_context_bytes: self.context,
            peak_phase: e.peak_phase,
            peak_layer,
            breakdown,
            weights_split,
            paged_optimizer_bytes: Bytes(self.paged_bytes),
            timeline: e.timeline,
        })
    }
}

/// What a built graph and its parameter policy depend on, for one preset ([`GraphCache`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphKey {
    pub size: u64,
    pub target_seq: Option<u64>,
    pub attention: Attention,
    pub moe_imbalance: f64,
    pub finetune: finetune_mode::FineTune,
    /// The precision the modules are built in (a strategy's module precision).
    pub precision: Precision,
}

impl GraphKey {
    /// Builds the graph of `preset` and applies the fine-tuning.
    pub fn build(&self, preset: &Preset) -> Result<Built, PlanError> {
        let attn = match self.attention {
            Attention::Eager => AttnImpl::Eager,
            Attention::Sdpa => AttnImpl::Sdpa,
        };
        let graph = preset.build_full(self.size, self.target_seq, attn, self.moe_imbalance)?;
        let (graph, policy) = finetune::apply(graph, &self.finetune, self.precision)?;
        Ok((std::sync::Arc::new(graph), policy))
    }

    /// The key as a map's key (the imbalance by its bits).
    fn hashable(&self) -> HashableKey {
        (
            self.size,
            self.target_seq,
            self.attention,
            self.moe_imbalance.to_bits(),
            self.finetune,
            self.precision,
        )
    }
}

/// A graph and its parameter policy, cached by [`GraphKey`].
type Built = (std::sync::Arc<Graph>, ParamPolicy);

/// Graphs built for one preset, shared by the threads that plan its combinations
/// ([`Planner::new_unless_above_cached`]).
#[derive(Debug, Default)]
pub struct GraphCache {
    built: std::sync::Mutex<std::collections::HashMap<HashableKey, Built>>,
    /// Each graph's annotations per precision and checkpointing setting.
    annotated: std::sync::Mutex<std::collections::HashMap<AnnotationsKey, Annotated>>,
}

/// A graph's annotations, shared by the threads that generate its events.
type Annotated = std::sync::Arc<sim::Annotations>;

/// A graph's key with the precision and checkpointing setting its events are generated in.
type AnnotationsKey = (HashableKey, Precision, bool);

/// [`GraphKey`] as a map's key (the imbalance by its bits).
type HashableKey = (
    u64,
    Option<u64>,
    Attention,
    u64,
    finetune_mode::FineTune,
    Precision,
);

impl GraphCache {
    /// The graph and policy of `key` for `preset` (always the same preset), built when not
    /// cached (a build that fails is not cached: it fails again when asked again).
    pub fn get(&self, preset: &Preset, key: &GraphKey) -> Result<Built, PlanError> {
        let cached = self
            .built
            .lock()
            .ok()
            .and_then(|m| m.get(&key.hashable()).cloned());
        if let Some(hit) = cached {
            return Ok(hit);
        }
        let built = key.build(preset)?;
        if let Ok(mut m) = self.built.lock() {
            m.entry(key.hashable()).or_insert_with(|| built.clone());
        }
        Ok(built)
    }

    /// The annotations of `key`'s graph (`graph`) for `cfg`'s precision and checkpointing,
    /// computed when not cached.
    fn annotations(&self, key: &GraphKey, graph: &Graph, cfg: &TrainConfig) -> Annotated {
        let at = (key.hashable(), cfg.precision, cfg.checkpointing);
        let cached = self.annotated.lock().ok().and_then(|m| m.get(&at).cloned());
        if let Some(hit) = cached {
            return hit;
        }
        let made = std::sync::Arc::new(sim::Annotations::new(
            graph,
            cfg.precision,
            cfg.checkpointing,
        ));
        if let Ok(mut m) = self.annotated.lock() {
            m.entry(at).or_insert_with(|| made.clone());
        }
        made
    }
}

/// The config the simulator runs for a multi-GPU strategy, and the parameter shards in
/// `policy`: FSDP2 / ZeRO-3 hold 1/world of every parameter; under FSDP2's
/// `MixedPrecisionPolicy` the model computes in the low dtype (the unsharded copies and the
/// forward inputs are cast to it), as a pure 16-bit model does, while the sharded
/// parameters, gradients and optimizer state stay in their storage dtype. Under DeepSpeed
/// ZeRO-3 the parameters of at most `stage3_param_persistence_threshold` elements stay
/// whole (`runtime/zero/partition_parameters.py:1292`: `ds_numel <= threshold`).
fn distributed_sim_config(
    cfg: &TrainConfig,
    graph: &Graph,
    policy: &mut ParamPolicy,
) -> TrainConfig {
    let d = cfg.distributed;
    let mut out = *cfg;
    out.precision = d.module_precision(cfg.precision);
    if d.strategy.shards_params() {
        policy.shard_all(d.shards().params);
    }
    if d.strategy == distributed::Strategy::Zero3 {
        for (i, p) in graph.params.iter().enumerate() {
            if p.elems <= d.persistence_threshold {
                policy.set_shard(i, policy::Shard::WHOLE);
            }
        }
    }
    if d.strategy == distributed::Strategy::Fsdp2 && d.mixed_precision.param_dtype().is_some() {
        out.precision = Precision::Bf16;
    }
    out
}

/// The planner of a captured graph under `cfg` (kernels' temporaries are sized exactly at
/// its batch, by their local slope at others; the events from [`captured::events`]).
fn captured_planner(
    preset: &Preset,
    c: &crate::model::captured::CapturedGraph,
    cfg: &TrainConfig,
) -> Result<Planner, PlanError> {
    cfg.validate()?;
    captured::check_settings(c, cfg)?;
    let mut cfg = *cfg;
    cfg.size = Some(c.size);
    // The capture records element counts; parameters are stored in the precision's dtype.
    let elem = cfg.precision.param_dtype().size();
    let param_split = (
        c.params.saturating_sub(c.trainable).saturating_mul(elem),
        c.trainable.saturating_mul(elem),
    );
    Ok(Planner {
        model: preset.id.clone(),
        graph: std::sync::Arc::default(),
        config: cfg,
        size: c.size,
        target_seq: None,
        events: std::sync::Arc::new(captured::events(c, &Constants::default(), cfg.batch)),
        context: DEFAULT_CUDA_CONTEXT,
        trainable: c.trainable,
        params_override: Some(c.params),
        op_labels: c.ops.clone(),
        param_split,
        // Paged optimizers are not captured (the capture runs the optimizer it names).
        paged_bytes: 0,
        mode: mode_key(preset, &cfg),
        live: std::sync::OnceLock::new(),
        unmodelled: Vec::new(),
    })
}

/// The mode a plan of `preset` under `cfg` is measured in: family × fine-tuning mode ×
/// strategy.
pub fn mode_key(preset: &Preset, cfg: &TrainConfig) -> band::ModeKey {
    band::ModeKey {
        family: crate::model::hf::family_label(preset),
        modality: band::Modality::of(preset),
        finetune: cfg.finetune.mode,
        strategy: cfg.distributed.strategy,
    }
}

/// Plans `preset` under `cfg` (convenience for one-off plans).
pub fn plan(preset: &Preset, cfg: &TrainConfig) -> Result<Plan, PlanError> {
    Planner::new(preset, cfg)?.plan(cfg.batch)
}
