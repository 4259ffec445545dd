//! The evaluation steps planned end to end (`sim/eval_step.rs`): merged and unmerged
//! adapters, with and without autograd.

use super::{gpt2_peak as peak, gpt2_planner as planner};
use crate::plan::finetune::{FineTune, FineTuneMode, LoraTargets};
use crate::plan::step_kind::StepKind;
use crate::plan::{Planner, TrainConfig};

fn cfg(mode: FineTuneMode, step: StepKind, merged: bool) -> TrainConfig {
    TrainConfig {
        batch: 4,
        size: Some(256),
        step,
        finetune: FineTune {
            mode,
            lora_targets: LoraTargets::AllLinear,
            lora_merged: merged,
            ..FineTune::default()
        },
        ..TrainConfig::default()
    }
}

/// Merged adapters run no adapter ops: with autograd on (eval-grad) the adapters' saved
/// inputs are gone, under `no_grad` their transients; the training that came before is
/// the same (trainable count, so gradients and optimizer state).
#[test]
fn merged_adapters_run_no_adapter_ops() {
    for mode in [FineTuneMode::Lora, FineTuneMode::Qlora] {
        let grad_unmerged = peak(&cfg(mode, StepKind::EvalGrad, false));
        let grad_merged = peak(&cfg(mode, StepKind::EvalGrad, true));
        assert!(
            grad_merged < grad_unmerged,
            "{mode:?}: {grad_merged} < {grad_unmerged}"
        );
        let unmerged = peak(&cfg(mode, StepKind::Eval, false));
        let merged = peak(&cfg(mode, StepKind::Eval, true));
        assert!(merged <= unmerged, "{mode:?}: {merged} <= {unmerged}");
        assert_eq!(
            planner(&cfg(mode, StepKind::Eval, true)).trainable,
            planner(&cfg(mode, StepKind::Eval, false)).trainable
        );
    }
}

/// A merged eval step allocates and frees in pairs like any other (no buffer left behind,
/// none freed twice): its events end where the unmerged step's do.
#[test]
fn merged_eval_frees_what_it_allocates() {
    let p = planner(&cfg(FineTuneMode::Lora, StepKind::Eval, true));
    let q = planner(&cfg(FineTuneMode::Lora, StepKind::Eval, false));
    let end = |p: &Planner| {
        p.events.events.iter().fold(0i128, |acc, e| {
            let b = &p.events.buffers[e.buffer as usize];
            let bytes = i128::from(b.per_sample) * 4 + i128::from(b.fixed);
            if e.alloc { acc + bytes } else { acc - bytes }
        })
    };
    assert_eq!(end(&p), end(&q));
}

/// `lora_merged` is refused for training steps and for full fine-tuning, by name.
#[test]
fn merged_is_checked() {
    let train = cfg(FineTuneMode::Lora, StepKind::Train, true);
    let e = train.validate().expect_err("training");
    assert!(e.to_string().contains("lora_merged"), "{e}");
    let full = cfg(FineTuneMode::Full, StepKind::Eval, true);
    let e = full.validate().expect_err("full");
    assert!(e.to_string().contains("lora_merged"), "{e}");
    let plain =
        serde_json::to_string(&cfg(FineTuneMode::Lora, StepKind::Eval, false)).expect("json");
    assert!(!plain.contains("lora_merged"), "{plain}");
    let m = cfg(FineTuneMode::Lora, StepKind::Eval, true);
    let back: TrainConfig =
        serde_json::from_str(&serde_json::to_string(&m).expect("json")).expect("back");
    assert_eq!(back, m);
}
