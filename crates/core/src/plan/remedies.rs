//! What-if remedies from the seed articles: each is a change of the training config,
//! planned for real and compared with the current plan.

use serde::Serialize;

use super::config::{
    AllocatorConfig, Attention, LoopShape, MAX_ACCUM, Optimizer, Precision, TrainConfig,
};
use super::search::Budget;
use super::{PlanError, Planner};
use crate::model::Preset;
use crate::units::Bytes;

/// A remedy and what it would give.
#[derive(Debug, Clone, Serialize)]
pub struct Remedy {
    pub name: &'static str,
    /// One sentence: what changes.
    pub description: String,
    /// The config with the remedy applied.
    pub config: TrainConfig,
    pub peak_allocated: Bytes,
    pub nvidia_smi: Bytes,
    /// Bytes saved against the current nvidia-smi figure (negative = costs more).
    pub saving: i64,
    /// Bytes saved against the current peak allocated (what the tensors need; the caching
    /// allocator may keep the freed blocks reserved, so nvidia-smi can move less).
    pub allocated_saving: i64,
    /// Runs without OOM on the budget's GPU (simulated caching allocator under the cap).
    pub fits: bool,
    /// When it does not fit at the configured micro-batch: the largest micro-batch it
    /// allows on the GPU (`None`: it fits as configured, or not even batch 1 fits).
    pub fits_up_to: Option<u64>,
    /// Why the nvidia-smi saving differs from the allocated one, where it does markedly.
    pub note: Option<String>,
    /// Applying it makes the nvidia-smi figure (what the verdict compares) grow: a cost in
    /// memory, shown apart from the remedies and never with a fit mark (AMP's fp16 weight
    /// copies, 8-bit Adam's quantization buffers on a model whose state was small, …).
    pub adds_memory: bool,
}

impl Remedy {
    /// The config to apply: the remedy's, at the largest micro-batch it allows when the
    /// configured one does not fit.
    pub fn config_to_apply(&self) -> TrainConfig {
        let mut c = self.config;
        if let Some(b) = self.fits_up_to {
            c.batch = b;
        }
        c
    }

    /// "fits", "fits at batch ≤ N" or "does not fit even at batch 1"; for a change that
    /// adds memory, what it adds.
    pub fn verdict(&self) -> String {
        if self.adds_memory {
            return format!(
                "adds {} on nvidia-smi: a cost, not a remedy",
                Bytes(self.saving.unsigned_abs())
            );
        }
        match (self.fits, self.fits_up_to) {
            (true, _) => "fits".into(),
            (false, Some(b)) => format!("fits at micro-batch up to {b}"),
            (false, None) => "does not fit even at batch 1".into(),
        }
    }
}

/// A saving of allocated bytes that nvidia-smi does not show (in less than half).
fn cached_note(allocated_saving: i64, smi_saving: i64) -> Option<String> {
    (allocated_saving > 0 && smi_saving < allocated_saving / 2).then(|| {
        format!(
            "frees {} of allocated memory, but PyTorch's caching allocator keeps the freed blocks \
             reserved, so nvidia-smi moves by {}{}",
            Bytes(allocated_saving.unsigned_abs()),
            if smi_saving < 0 { "+" } else { "" },
            Bytes(smi_saving.unsigned_abs())
        )
    })
}

/// The remedies that apply to `cfg`: (name, one-sentence description, changed config).
pub fn candidates(cfg: &TrainConfig, is_tokens: bool) -> Vec<(&'static str, String, TrainConfig)> {
    let mut out = Vec::new();
    if cfg.precision == Precision::Fp32 {
        let mut c = *cfg;
        c.precision = Precision::AmpBf16;
        out.push((
            "AMP (bf16 autocast)",
            "Run matmuls and convolutions in bf16 under torch.autocast; weights stay fp32."
                .to_string(),
            c,
        ));
    }
    // QLoRA keeps its unquantized base in fp32 (prepare_model_for_kbit_training).
    if cfg.precision != Precision::Bf16
        && cfg.finetune.mode != super::finetune_mode::FineTuneMode::Qlora
    {
        let mut c = *cfg;
        c.precision = Precision::Bf16;
        out.push((
            "Pure bf16",
            "model.to(torch.bfloat16): weights, gradients and optimizer state in bf16 (no fp32 master copy)."
                .to_string(),
            c,
        ));
    }
    // Doubling the accumulation must stay a valid config (`--accum 65536 --batch 2` failed
    // the whole plan when this remedy asked for 131072 steps).
    if cfg.batch > 1 && cfg.accum.saturating_mul(2) <= MAX_ACCUM {
        let mut c = *cfg;
        c.batch = cfg.batch.div_ceil(2);
        c.accum = cfg.accum.saturating_mul(2);
        out.push((
            "Half micro-batch + 2× accumulation",
            format!(
                "Micro-batch {} with {} accumulation steps keeps the effective batch at {}.",
                c.batch,
                c.accum,
                c.effective_batch()
            ),
            c,
        ));
    }
    if !cfg.checkpointing {
        let mut c = *cfg;
        c.checkpointing = true;
        out.push((
            "Activation checkpointing",
            format!(
                "Keep only each block's input; {}.",
                super::timing::checkpointing_cost(None)
            ),
            c,
        ));
    }
    if matches!(cfg.optimizer, Optimizer::Adam | Optimizer::AdamW) {
        let mut c = *cfg;
        c.optimizer = Optimizer::Adam8bit;
        out.push((
            "8-bit Adam",
            "bitsandbytes Adam8bit: optimizer state in 2 bytes per parameter instead of 8."
                .to_string(),
            c,
        ));
        let mut c = *cfg;
        c.optimizer = Optimizer::SgdMomentum;
        out.push((
            "SGD + momentum instead of Adam",
            "One state tensor instead of two and no foreach temporary.".to_string(),
            c,
        ));
    }
    if is_tokens && cfg.attention == Attention::Eager {
        let mut c = *cfg;
        c.attention = Attention::Sdpa;
        out.push((
            "SDPA / flash attention",
            "attn_implementation=\"sdpa\": no seq×seq attention matrix is stored.".to_string(),
            c,
        ));
    }
    if !cfg.allocator.expandable_segments {
        let mut c = *cfg;
        c.allocator = AllocatorConfig {
            expandable_segments: true,
            max_split_size_mb: None,
        };
        out.push((
            "expandable_segments",
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True removes most fragmentation (reserved − allocated)."
                .to_string(),
            c,
        ));
    }
    if cfg.loop_shape == LoopShape::Plain {
        let mut c = *cfg;
        c.loop_shape = LoopShape::Trainer;
        out.push((
            "Release output before backward",
            "Release the model output before backward: `loss = model(**batch).loss` (or `del out` \
             before `loss.backward()`); the logits \
             are freed before backward instead of living through it."
                .to_string(),
            c,
        ));
    }
    out.extend(super::strategy_remedies::candidates(cfg));
    out
}

/// Evaluates one remedy with a planner built for its config (`planner.config` may differ
/// from `config` in the batch only).
/// `base_allocated` and `base_nvidia_smi` are the current plan's peaks. A remedy that does
/// not fit at its micro-batch is also searched for the largest one it allows.
pub fn evaluate(
    name: &'static str,
    description: String,
    config: TrainConfig,
    planner: &Planner,
    base_allocated: Bytes,
    base_nvidia_smi: Bytes,
    budget: Budget,
) -> Result<Remedy, PlanError> {
    let p = planner.peaks(config.batch)?;
    // Reserved within the cap means the capped simulation cannot fail: skip it.
    let fits = super::search::fits_with_reserved(planner, budget, config.batch, p.reserved)?;
    let fits_up_to = if fits || config.batch <= 1 {
        None
    } else {
        super::search::max_batch(planner, budget, config.batch - 1)?
    };
    let saving = base_nvidia_smi.0 as i64 - p.nvidia_smi.0 as i64;
    let allocated_saving = base_allocated.0 as i64 - p.allocated.0 as i64;
    Ok(Remedy {
        name,
        description,
        config,
        peak_allocated: p.allocated,
        nvidia_smi: p.nvidia_smi,
        saving,
        allocated_saving,
        fits,
        fits_up_to,
        note: cached_note(allocated_saving, saving),
        adds_memory: saving < 0,
    })
}

/// Puts the remedies that save memory first and the changes that add memory after them
/// (each group in its own order): the one order the CLI and the GUI show.
pub fn order(list: &mut [Remedy]) {
    list.sort_by_key(|r| r.adds_memory);
}

/// Plans every applicable remedy for `cfg` against `budget`.
/// Remedies that save memory come first, changes that add memory after ([`order`]).
pub fn remedies(
    preset: &Preset,
    cfg: &TrainConfig,
    budget: Budget,
) -> Result<Vec<Remedy>, PlanError> {
    let graphs = super::GraphCache::default();
    let planner = Planner::new_cached(preset, cfg, &graphs)?;
    let base = planner.peaks(cfg.batch)?;
    remedies_against(
        preset,
        cfg,
        &planner,
        base.allocated,
        base.nvidia_smi,
        budget,
        &graphs,
    )
}

/// [`remedies`] against the peaks of `cfg`'s plan when they are known (`base_allocated`,
/// `base_nvidia_smi`; `base` is `cfg`'s planner): each remedy built and evaluated by the
/// same thread. A remedy that changes only the allocator settings takes `base`'s events
/// (the allocator does not change them, only how they are replayed) instead of generating
/// them again. `graphs` is the cache `base` was planned from ([`Planner::new_cached`]):
/// most remedies keep its graph (and many its precision and checkpointing), so each graph
/// is built, and annotated per setting, once for the plan and all its remedies.
pub fn remedies_against(
    preset: &Preset,
    cfg: &TrainConfig,
    base: &Planner,
    base_allocated: Bytes,
    base_nvidia_smi: Bytes,
    budget: Budget,
    graphs: &super::GraphCache,
) -> Result<Vec<Remedy>, PlanError> {
    let captured = matches!(preset.spec, crate::model::ModelSpec::Captured(_));
    // Each remedy is planned on its own core ([`crate::par`]), in the candidates' order.
    let planned = crate::par::map(
        candidates(cfg, preset.input.is_tokens()),
        |(name, description, c)| {
            let same_events = TrainConfig {
                allocator: cfg.allocator,
                ..c
            } == *cfg
                && !captured;
            let built = if same_events {
                let mut p = base.clone();
                p.config.allocator = c.allocator;
                Ok(p)
            } else {
                Planner::new_unless_above_cached(preset, &c, Some(graphs), |_, _| u64::MAX)
                    .and_then(|p| p.ok_or(PlanError::Overflow("event generation")))
            };
            let planner = match built {
                Ok(p) => p,
                // A captured graph plans only what it recorded: the rest needs a re-capture.
                Err(_) if captured => return None,
                Err(e) => return Some(Err(e)),
            };
            Some(evaluate(
                name,
                description,
                c,
                &planner,
                base_allocated,
                base_nvidia_smi,
                budget,
            ))
        },
    );
    let mut list = planned
        .into_iter()
        .flatten()
        .collect::<Result<Vec<_>, _>>()?;
    order(&mut list);
    Ok(list)
}
