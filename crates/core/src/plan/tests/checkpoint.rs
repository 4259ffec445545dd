//! Activation checkpointing's steps planned end to end (`sim/checkpoint.rs`): reentrant and
//! non-reentrant under LoRA and full fine-tuning.

use super::{gpt2_peak as peak, gpt2_planner as planner};
use crate::plan::config::TrainConfig;
use crate::plan::finetune::{FineTune, FineTuneMode};

const B: u64 = 2;
const SEQ: u64 = 128;
/// One fp32 `[B, SEQ, 768]` hidden state of GPT-2.
const HIDDEN: u64 = B * SEQ * 768 * 4;

fn lora(reentrant: bool) -> TrainConfig {
    TrainConfig {
        batch: B,
        size: Some(SEQ),
        checkpointing: true,
        checkpoint_reentrant: reentrant,
        finetune: FineTune {
            mode: FineTuneMode::Lora,
            ..FineTune::default()
        },
        ..TrainConfig::default()
    }
}

/// LoRA under reentrant checkpointing: the recomputed block output and its gradient are
/// held through each block's inner backward: at most a few hidden states more (here the
/// peak is the embedding gradient at the end of backward, the same under both), the same
/// trainable count.
#[test]
fn reentrant_lora_holds_the_block_outputs_and_the_embedding_gradient() {
    let plain = peak(&lora(false));
    let reentrant = peak(&lora(true));
    assert!(
        reentrant >= plain && reentrant - plain <= 6 * HIDDEN,
        "{plain} -> {reentrant} (hidden state {HIDDEN})"
    );
    assert_eq!(
        planner(&lora(true)).trainable,
        planner(&lora(false)).trainable
    );
}

/// Full fine-tuning: the embedding output requires grad anyway (its table trains), so
/// only the held outputs and gradients differ: at most two hidden states at a time.
#[test]
fn reentrant_full_finetuning_adds_at_most_the_held_output_and_gradient() {
    let full = |reentrant| TrainConfig {
        finetune: FineTune::default(),
        ..lora(reentrant)
    };
    let plain = peak(&full(false));
    let reentrant = peak(&full(true));
    assert!(
        reentrant >= plain && reentrant - plain <= 2 * HIDDEN,
        "{plain} -> {reentrant} (hidden state {HIDDEN})"
    );
}

/// Reentrant needs checkpointing, and a plain config's JSON does not change.
#[test]
fn reentrant_is_checked_and_absent_from_plain_configs() {
    let bad = TrainConfig {
        checkpoint_reentrant: true,
        ..TrainConfig::default()
    };
    let e = bad.validate().expect_err("refused");
    assert!(e.to_string().contains("checkpoint_reentrant"), "{e}");
    let json = serde_json::to_string(&TrainConfig::default()).expect("json");
    assert!(!json.contains("reentrant"), "{json}");
    let json = serde_json::to_string(&lora(true)).expect("json");
    assert!(json.contains("\"checkpoint_reentrant\":true"), "{json}");
    let back: TrainConfig = serde_json::from_str(&json).expect("back");
    assert_eq!(back, lora(true));
}
