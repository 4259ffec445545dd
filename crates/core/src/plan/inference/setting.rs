//! What an inference plan is for: the call (`model.generate()` or a plain forward), the
//! prompt and new tokens, the weights' dtype, the attention kernel and the KV cache.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::plan::PlanError;
use crate::plan::config::{AllocatorConfig, Attention, DType};

/// The inference call planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InferStep {
    /// `with torch.no_grad(): out = model(input_ids)`: one forward over the prompt with the
    /// logits of every position, and the forward's own `DynamicCache` (`use_cache` defaults
    /// to true), both held by `out`.
    #[serde(rename = "prefill")]
    Prefill,
    /// `model.generate(input_ids, max_new_tokens=N)` (greedy): the prefill forward with the
    /// last position's logits only (`logits_to_keep=1`), then `N − 1` decode steps.
    #[serde(rename = "generate")]
    Generate,
}

impl InferStep {
    pub const ALL: [InferStep; 2] = [InferStep::Prefill, InferStep::Generate];

    pub fn as_str(self) -> &'static str {
        match self {
            InferStep::Prefill => "prefill",
            InferStep::Generate => "generate",
        }
    }

    /// A short description for outputs.
    pub fn describe(self) -> &'static str {
        match self {
            InferStep::Prefill => {
                "a forward under torch.no_grad() over the prompt (every position's logits, \
                 the forward's KV cache)"
            }
            InferStep::Generate => {
                "model.generate(): the prefill (last position's logits) and the decode steps"
            }
        }
    }
}

impl fmt::Display for InferStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The KV cache `generate` uses (transformers' `cache_implementation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum KvCache {
    /// `DynamicCache`: each layer's keys and values grow by `torch.cat` at every call.
    #[default]
    #[serde(rename = "dynamic")]
    Dynamic,
    /// `StaticCache`: each layer's keys and values preallocated (zeros) to `max_cache_len` =
    /// prompt + new tokens at its first update, written in place (`index_copy_`). Planned
    /// with `disable_compile=True` (on CUDA transformers otherwise compiles the decode step
    /// with CUDA graphs).
    #[serde(rename = "static")]
    Static,
}

impl KvCache {
    pub fn as_str(self) -> &'static str {
        match self {
            KvCache::Dynamic => "dynamic",
            KvCache::Static => "static",
        }
    }
}

/// The name of an inference dtype.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "fp16",
        _ => "fp32",
    }
}

/// One inference call to plan.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct InferConfig {
    pub step: InferStep,
    /// Sequences in the batch.
    pub batch: u64,
    /// Prompt tokens per sequence.
    pub prompt: u64,
    /// Tokens generated per sequence (`max_new_tokens = min_new_tokens`); 0 for a prefill.
    pub new_tokens: u64,
    /// The weights' dtype (activations and the KV cache follow it).
    #[serde(serialize_with = "ser_dtype")]
    pub dtype: DType,
    pub attention: Attention,
    pub kv_cache: KvCache,
    pub allocator: AllocatorConfig,
}

fn ser_dtype<S: serde::Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(dtype_name(*d))
}

impl InferConfig {
    /// `model.generate()` as transformers runs it without options (SDPA attention, a dynamic
    /// KV cache, PyTorch's default allocator settings), the weights in `dtype`.
    pub fn generate(batch: u64, prompt: u64, new_tokens: u64, dtype: DType) -> InferConfig {
        InferConfig {
            step: InferStep::Generate,
            batch,
            prompt,
            new_tokens,
            dtype,
            attention: Attention::Sdpa,
            kv_cache: KvCache::Dynamic,
            allocator: AllocatorConfig::default(),
        }
    }

    /// Checks the numbers; errors name the field.
    pub fn validate(&self) -> Result<(), PlanError> {
        if self.batch == 0 {
            return Err(PlanError::Field {
                field: "batch",
                reason: "must be at least 1 sequence".into(),
            });
        }
        if self.prompt == 0 {
            return Err(PlanError::Field {
                field: "seq",
                reason: "the prompt must have at least 1 token".into(),
            });
        }
        if !matches!(self.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(PlanError::Field {
                field: "precision",
                reason: "inference plans bf16, fp16 or fp32 weights".into(),
            });
        }
        match self.step {
            InferStep::Generate if self.new_tokens == 0 => Err(PlanError::Field {
                field: "new_tokens",
                reason: "generate needs at least 1 new token (--new-tokens N, N ≥ 1); a \
                         forward without generation is --step prefill"
                    .into(),
            }),
            InferStep::Prefill if self.new_tokens > 0 => Err(PlanError::Field {
                field: "new_tokens",
                reason: "a prefill generates nothing; use --step generate for new tokens".into(),
            }),
            InferStep::Prefill if self.kv_cache == KvCache::Static => Err(PlanError::Field {
                field: "kv_cache",
                reason: "a plain forward builds its own DynamicCache; a static cache is a \
                         generate setting (--step generate --kv-cache static)"
                    .into(),
            }),
            _ => Ok(()),
        }
    }

    /// Prompt plus new tokens: the positions the model sees.
    pub fn total_tokens(&self) -> u64 {
        self.prompt.saturating_add(self.new_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(step: InferStep, new_tokens: u64) -> InferConfig {
        InferConfig {
            step,
            batch: 1,
            prompt: 16,
            new_tokens,
            dtype: DType::BF16,
            attention: Attention::Sdpa,
            kv_cache: KvCache::Dynamic,
            allocator: AllocatorConfig::default(),
        }
    }

    #[test]
    fn generate_needs_new_tokens_and_batch_at_least_one() {
        let e = cfg(InferStep::Generate, 0).validate().expect_err("0 new");
        assert!(e.to_string().contains("new_tokens"), "{e}");
        assert!(cfg(InferStep::Generate, 1).validate().is_ok());
        let mut c = cfg(InferStep::Prefill, 0);
        assert!(c.validate().is_ok());
        c.batch = 0;
        assert!(
            c.validate()
                .expect_err("batch")
                .to_string()
                .contains("batch")
        );
        let mut s = cfg(InferStep::Prefill, 0);
        s.kv_cache = KvCache::Static;
        assert!(s.validate().is_err());
    }
}
