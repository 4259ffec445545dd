//! Warnings about a configuration the planner plans but the card runs badly or not at all:
//! shown beside the plan by every front end (`warnings` of `plan --json`).

use crate::plan::config::DType;
use crate::plan::{Gpu, Planner, TrainConfig};

/// [`for_config`] and what the planned model runs that the plan does not model
/// ([`Planner::unmodelled`]).
pub fn for_planner(planner: &Planner, gpu: &Gpu) -> Vec<String> {
    let mut w = for_config(&planner.config, gpu);
    w.extend(planner.unmodelled.iter().cloned());
    w
}

/// The warnings for `cfg` on `gpu`, one sentence each (empty when there is nothing to say).
pub fn for_config(cfg: &TrainConfig, gpu: &Gpu) -> Vec<String> {
    let mut w = Vec::new();
    if cfg.effective_precision() != cfg.precision {
        w.push(format!(
            "QLoRA with --precision {} (the model loaded with dtype=torch.bfloat16, no autocast) \
             runs in {}: peft's prepare_model_for_kbit_training upcasts every parameter that is \
             not 4-bit to fp32 (peft 0.21 utils/other.py), so activations flow in fp32 between \
             the 4-bit layers; planned so (--precision amp-bf16 plans bf16 autocast)",
            cfg.precision.label(),
            cfg.effective_precision().label()
        ));
    }
    if cfg.precision.compute_dtype() == DType::BF16 && gpu.lacks_bf16() {
        w.push(format!(
            "{} has no bf16 tensor cores (pre-Ampere): {} runs bf16 matmuls emulated and slowly, \
             or not at all (torch.cuda.is_bf16_supported() is False); amp-fp16 is the usual choice there",
            gpu.name,
            cfg.precision.label()
        ));
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Precision;
    use crate::plan::gpus::card as find;

    #[test]
    fn bf16_on_a_pre_ampere_card_is_warned_about() {
        let t4 = find("t4").expect("t4");
        let a10 = find("a10").expect("a10");
        let bf16 = TrainConfig {
            precision: Precision::AmpBf16,
            ..TrainConfig::default()
        };
        let fp16 = TrainConfig {
            precision: Precision::AmpFp16,
            ..TrainConfig::default()
        };
        let w = for_config(&bf16, &t4);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("NVIDIA T4 has no bf16 tensor cores"),
            "{w:?}"
        );
        assert!(for_config(&fp16, &t4).is_empty());
        assert!(for_config(&bf16, &a10).is_empty());
    }

    /// QLoRA in pure bf16 is planned in fp32 (what `prepare_model_for_kbit_training` leaves),
    /// and the plan says why its precision reads fp32.
    #[test]
    fn qlora_in_bf16_says_it_runs_in_fp32() {
        use crate::plan::finetune_mode::{FineTune, FineTuneMode};
        let a10 = find("a10").expect("a10");
        let qlora = |precision| TrainConfig {
            precision,
            finetune: FineTune {
                mode: FineTuneMode::Qlora,
                ..FineTune::default()
            },
            ..TrainConfig::default()
        };
        let w = for_config(&qlora(Precision::Bf16), &a10);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("prepare_model_for_kbit_training"), "{w:?}");
        assert!(for_config(&qlora(Precision::AmpBf16), &a10).is_empty());
        let lora_bf16 = TrainConfig {
            precision: Precision::Bf16,
            ..TrainConfig::default()
        };
        assert!(for_config(&lora_bf16, &a10).is_empty());
    }
}
