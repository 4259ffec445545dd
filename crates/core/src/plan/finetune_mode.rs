//! What the user asks for when fine-tuning, as plain configuration data: the mode (full or
//! LoRA), the LoRA rank, target modules and dropout. [`super::finetune`] turns it into graph ops and
//! a parameter policy; [`super::config::TrainConfig`] carries it.

use serde::{Deserialize, Serialize};

use super::error::PlanError;

/// Module names LoRA targets match (the last component of a layer name, as peft matches
/// `target_modules` entries).
pub const LORA_MODULES: [&str; 14] = [
    "c_attn",
    "c_proj",
    "c_fc",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "qkv_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "gate_up_proj",
    "query",
    "value",
];

/// peft's default targets (`LoraConfig()` without `target_modules`) of the families here:
/// GPT-2 `c_attn`; Llama, Mistral, Qwen `q_proj`, `v_proj`; BERT `query`, `value`. Phi-3
/// has none in peft 0.21 (`qkv_proj` is matched here only to refuse it with a clear error).
const ATTN_DEFAULT: [&str; 6] = ["c_attn", "q_proj", "v_proj", "qkv_proj", "query", "value"];

/// Which layers get adapters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LoraTargets {
    /// peft's default targets for the model type (the attention projections it picks).
    #[default]
    Attn,
    /// peft's `"all-linear"`: every Linear / `Conv1D` except the output layer.
    AllLinear,
    /// Explicit module names: a bit per entry of [`LORA_MODULES`].
    Names(u16),
}

impl LoraTargets {
    pub(crate) fn mask_of(names: &[&str]) -> u16 {
        names
            .iter()
            .filter_map(|n| LORA_MODULES.iter().position(|m| m == n))
            .fold(0, |m, i| m | (1 << i))
    }

    /// The targets from their saved form, what [`Display`](std::fmt::Display) writes:
    /// `attn`, `all-linear`, or module names of [`LORA_MODULES`] joined by commas (the
    /// `.vramlab.json` field; the CLI's `--lora-targets` takes the same form).
    pub fn from_saved(s: &str) -> Result<LoraTargets, PlanError> {
        match s {
            "attn" => Ok(LoraTargets::Attn),
            "all-linear" => Ok(LoraTargets::AllLinear),
            _ => {
                let names: Vec<&str> = s
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .collect();
                if let Some(bad) = names.iter().find(|n| !LORA_MODULES.contains(n)) {
                    return Err(PlanError::Field {
                        field: "lora_targets",
                        reason: format!(
                            "unknown module `{bad}` (attn, all-linear or names among {})",
                            LORA_MODULES.join(", ")
                        ),
                    });
                }
                if names.is_empty() {
                    return Err(PlanError::Field {
                        field: "lora_targets",
                        reason: "no module named".into(),
                    });
                }
                Ok(LoraTargets::Names(LoraTargets::mask_of(&names)))
            }
        }
    }

    /// Whether a Linear named `name` (full layer name) is a target.
    pub(super) fn matches(self, name: &str) -> bool {
        let last = name.rsplit('.').next().unwrap_or(name);
        if matches!(last, "lm_head" | "decoder") {
            return false;
        }
        match self {
            LoraTargets::AllLinear => true,
            LoraTargets::Attn => ATTN_DEFAULT.contains(&last),
            LoraTargets::Names(m) => LORA_MODULES
                .iter()
                .position(|&n| n == last)
                .is_some_and(|i| m & (1 << i) != 0),
        }
    }
}

impl std::fmt::Display for LoraTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoraTargets::Attn => f.write_str("attn"),
            LoraTargets::AllLinear => f.write_str("all-linear"),
            LoraTargets::Names(m) => {
                let names: Vec<&str> = LORA_MODULES
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| m & (1 << i) != 0)
                    .map(|(_, n)| *n)
                    .collect();
                f.write_str(&names.join(","))
            }
        }
    }
}

impl Serialize for LoraTargets {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LoraTargets {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        LoraTargets::from_saved(&s).map_err(serde::de::Error::custom)
    }
}

/// Which parameters train.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FineTuneMode {
    /// Every parameter trains.
    #[default]
    Full,
    /// peft LoRA adapters train, the base model is frozen.
    Lora,
    /// QLoRA: LoRA adapters on a bitsandbytes-quantized frozen base ([`Quant`]), after
    /// peft's `prepare_model_for_kbit_training` (the other base parameters in fp32).
    Qlora,
}

impl FineTuneMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FineTuneMode::Full => "full",
            FineTuneMode::Lora => "lora",
            FineTuneMode::Qlora => "qlora",
        }
    }

    /// Every mode, for lists and searches.
    pub const ALL: [FineTuneMode; 3] =
        [FineTuneMode::Full, FineTuneMode::Lora, FineTuneMode::Qlora];

    /// Whether LoRA adapters train (LoRA and QLoRA).
    pub fn has_adapters(self) -> bool {
        matches!(self, FineTuneMode::Lora | FineTuneMode::Qlora)
    }
}

/// The bitsandbytes storage of a QLoRA base (`BitsAndBytesConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Quant {
    /// 4-bit NormalFloat (`bnb_4bit_quant_type="nf4"`), the QLoRA default.
    #[default]
    Nf4,
    /// 4-bit float (`bnb_4bit_quant_type="fp4"`).
    Fp4,
    /// LLM.int8 (`load_in_8bit=True`, `Linear8bitLt`): int8 weights and fp32 row scales.
    Int8,
}

impl Quant {
    pub const ALL: [Quant; 3] = [Quant::Nf4, Quant::Fp4, Quant::Int8];

    pub fn as_str(self) -> &'static str {
        match self {
            Quant::Nf4 => "nf4",
            Quant::Fp4 => "fp4",
            Quant::Int8 => "int8",
        }
    }

    /// Whether the weights are packed 4-bit (`Linear4bit`).
    pub fn is_4bit(self) -> bool {
        !matches!(self, Quant::Int8)
    }
}

impl std::fmt::Display for Quant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// peft's `lora_dropout`: the probability of `nn.Dropout` on each adapter's input (0, peft's
/// default, is `nn.Identity`). Held in millionths so that [`FineTune`] stays `Eq + Hash`;
/// written and read as the float users write (`0.05`). Only [`LoraDropout::new`] makes one,
/// so it is always in [0, 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct LoraDropout(u32);

impl LoraDropout {
    /// Millionths in 1.
    const SCALE: u32 = 1_000_000;

    /// No dropout (`nn.Identity`).
    pub const ZERO: LoraDropout = LoraDropout(0);

    /// `p` (0 ≤ p < 1) to the nearest millionth; a non-zero `p` stays non-zero and below 1.
    pub fn new(p: f64) -> Result<Self, PlanError> {
        if !p.is_finite() || !(0.0..1.0).contains(&p) {
            return Err(PlanError::Field {
                field: "lora_dropout",
                reason: format!("{p} is not a probability in [0, 1)"),
            });
        }
        let scaled = (p * f64::from(Self::SCALE)).round();
        // In range: 0 ≤ scaled ≤ SCALE, so the cast is exact.
        let m = scaled as u32;
        let m = if p > 0.0 {
            m.clamp(1, Self::SCALE - 1)
        } else {
            0
        };
        Ok(LoraDropout(m))
    }

    /// The probability.
    pub fn p(self) -> f64 {
        f64::from(self.0) / f64::from(Self::SCALE)
    }

    /// Whether peft builds `nn.Identity` (no dropout op runs).
    pub fn is_zero(&self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Display for LoraDropout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.p())
    }
}

impl Serialize for LoraDropout {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.p())
    }
}

impl<'de> Deserialize<'de> for LoraDropout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let p = f64::deserialize(d)?;
        LoraDropout::new(p).map_err(serde::de::Error::custom)
    }
}

/// The fine-tuning part of a config; absent in older files, which means full training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FineTune {
    pub mode: FineTuneMode,
    /// LoRA rank `r`.
    pub lora_rank: u64,
    pub lora_targets: LoraTargets,
    /// peft's `lora_dropout` (absent in older files: 0, and not written when 0).
    #[serde(skip_serializing_if = "LoraDropout::is_zero")]
    pub lora_dropout: LoraDropout,
    /// QLoRA base storage (ignored by the other modes).
    pub quant: Quant,
    /// bitsandbytes double quantization (`bnb_4bit_use_double_quant`): the absmax of each
    /// 64-element block stored in 8 bits.
    pub double_quant: bool,
    /// Full fine-tuning with the embeddings frozen (`requires_grad_(False)` on every
    /// `nn.Embedding`: token, position and type tables, so a tied output head too).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub freeze_embeddings: bool,
    /// Full fine-tuning with the first N blocks (layers) frozen.
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub freeze_blocks: u32,
    /// Evaluation with the adapters merged (peft's `merge_and_unload()` after training):
    /// the forward runs no adapter ops. Evaluation steps of LoRA / QLoRA only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub lora_merged: bool,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl Default for FineTune {
    fn default() -> Self {
        FineTune {
            mode: FineTuneMode::Full,
            lora_rank: 8,
            lora_targets: LoraTargets::Attn,
            lora_dropout: LoraDropout::ZERO,
            quant: Quant::Nf4,
            double_quant: true,
            freeze_embeddings: false,
            freeze_blocks: 0,
            lora_merged: false,
        }
    }
}

/// Largest LoRA rank accepted.
pub const MAX_LORA_RANK: u64 = 1 << 16;

impl FineTune {
    pub fn is_full(&self) -> bool {
        self.mode == FineTuneMode::Full
    }

    /// Whether every parameter trains (full fine-tuning, nothing frozen).
    pub fn trains_everything(&self) -> bool {
        self.is_full() && !self.freeze_embeddings && self.freeze_blocks == 0
    }

    pub fn validate(&self) -> Result<(), PlanError> {
        if self.mode.has_adapters() && !(1..=MAX_LORA_RANK).contains(&self.lora_rank) {
            return Err(PlanError::Field {
                field: "lora_rank",
                reason: format!("{} is not between 1 and {MAX_LORA_RANK}", self.lora_rank),
            });
        }
        // `lora_dropout` is checked where it is made ([`LoraDropout::new`]).
        if self.lora_merged && !self.mode.has_adapters() {
            return Err(PlanError::Field {
                field: "lora_merged",
                reason: "full fine-tuning has no adapters to merge (use --finetune lora|qlora)"
                    .into(),
            });
        }
        if self.mode.has_adapters() && (self.freeze_embeddings || self.freeze_blocks > 0) {
            return Err(PlanError::Field {
                field: if self.freeze_embeddings {
                    "freeze_embeddings"
                } else {
                    "freeze_blocks"
                },
                reason: format!(
                    "{} already freezes the whole base model; freezing embeddings or blocks \
                     applies to full fine-tuning",
                    self.mode.as_str()
                ),
            });
        }
        Ok(())
    }
}
