//! The words users type for the planner's settings, read into the planner's types: the
//! [`Parse`] of each setting (canonical names, the aliases users write, "did you mean" for a
//! near miss), inference exports and bench engines included. The core holds the types and
//! reads no word.

use crate::parse::Parse;

use vramlab_core::export::InferFormat;
use vramlab_core::plan::PlanError;
use vramlab_core::plan::config::DType;
use vramlab_core::plan::config::LoopShape;
use vramlab_core::plan::distributed::{FsdpMixedPrecision, Offload, Strategy};
use vramlab_core::plan::finetune_mode::{FineTuneMode, LoraDropout, LoraTargets, Quant};
use vramlab_core::plan::inference::{InferStep, KvCache};
use vramlab_core::plan::step_kind::StepKind;
use vramlab_core::record::EngineKind;

/// Aliases accepted besides the canonical names: FSDP1's sharding strategies where their
/// memory is the same.
const STRATEGY_ALIASES: [(&str, Strategy); 6] = [
    ("single", Strategy::None),
    ("zero", Strategy::Zero2),
    ("fsdp", Strategy::Fsdp2),
    ("full_shard", Strategy::Fsdp2),
    ("shard_grad_op", Strategy::Zero2),
    ("no_shard", Strategy::Ddp),
];

const STRATEGY_NAMES: [&str; 7] = [
    "none",
    "ddp",
    "zero1",
    "torch_zero1",
    "zero2",
    "zero3",
    "fsdp2",
];

/// " (did you mean `x`?)" for the closest of `names` by edit distance, or nothing.
fn closest(s: &str, names: &[&str]) -> String {
    names
        .iter()
        .map(|n| (crate::names::edit_distance(s, n), *n))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, n)| format!(" (did you mean `{n}`?)"))
        .unwrap_or_default()
}

impl Parse for StepKind {
    type Err = PlanError;
    fn parse_word(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        // `no_grad` spellings of the evaluation steps, as users write them.
        let alias = match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "eval-no-grad" | "no-grad" | "inference" | "inference-mode" | "validation" => {
                Some(StepKind::Eval)
            }
            "eval-with-grad" | "eval-grad-enabled" => Some(StepKind::EvalGrad),
            "training" => Some(StepKind::Train),
            _ => None,
        };
        alias
            .or_else(|| {
                StepKind::ALL
                    .into_iter()
                    .find(|k| k.as_str().eq_ignore_ascii_case(s))
            })
            .ok_or_else(|| PlanError::Unknown {
                field: "step",
                value: s.to_string(),
                known: "train, eval, eval-grad",
            })
    }
}

impl Parse for LoopShape {
    type Err = PlanError;
    fn parse_word(s: &str) -> Result<Self, Self::Err> {
        LoopShape::ALL
            .into_iter()
            .find(|l| l.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| PlanError::Unknown {
                field: "loop",
                value: s.to_string(),
                known: "plain, trainer, lightning",
            })
    }
}

impl Parse for LoraTargets {
    type Err = PlanError;

    /// The words users type for the targets are their saved form (no aliases).
    fn parse_word(s: &str) -> Result<Self, PlanError> {
        LoraTargets::from_saved(s)
    }
}

impl Parse for FineTuneMode {
    type Err = PlanError;

    fn parse_word(s: &str) -> Result<Self, PlanError> {
        FineTuneMode::ALL
            .into_iter()
            .find(|m| m.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| PlanError::Unknown {
                field: "finetune",
                value: s.to_string(),
                known: "full, lora, qlora",
            })
    }
}

impl Parse for Quant {
    type Err = PlanError;

    fn parse_word(s: &str) -> Result<Self, PlanError> {
        let t = s.trim().to_ascii_lowercase();
        let q = match t.as_str() {
            "nf4" | "4bit" | "4-bit" | "load_in_4bit" => Quant::Nf4,
            "fp4" => Quant::Fp4,
            "int8" | "8bit" | "8-bit" | "llm.int8" | "load_in_8bit" => Quant::Int8,
            _ => {
                return Err(PlanError::Unknown {
                    field: "quant",
                    value: s.to_string(),
                    known: "nf4, fp4, int8",
                });
            }
        };
        Ok(q)
    }
}

impl Parse for LoraDropout {
    type Err = PlanError;

    fn parse_word(s: &str) -> Result<Self, PlanError> {
        let p: f64 = s.trim().parse().map_err(|_| PlanError::Field {
            field: "lora_dropout",
            reason: format!("`{s}` is not a number"),
        })?;
        LoraDropout::new(p)
    }
}

impl Parse for InferStep {
    type Err = PlanError;
    fn parse_word(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s.to_ascii_lowercase().as_str() {
            "prefill" | "forward" => Ok(InferStep::Prefill),
            "generate" | "generation" | "decode" => Ok(InferStep::Generate),
            _ => Err(PlanError::Unknown {
                field: "step",
                value: s.to_string(),
                known: "prefill, generate",
            }),
        }
    }
}

impl Parse for KvCache {
    type Err = PlanError;
    fn parse_word(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        match s.to_ascii_lowercase().as_str() {
            "dynamic" | "dynamiccache" => Ok(KvCache::Dynamic),
            "static" | "staticcache" => Ok(KvCache::Static),
            _ => Err(PlanError::Unknown {
                field: "kv_cache",
                value: s.to_string(),
                known: "dynamic, static",
            }),
        }
    }
}

impl Parse for Strategy {
    type Err = PlanError;
    fn parse_word(s: &str) -> Result<Self, PlanError> {
        let t = s.trim().to_ascii_lowercase().replace('-', "_");
        if let Some(st) = Strategy::ALL
            .into_iter()
            .find(|st| st.as_str().replace('-', "") == t.replace('_', ""))
        {
            return Ok(st);
        }
        STRATEGY_ALIASES
            .iter()
            .find(|(a, _)| *a == t)
            .map(|&(_, st)| st)
            .ok_or_else(|| PlanError::Field {
                field: "strategy",
                reason: format!(
                    "unknown `{s}`{} (known: none, ddp, zero1, torch-zero1, zero2, zero3, fsdp2; aliases full_shard, shard_grad_op, no_shard)",
                    closest(&t, &STRATEGY_NAMES)
                ),
            })
    }
}

impl Parse for Offload {
    type Err = PlanError;
    fn parse_word(s: &str) -> Result<Self, PlanError> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "none" | "no" => Ok(Offload::None),
            "optimizer" | "opt" | "optim" => Ok(Offload::Optimizer),
            "params" | "param" | "parameters" => Ok(Offload::Params),
            _ => Err(PlanError::Field {
                field: "offload",
                reason: format!(
                    "unknown `{s}`{} (known: none, optimizer, params)",
                    closest(&t, &["none", "optimizer", "params"])
                ),
            }),
        }
    }
}

impl Parse for FsdpMixedPrecision {
    type Err = PlanError;
    fn parse_word(s: &str) -> Result<Self, PlanError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "fp32" | "off" => Ok(FsdpMixedPrecision::None),
            "bf16" | "bfloat16" => Ok(FsdpMixedPrecision::Bf16),
            "fp16" | "float16" | "half" => Ok(FsdpMixedPrecision::Fp16),
            other => Err(PlanError::Field {
                field: "fsdp_mixed_precision",
                reason: format!(
                    "unknown `{s}`{} (known: none, bf16, fp16)",
                    closest(other, &["none", "bf16", "fp16"])
                ),
            }),
        }
    }
}

/// Parses an inference dtype: the dtype the model is loaded in (`from_pretrained(...,
/// dtype=...)`); no autocast.
pub fn parse_dtype(s: &str) -> Result<DType, PlanError> {
    let s = s.trim();
    match s.to_ascii_lowercase().as_str() {
        "bf16" | "bfloat16" | "torch.bfloat16" => Ok(DType::BF16),
        "fp16" | "float16" | "half" | "torch.float16" => Ok(DType::F16),
        "fp32" | "float32" | "float" | "torch.float32" => Ok(DType::F32),
        _ => Err(PlanError::Unknown {
            field: "precision",
            value: s.to_string(),
            known: "bf16, fp16, fp32 (inference loads the weights in this dtype; amp modes \
                    are for training)",
        }),
    }
}

impl Parse for InferFormat {
    type Err = PlanError;

    /// The inference export named `s` (case and surrounding blanks ignored).
    fn parse_word(s: &str) -> Result<Self, PlanError> {
        let t = s.trim();
        InferFormat::ALL
            .into_iter()
            .find(|f| f.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| PlanError::Unknown {
                field: "format",
                value: s.to_string(),
                known: "transformers, vllm",
            })
    }
}

impl Parse for EngineKind {
    type Err = PlanError;

    /// `native` / `torch`, as written.
    fn parse_word(s: &str) -> Result<Self, PlanError> {
        EngineKind::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| PlanError::Unknown {
                field: "engine",
                value: s.to_string(),
                known: "native, torch",
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lora_dropout_words_are_read_and_checked() {
        for (s, p) in [("0", 0.0), ("0.05", 0.05), ("0.1", 0.1), (" 0.5 ", 0.5)] {
            let d: LoraDropout = crate::parse::parse(s).expect(s);
            assert_eq!(d.p(), p, "{s}");
            assert_eq!(d.is_zero(), p == 0.0);
        }
        for bad in ["1", "1.5", "-0.1", "NaN", "inf", "abc", ""] {
            let err = crate::parse::parse::<LoraDropout>(bad)
                .expect_err(bad)
                .to_string();
            assert!(err.starts_with("lora_dropout: "), "{bad}: {err}");
        }
    }

    #[test]
    fn lora_target_words_round_trip_and_unknown_modules_are_named() {
        for s in [
            "attn",
            "all-linear",
            "c_attn,c_fc",
            "q_proj,v_proj,down_proj",
        ] {
            let t: LoraTargets = crate::parse::parse(s).expect(s);
            assert_eq!(t.to_string(), s);
        }
        let err = crate::parse::parse::<LoraTargets>("c_attn,nope").expect_err("unknown");
        assert!(
            err.to_string()
                .starts_with("lora_targets: unknown module `nope`")
        );
        assert!(crate::parse::parse::<LoraTargets>("").is_err());
    }

    #[test]
    fn names_parse_and_unknown_ones_are_named() {
        for s in InferStep::ALL {
            assert_eq!(crate::parse::parse::<InferStep>(s.as_str()).ok(), Some(s));
        }
        assert_eq!(
            crate::parse::parse::<KvCache>("static").ok(),
            Some(KvCache::Static)
        );
        let e = crate::parse::parse::<KvCache>("sttic").expect_err("unknown");
        assert!(e.to_string().contains("dynamic, static"), "{e}");
        assert_eq!(parse_dtype("bfloat16").ok(), Some(DType::BF16));
        let e = parse_dtype("amp-bf16").expect_err("amp");
        assert!(e.to_string().contains("precision"), "{e}");
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for k in StepKind::ALL {
            assert_eq!(crate::parse::parse::<StepKind>(k.as_str()).ok(), Some(k));
            let json = serde_json::to_string(&k).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
        }
        assert_eq!(
            crate::parse::parse::<StepKind>("no_grad").ok(),
            Some(StepKind::Eval)
        );
        let e = crate::parse::parse::<StepKind>("evl")
            .err()
            .map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("step") && m.contains("eval-grad")));
    }

    #[test]
    fn names_and_aliases_parse_and_misspellings_suggest() {
        assert_eq!(
            crate::parse::parse::<Strategy>("FSDP2").ok(),
            Some(Strategy::Fsdp2)
        );
        assert_eq!(
            crate::parse::parse::<Strategy>("full_shard").ok(),
            Some(Strategy::Fsdp2)
        );
        assert_eq!(
            crate::parse::parse::<Strategy>("SHARD_GRAD_OP").ok(),
            Some(Strategy::Zero2)
        );
        assert_eq!(
            crate::parse::parse::<Strategy>("zero-3").ok(),
            Some(Strategy::Zero3)
        );
        let e = crate::parse::parse::<Strategy>("zer03")
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("strategy") && e.contains("zero3"), "{e}");
        let e = crate::parse::parse::<Offload>("optimzer")
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("offload") && e.contains("optimizer"), "{e}");
        assert_eq!(
            crate::parse::parse::<FsdpMixedPrecision>("bf16").ok(),
            Some(FsdpMixedPrecision::Bf16)
        );
    }

    #[test]
    fn export_and_engine_names_parse_and_refuse_others() {
        assert_eq!(
            crate::parse::parse::<InferFormat>(" Transformers ").ok(),
            Some(InferFormat::Transformers)
        );
        assert_eq!(
            crate::parse::parse::<InferFormat>("VLLM").ok(),
            Some(InferFormat::Vllm)
        );
        assert!(crate::parse::parse::<InferFormat>("hf").is_err());
        assert_eq!(
            crate::parse::parse::<EngineKind>("torch").ok(),
            Some(EngineKind::Torch)
        );
        assert!(crate::parse::parse::<EngineKind>("Torch").is_err());
    }
}
