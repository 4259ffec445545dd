//! The search space of "make it fit": one list of values per remedy axis, built from the
//! types' `ALL` lists (a precision, optimizer or fine-tuning mode added elsewhere joins the
//! search without a change here), the settings one candidate takes, how two candidates
//! compare in memory (for pruning), and the words for what a change does and costs.

use super::super::config::{
    AllocatorConfig, Attention, LoopShape, Optimizer, Precision, TrainConfig,
};
use super::super::distributed::Strategy;
use super::super::finetune_mode::{FineTune, FineTuneMode, LoraTargets};
use super::super::optimizer::{state_bytes, step_waves};
use super::super::{DType, Gpu};
use crate::model::ir::Param;

/// LoRA ranks the search tries (peft's common choices).
pub const LORA_RANKS: [u64; 3] = [8, 16, 64];
/// LoRA targets the search tries: peft's default attention projections, then every linear.
pub const LORA_TARGETS: [LoraTargets; 2] = [LoraTargets::Attn, LoraTargets::AllLinear];

/// Fine-tuning modes in order of memory (each trains fewer bytes than the one before):
/// full, LoRA, and what later modes append. [`FineTuneMode`] has no `ALL` list of its own
/// here; a mode added to the enum is added to this list.
pub fn finetune_modes() -> Vec<FineTuneMode> {
    vec![FineTuneMode::Full, FineTuneMode::Lora, FineTuneMode::Qlora]
}

/// Fails to compile when a mode is added to [`FineTuneMode`] and not to [`finetune_modes`].
#[allow(dead_code)]
fn every_mode_is_listed(m: FineTuneMode) {
    match m {
        FineTuneMode::Full | FineTuneMode::Lora | FineTuneMode::Qlora => {}
    }
}

/// The settings of one candidate: every axis the search moves. The micro-batch and the
/// accumulation are derived per candidate (the largest micro-batch that fits, dividing the
/// effective batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Knobs {
    pub precision: Precision,
    pub attention: Attention,
    pub finetune: FineTune,
    pub optimizer: Optimizer,
    pub checkpointing: bool,
    pub loop_shape: LoopShape,
    pub expandable: bool,
    /// The multi-GPU strategy (the user's other multi-GPU settings kept).
    pub strategy: Strategy,
}

impl Knobs {
    pub fn of(cfg: &TrainConfig) -> Knobs {
        Knobs {
            precision: cfg.precision,
            attention: cfg.attention,
            finetune: cfg.finetune,
            optimizer: cfg.optimizer,
            checkpointing: cfg.checkpointing,
            loop_shape: cfg.loop_shape,
            expandable: cfg.allocator.expandable_segments,
            strategy: cfg.distributed.strategy,
        }
    }

    /// `base` with these settings (micro-batch and accumulation unchanged).
    pub fn apply(&self, base: &TrainConfig) -> TrainConfig {
        let mut c = *base;
        c.precision = self.precision;
        c.attention = self.attention;
        c.finetune = self.finetune;
        c.optimizer = self.optimizer;
        c.checkpointing = self.checkpointing;
        c.loop_shape = self.loop_shape;
        c.distributed.strategy = self.strategy;
        if self.expandable != base.allocator.expandable_segments {
            c.allocator = AllocatorConfig {
                expandable_segments: self.expandable,
                // PyTorch ignores max_split_size_mb with expandable segments.
                max_split_size_mb: if self.expandable {
                    None
                } else {
                    base.allocator.max_split_size_mb
                },
            };
        }
        c
    }

    /// The axes on which `self` differs from `user` (bit per axis).
    pub fn changed(&self, user: &Knobs) -> u8 {
        let mut m = 0u8;
        let diffs = [
            self.precision != user.precision,
            self.attention != user.attention,
            self.finetune != user.finetune,
            self.optimizer != user.optimizer,
            self.checkpointing != user.checkpointing,
            self.loop_shape != user.loop_shape,
            self.expandable != user.expandable,
            self.strategy != user.strategy,
        ];
        for (i, d) in diffs.into_iter().enumerate() {
            if d {
                m |= 1 << i;
            }
        }
        m
    }

    /// Whether every change `self` makes against `user`, `other` makes too (same value):
    /// `self`'s remedies are a subset of `other`'s.
    pub fn changes_subset_of(&self, other: &Knobs, user: &Knobs) -> bool {
        let mine = self.changed(user);
        let theirs = other.changed(user);
        if mine & !theirs != 0 {
            return false;
        }
        let same = [
            self.precision == other.precision,
            self.attention == other.attention,
            self.finetune == other.finetune,
            self.optimizer == other.optimizer,
            self.checkpointing == other.checkpointing,
            self.loop_shape == other.loop_shape,
            self.expandable == other.expandable,
            self.strategy == other.strategy,
        ];
        (0..same.len()).all(|i| mine & (1 << i) == 0 || same[i])
    }

    /// Whether `self` needs at least as much memory as `other` on every axis the planner's
    /// memory is monotone in (same precision and attention; no checkpointing where `other`
    /// has it, a larger optimizer state, the output kept, no expandable segments, more
    /// trainable adapters; the same multi-GPU strategy: the planner's memory is not proven
    /// monotone across strategies). When `other` does not fit at micro-batch 1, neither does
    /// `self`.
    pub fn needs_at_least(&self, other: &Knobs) -> bool {
        self.strategy == other.strategy
            && self.precision == other.precision
            && self.attention == other.attention
            && (self.checkpointing <= other.checkpointing)
            && (loop_rank(self.loop_shape) <= loop_rank(other.loop_shape))
            && (self.expandable <= other.expandable)
            && optimizer_bytes(self.optimizer) >= optimizer_bytes(other.optimizer)
            && finetune_at_least(&self.finetune, &other.finetune)
    }
}

fn loop_rank(l: LoopShape) -> u8 {
    match l {
        LoopShape::Plain => 0,
        LoopShape::Trainer | LoopShape::Lightning => 1,
    }
}

pub(super) fn mode_rank(m: FineTuneMode) -> usize {
    finetune_modes()
        .iter()
        .position(|&x| x == m)
        .unwrap_or(usize::MAX)
}

/// Whether fine-tuning `a` trains at least as much as `b`.
fn finetune_at_least(a: &FineTune, b: &FineTune) -> bool {
    if a == b {
        return true;
    }
    let (ra, rb) = (mode_rank(a.mode), mode_rank(b.mode));
    if a.mode == FineTuneMode::Full {
        return b.mode != FineTuneMode::Full;
    }
    if ra > rb {
        return false;
    }
    let targets_ge = match (a.lora_targets, b.lora_targets) {
        (x, y) if x == y => true,
        (LoraTargets::AllLinear, LoraTargets::Attn) => true,
        _ => false,
    };
    targets_ge && a.lora_rank >= b.lora_rank
}

/// Optimizer state and step temporaries per fp32 parameter element, for a 1024×1024 matrix
/// (what orders optimizers by memory).
pub fn optimizer_bytes(o: Optimizer) -> u64 {
    let p = Param {
        elems: 1 << 20,
        matrix: Some((1024, 1024)),
    };
    let state = state_bytes(o, &p, DType::F32).total();
    let temps = step_waves(o).len() as u64 * p.elems * 4;
    state + temps
}

/// The values of each axis: the user's first, then the alternatives that can save memory.
#[derive(Debug, Clone)]
pub struct Axes {
    pub precision: Vec<Precision>,
    pub attention: Vec<Attention>,
    pub finetune: Vec<FineTune>,
    pub optimizer: Vec<Optimizer>,
    pub checkpointing: Vec<bool>,
    pub loop_shape: Vec<LoopShape>,
    pub expandable: Vec<bool>,
    /// The user's strategy, then (on more than one GPU) the others its settings allow.
    pub strategy: Vec<Strategy>,
}

fn with_user<T: Copy + PartialEq>(user: T, others: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut v = vec![user];
    for o in others {
        if !v.contains(&o) {
            v.push(o);
        }
    }
    v
}

/// Whether an optimizer can stand in for the user's: the Adam family (Adam, AdamW, their
/// 8-bit and paged versions) and Adafactor replace each other; SGD is never proposed for
/// an Adam user (it trains transformers differently).
fn substitutes(user: Optimizer, o: Optimizer) -> bool {
    let adam_like = |o: Optimizer| o.as_str().contains("adam") || o == Optimizer::Adafactor;
    let sgd_like = |o: Optimizer| o.as_str().contains("sgd");
    (adam_like(user) && adam_like(o)) || (sgd_like(user) && sgd_like(o))
}

impl Axes {
    /// The axes for `user` on `gpu`: every precision the card runs (no bf16 on a card
    /// without bf16 tensor cores, unless the user chose it), SDPA when the user runs eager
    /// attention, the user's fine-tuning mode and every later one (LoRA at
    /// [`LORA_RANKS`] × [`LORA_TARGETS`]), the optimizers of the same family with less
    /// state, checkpointing, the trainer loop, expandable segments and, on more than one
    /// GPU, the other multi-GPU strategies ([`super::strategy::strategies`]).
    pub fn new(user: &TrainConfig, gpu: Option<&Gpu>) -> Axes {
        let lacks_bf16 = gpu.is_some_and(Gpu::lacks_bf16);
        let precision = with_user(
            user.precision,
            Precision::ALL
                .into_iter()
                .filter(|p| !(lacks_bf16 && p.compute_dtype() == DType::BF16)),
        );
        let user_mode = mode_rank(user.finetune.mode);
        let mut finetune = vec![user.finetune];
        for (i, mode) in finetune_modes().into_iter().enumerate() {
            if i <= user_mode || mode == FineTuneMode::Full {
                continue;
            }
            for targets in LORA_TARGETS {
                for rank in LORA_RANKS {
                    // The user's other fine-tuning settings (a quantization, say) stay.
                    let mut ft = user.finetune;
                    ft.mode = mode;
                    ft.lora_rank = rank;
                    ft.lora_targets = targets;
                    // Adapters freeze the whole base: a partial freeze does not carry over.
                    ft.freeze_embeddings = false;
                    ft.freeze_blocks = 0;
                    if ft.validate().is_ok() && !finetune.contains(&ft) {
                        finetune.push(ft);
                    }
                }
            }
        }
        let own = optimizer_bytes(user.optimizer);
        let optimizer = with_user(
            user.optimizer,
            Optimizer::ALL
                .into_iter()
                .filter(|&o| substitutes(user.optimizer, o) && optimizer_bytes(o) < own),
        );
        Axes {
            precision,
            attention: with_user(user.attention, [Attention::Sdpa]),
            finetune,
            optimizer,
            checkpointing: with_user(user.checkpointing, [true]),
            // A Lightning loop already releases the output; its zero_grad placement is
            // Lightning's, not a setting to offer.
            loop_shape: if user.loop_shape == LoopShape::Lightning {
                vec![LoopShape::Lightning]
            } else {
                with_user(user.loop_shape, [LoopShape::Trainer])
            },
            expandable: with_user(user.allocator.expandable_segments, [true]),
            strategy: super::strategy::strategies(&user.distributed),
        }
    }

    /// Every combination (the user's settings first).
    pub fn all(&self) -> Vec<Knobs> {
        let mut out = Vec::new();
        for &precision in &self.precision {
            for &attention in &self.attention {
                for &finetune in &self.finetune {
                    // QLoRA in bf16 runs in fp32 (`TrainConfig::effective_precision`): the
                    // fp32 combination already stands for it.
                    if finetune.mode == FineTuneMode::Qlora && precision == Precision::Bf16 {
                        continue;
                    }
                    for &optimizer in &self.optimizer {
                        for &checkpointing in &self.checkpointing {
                            for &loop_shape in &self.loop_shape {
                                for &expandable in &self.expandable {
                                    for &strategy in &self.strategy {
                                        out.push(Knobs {
                                            precision,
                                            attention,
                                            finetune,
                                            optimizer,
                                            checkpointing,
                                            loop_shape,
                                            expandable,
                                            strategy,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// The most memory-saving settings with this precision, attention, fine-tuning and
    /// strategy.
    pub fn leanest(
        &self,
        precision: Precision,
        attention: Attention,
        finetune: FineTune,
        strategy: Strategy,
    ) -> Knobs {
        let optimizer = self
            .optimizer
            .iter()
            .copied()
            .min_by_key(|&o| optimizer_bytes(o))
            .unwrap_or(Optimizer::AdamW);
        Knobs {
            precision,
            attention,
            finetune,
            optimizer,
            checkpointing: self.checkpointing.contains(&true),
            loop_shape: if self.loop_shape.contains(&LoopShape::Lightning) {
                LoopShape::Lightning
            } else if self.loop_shape.contains(&LoopShape::Trainer) {
                LoopShape::Trainer
            } else {
                LoopShape::Plain
            },
            expandable: self.expandable.contains(&true),
            strategy,
        }
    }
}

/// Words for a fine-tuning setting ("LoRA r16 on all-linear").
pub fn finetune_words(ft: &FineTune) -> String {
    match ft.mode {
        FineTuneMode::Full => "full fine-tuning".into(),
        FineTuneMode::Qlora => format!(
            "QLoRA {} r{} on {}",
            ft.quant, ft.lora_rank, ft.lora_targets
        ),
        m => format!(
            "{} r{} on {}",
            m.as_str().to_uppercase().replace("LORA", "LoRA"),
            ft.lora_rank,
            ft.lora_targets
        ),
    }
}

/// What each changed axis does, in words ("precision amp-bf16 → bf16 (model.to(bfloat16))").
pub fn change_words(k: &Knobs, user: &Knobs) -> Vec<String> {
    let mut out = Vec::new();
    if k.precision != user.precision {
        out.push(format!("precision {} → {}", user.precision, k.precision));
    }
    if k.attention != user.attention {
        out.push(format!(
            "attention {} → {}",
            user.attention.as_str(),
            k.attention.as_str()
        ));
    }
    if k.finetune != user.finetune {
        out.push(format!(
            "{} → {}",
            finetune_words(&user.finetune),
            finetune_words(&k.finetune)
        ));
    }
    if k.optimizer != user.optimizer {
        out.push(format!("optimizer {} → {}", user.optimizer, k.optimizer));
    }
    if k.checkpointing != user.checkpointing {
        out.push(if k.checkpointing {
            "activation checkpointing on".into()
        } else {
            "activation checkpointing off".into()
        });
    }
    if k.loop_shape != user.loop_shape {
        out.push(format!("loop {} → {}", user.loop_shape, k.loop_shape));
    }
    if k.expandable != user.expandable {
        out.push(if k.expandable {
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into()
        } else {
            "expandable segments off".into()
        });
    }
    if k.strategy != user.strategy {
        out.push(super::strategy::change_word(user.strategy, k.strategy));
    }
    out
}

/// What the changes cost besides time (quality, code, caveats); the recompute time of
/// checkpointing is added by the search, which knows it.
pub fn cost_words(k: &Knobs, user: &Knobs) -> Vec<String> {
    let mut out = Vec::new();
    if k.precision != user.precision {
        out.push(match k.precision {
            Precision::Bf16 => "pure bf16: no fp32 master weights, small updates round away \
                                (fine for LoRA adapters, which peft keeps in fp32; for full \
                                training use Kahan summation or stochastic rounding)"
                .to_string(),
            Precision::AmpFp16 => "fp16 autocast: needs a GradScaler; overflow-prone".into(),
            Precision::Fp32 => "fp32 matmuls: several times slower".into(),
            Precision::AmpBf16 => "bf16 autocast: mixed precision numerics".into(),
        });
    }
    if k.finetune != user.finetune && k.finetune.mode != FineTuneMode::Full {
        out.push(format!(
            "{} trains adapters only, the base weights frozen: not the quality of full \
             fine-tuning on every task",
            finetune_words(&k.finetune)
        ));
        if k.finetune.mode == FineTuneMode::Qlora {
            out.push(format!(
                "{} base weights (bitsandbytes): quantization error in the frozen base, and each \
                 layer dequantizes its weight in forward and backward (slower per sample)",
                k.finetune.quant
            ));
        }
    }
    if k.optimizer != user.optimizer {
        let name = k.optimizer.as_str();
        out.push(if name.contains("paged") {
            format!("{name}: state in unified memory, paged to the CPU under pressure (slow when it pages)")
        } else if name.contains('8') {
            format!("{name}: 8-bit quantized moments (bitsandbytes); close to 32-bit Adam, not identical")
        } else if k.optimizer == Optimizer::Adafactor {
            "Adafactor: factored second moment; retune the learning rate".into()
        } else {
            format!("optimizer {name}: retune the learning rate")
        });
    }
    if k.loop_shape != user.loop_shape && k.loop_shape == LoopShape::Trainer {
        out.push(
            "code: `loss = model(**batch).loss` (or `del out` before `loss.backward()`); HF \
             Trainer and Lightning already do this"
                .into(),
        );
    }
    if k.attention != user.attention {
        out.push("attn_implementation=\"sdpa\": no attention probabilities to inspect".into());
    }
    out
}
