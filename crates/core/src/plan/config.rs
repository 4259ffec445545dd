//! Training configuration: what the user plans to run.

use serde::{Deserialize, Serialize};
use std::fmt;

use super::error::PlanError;

pub use super::numerics::{DType, Optimizer, Precision};

/// Attention kernel for the Hugging Face families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Attention {
    /// Materialises the seq×seq attention probabilities.
    #[serde(rename = "eager")]
    Eager,
    /// `scaled_dot_product_attention` (flash / memory-efficient kernels).
    #[default]
    #[serde(rename = "sdpa")]
    Sdpa,
}

impl Attention {
    pub fn as_str(self) -> &'static str {
        match self {
            Attention::Eager => "eager",
            Attention::Sdpa => "sdpa",
        }
    }
}

/// How the training loop holds the model's output while `backward()` runs.
///
/// Files and configs written before this setting existed have no `loop` key: they were
/// planned with the output kept alive, so an absent key means [`LoopShape::Plain`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum LoopShape {
    /// `out = model(x); loss = criterion(out, y); loss.backward()` (or
    /// `outputs = model(**batch); loss = outputs.loss; loss.backward()`): the output — the
    /// logits, and for Hugging Face models the `past_key_values` cache — stays referenced
    /// through backward. The default: it is what hand-written and accelerate loops do, and
    /// it is the larger of the two, so a plan that fits never hides one logits tensor.
    #[default]
    #[serde(rename = "plain")]
    Plain,
    /// `loss = model(**batch).loss; loss.backward()` — what HF `Trainer.compute_loss` and a
    /// Lightning `training_step` returning the loss do: the output object is dropped before
    /// backward, so only what autograd saved stays.
    #[serde(rename = "trainer")]
    Trainer,
    /// A PyTorch Lightning `training_step` returning the loss under automatic optimization:
    /// the output is dropped as in [`LoopShape::Trainer`], and Lightning's `Closure` runs
    /// `training_step`, *then* `zero_grad`, then `backward` (lightning 2.x
    /// `loops/optimization/automatic.py`: `Closure.closure` calls `_step_fn`, `_zero_grad_fn`,
    /// `_backward_fn` in that order), so the previous step's gradients stay allocated through
    /// the forward.
    #[serde(rename = "lightning")]
    Lightning,
}

impl LoopShape {
    pub const ALL: [LoopShape; 3] = [LoopShape::Plain, LoopShape::Trainer, LoopShape::Lightning];

    pub fn as_str(self) -> &'static str {
        match self {
            LoopShape::Plain => "plain",
            LoopShape::Trainer => "trainer",
            LoopShape::Lightning => "lightning",
        }
    }

    /// A short description for outputs ("plain (output kept through backward)").
    pub fn describe(self) -> &'static str {
        match self {
            LoopShape::Plain => "plain (model output kept alive through backward)",
            LoopShape::Trainer => "trainer (model output released before backward)",
            LoopShape::Lightning => {
                "lightning (model output released before backward; zero_grad after the forward)"
            }
        }
    }
}

impl fmt::Display for LoopShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// PyTorch caching-allocator settings (`PYTORCH_CUDA_ALLOC_CONF`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct AllocatorConfig {
    /// `expandable_segments:True`.
    pub expandable_segments: bool,
    /// `max_split_size_mb:N`.
    pub max_split_size_mb: Option<u64>,
}

/// Everything that determines one training step besides the model.
/// Unknown fields are refused: a misspelt `"bacth"` would otherwise plan the default batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Micro-batch size (samples per forward/backward).
    pub batch: u64,
    /// Sequence length or image side; `None` = the preset's default.
    pub size: Option<u64>,
    /// Target (decoder) length of an encoder-decoder model; `None` = its default (128).
    /// Absent in older files; an error for any other model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_seq: Option<u64>,
    pub precision: Precision,
    pub optimizer: Optimizer,
    /// Gradient-accumulation steps per optimizer step.
    pub accum: u64,
    /// Activation checkpointing of every block.
    pub checkpointing: bool,
    /// Reentrant checkpointing (`use_reentrant=True`, torch's `CheckpointFunction`) instead
    /// of the non-reentrant default (either way transformers' `enable_input_require_grads`
    /// makes the embedding output require grad). Absent in older files (and not written
    /// when false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub checkpoint_reentrant: bool,
    pub attention: Attention,
    pub allocator: AllocatorConfig,
    /// The training loop's shape; absent in older files, which means `plain`.
    #[serde(rename = "loop")]
    pub loop_shape: LoopShape,
    /// Full training or LoRA; absent in older files, which means full training. Written
    /// whenever something is frozen or adapted (a partial full fine-tune too).
    #[serde(skip_serializing_if = "super::finetune_mode::FineTune::trains_everything")]
    pub finetune: super::finetune_mode::FineTune,
    /// A training step or an evaluation step after training; absent in older files, which
    /// means training.
    #[serde(skip_serializing_if = "super::step_kind::StepKind::is_train")]
    pub step: super::step_kind::StepKind,
    /// More than one GPU (strategy, world, offload); absent means one GPU.
    #[serde(skip_serializing_if = "super::distributed::Distributed::is_single")]
    pub distributed: super::distributed::Distributed,
    /// Mixture-of-experts routing imbalance (≥ 1): every expert's routed rows sized for the
    /// busiest expert receiving this many times its uniform `tokens·k/E` share; 1 (the
    /// default, absent in older files) is uniform routing. Only for MoE models.
    #[serde(skip_serializing_if = "is_uniform_routing")]
    pub moe_imbalance: f64,
}

fn is_uniform_routing(f: &f64) -> bool {
    *f == 1.0
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            batch: 8,
            size: None,
            target_seq: None,
            precision: Precision::AmpBf16,
            optimizer: Optimizer::AdamW,
            accum: 1,
            checkpointing: false,
            checkpoint_reentrant: false,
            attention: Attention::Sdpa,
            allocator: AllocatorConfig::default(),
            loop_shape: LoopShape::Plain,
            finetune: super::finetune_mode::FineTune::default(),
            step: super::step_kind::StepKind::Train,
            distributed: super::distributed::Distributed::default(),
            moe_imbalance: 1.0,
        }
    }
}

/// Largest micro-batch accepted (the GUI slider's top is 65536).
pub const MAX_BATCH: u64 = 1 << 20;
/// Largest accumulation count accepted.
pub const MAX_ACCUM: u64 = 1 << 16;
/// `max_split_size_mb` must exceed this: PyTorch's caching allocator refuses smaller values
/// ("max_split_size_mb too small, must be > 20"; its large-buffer size is 20 MiB).
pub const MIN_MAX_SPLIT_MB: u64 = 20;

impl TrainConfig {
    /// The precision the step really runs in. QLoRA in "bf16" (the model loaded with
    /// `dtype=torch.bfloat16`, no autocast) runs in fp32: peft's
    /// `prepare_model_for_kbit_training` upcasts every fp16/bf16 parameter that is not a
    /// `Params4bit` to fp32 (peft 0.21 `utils/other.py`), so activations flow in fp32 between
    /// the 4-bit layers exactly as for a model loaded in fp32.
    pub fn effective_precision(&self) -> Precision {
        if self.finetune.mode == super::finetune_mode::FineTuneMode::Qlora
            && self.precision == Precision::Bf16
        {
            Precision::Fp32
        } else {
            self.precision
        }
    }

    /// Checks the numbers; errors name the field.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.batch == 0 {
            return Err(PlanError::Field {
                field: "batch",
                reason: "must be at least 1".into(),
            });
        }
        if self.batch > MAX_BATCH {
            return Err(PlanError::Field {
                field: "batch",
                reason: format!("{} is larger than the limit {MAX_BATCH}", self.batch),
            });
        }
        if self.accum == 0 {
            return Err(PlanError::Field {
                field: "accum",
                reason: "must be at least 1".into(),
            });
        }
        if self.accum > MAX_ACCUM {
            return Err(PlanError::Field {
                field: "accum",
                reason: format!("{} is larger than the limit {MAX_ACCUM}", self.accum),
            });
        }
        self.finetune.validate()?;
        self.distributed.validate()?;
        if self.finetune.lora_merged && !self.step.is_eval() {
            return Err(PlanError::Field {
                field: "lora_merged",
                reason: "merged adapters (merge_and_unload) are for evaluation: a training step \
                         trains unmerged adapters; plan --step eval|eval-grad"
                    .into(),
            });
        }
        if self.checkpoint_reentrant && !self.checkpointing {
            return Err(PlanError::Field {
                field: "checkpoint_reentrant",
                reason: "reentrant checkpointing needs activation checkpointing (--checkpointing)"
                    .into(),
            });
        }
        if self.checkpoint_reentrant && !self.distributed.is_single() {
            return Err(PlanError::Field {
                field: "checkpoint_reentrant",
                reason: "reentrant checkpointing is planned on one GPU only; plan it without \
                         --gpus/--strategy"
                    .into(),
            });
        }
        if self.step.is_eval() && !self.distributed.is_single() {
            return Err(PlanError::Field {
                field: "step",
                reason: format!(
                    "the {} step is planned on one GPU only (an evaluation step under {} is \
                     not modelled yet); plan it without --gpus/--strategy",
                    self.step, self.distributed.strategy
                ),
            });
        }
        if let Some(mb) = self.allocator.max_split_size_mb
            && mb <= MIN_MAX_SPLIT_MB
        {
            return Err(PlanError::Field {
                field: "max_split_size_mb",
                reason: format!(
                    "{mb} is too small: PyTorch requires more than {MIN_MAX_SPLIT_MB} (MB)"
                ),
            });
        }
        if !(self.moe_imbalance.is_finite() && self.moe_imbalance >= 1.0) {
            return Err(PlanError::Field {
                field: "moe_imbalance",
                reason: format!(
                    "{} must be a number ≥ 1 (1 = uniform routing; F = the busiest expert \
                     gets F× its share)",
                    self.moe_imbalance
                ),
            });
        }
        if self.size == Some(0) {
            return Err(PlanError::Field {
                field: "size",
                reason: "sequence length / image size must be at least 1".into(),
            });
        }
        if self.target_seq == Some(0) {
            return Err(PlanError::Field {
                field: "target_seq",
                reason: "the target sequence length must be at least 1".into(),
            });
        }
        Ok(())
    }

    /// Samples per optimizer step.
    pub fn effective_batch(&self) -> u64 {
        self.batch.saturating_mul(self.accum)
    }

    /// Samples per optimizer step over all ranks: micro × accumulation × world.
    pub fn global_batch(&self) -> u64 {
        self.effective_batch()
            .saturating_mul(self.distributed.world())
    }
}
