//! The numeric settings of a step: element types, the precision mode and the optimizer
//! (re-exported by [`super::config`], which holds the rest of the training configuration).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element types the simulation assigns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    Bool,
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::Bool | DType::U8 => 1,
        }
    }

    pub fn is_low(self) -> bool {
        matches!(self, DType::F16 | DType::BF16)
    }
}

/// Numeric precision of training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Precision {
    /// Everything in float32 (TF32 matmuls do not change memory).
    #[serde(rename = "fp32")]
    Fp32,
    /// `torch.autocast(dtype=float16)` with a GradScaler; fp32 weights.
    #[serde(rename = "amp-fp16")]
    AmpFp16,
    /// `torch.autocast(dtype=bfloat16)`; fp32 weights.
    #[default]
    #[serde(rename = "amp-bf16")]
    AmpBf16,
    /// `model.to(torch.bfloat16)`: weights, gradients and optimizer state in bf16, no fp32 master copy.
    #[serde(rename = "bf16")]
    Bf16,
}

impl Precision {
    pub const ALL: [Precision; 4] = [
        Precision::Fp32,
        Precision::AmpFp16,
        Precision::AmpBf16,
        Precision::Bf16,
    ];

    /// dtype of parameters, gradients and optimizer state.
    pub fn param_dtype(self) -> DType {
        match self {
            Precision::Bf16 => DType::BF16,
            _ => DType::F32,
        }
    }

    /// dtype matmuls and convolutions compute in.
    pub fn compute_dtype(self) -> DType {
        match self {
            Precision::Fp32 => DType::F32,
            Precision::AmpFp16 => DType::F16,
            Precision::AmpBf16 | Precision::Bf16 => DType::BF16,
        }
    }

    /// Whether autocast is active.
    pub fn autocast(self) -> bool {
        matches!(self, Precision::AmpFp16 | Precision::AmpBf16)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::AmpFp16 => "amp-fp16",
            Precision::AmpBf16 => "amp-bf16",
            Precision::Bf16 => "bf16",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Precision::Fp32 => "FP32",
            Precision::AmpFp16 => "AMP FP16",
            Precision::AmpBf16 => "AMP BF16",
            Precision::Bf16 => "Pure BF16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Optimizer (PyTorch defaults, `foreach` implementation on CUDA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Optimizer {
    #[serde(rename = "sgd")]
    Sgd,
    #[serde(rename = "sgd-momentum")]
    SgdMomentum,
    #[serde(rename = "adam")]
    Adam,
    #[default]
    #[serde(rename = "adamw")]
    AdamW,
    #[serde(rename = "adafactor")]
    Adafactor,
    /// bitsandbytes `Adam8bit`: two uint8 states plus per-2048-block fp32 scales.
    #[serde(rename = "adam8bit")]
    Adam8bit,
    /// bitsandbytes `AdamW8bit` (HF `optim="adamw_bnb_8bit"`): the same state as `Adam8bit`.
    #[serde(rename = "adamw-8bit")]
    AdamW8bit,
    /// bitsandbytes `PagedAdamW8bit` (`paged_adamw_8bit`): 8-bit states of tensors with
    /// at least 100 000 elements in unified memory (paged), their block scales on the GPU.
    #[serde(rename = "paged-adamw-8bit")]
    PagedAdamW8bit,
    /// bitsandbytes `PagedAdamW32bit` (`paged_adamw_32bit`): fp32 states in unified memory
    /// for tensors with at least 100 000 elements.
    #[serde(rename = "paged-adamw")]
    PagedAdamW,
}

impl Optimizer {
    pub const ALL: [Optimizer; 9] = [
        Optimizer::Sgd,
        Optimizer::SgdMomentum,
        Optimizer::Adam,
        Optimizer::AdamW,
        Optimizer::Adafactor,
        Optimizer::Adam8bit,
        Optimizer::AdamW8bit,
        Optimizer::PagedAdamW8bit,
        Optimizer::PagedAdamW,
    ];

    /// Whether part of the state lives in unified memory (bitsandbytes paged optimizers).
    pub fn is_paged(self) -> bool {
        matches!(self, Optimizer::PagedAdamW8bit | Optimizer::PagedAdamW)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Optimizer::Sgd => "sgd",
            Optimizer::SgdMomentum => "sgd-momentum",
            Optimizer::Adam => "adam",
            Optimizer::AdamW => "adamw",
            Optimizer::Adafactor => "adafactor",
            Optimizer::Adam8bit => "adam8bit",
            Optimizer::AdamW8bit => "adamw-8bit",
            Optimizer::PagedAdamW8bit => "paged-adamw-8bit",
            Optimizer::PagedAdamW => "paged-adamw",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Optimizer::Sgd => "SGD",
            Optimizer::SgdMomentum => "SGD + momentum",
            Optimizer::Adam => "Adam",
            Optimizer::AdamW => "AdamW",
            Optimizer::Adafactor => "Adafactor",
            Optimizer::Adam8bit => "8-bit Adam",
            Optimizer::AdamW8bit => "8-bit AdamW",
            Optimizer::PagedAdamW8bit => "Paged 8-bit AdamW",
            Optimizer::PagedAdamW => "Paged AdamW (32-bit)",
        }
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
