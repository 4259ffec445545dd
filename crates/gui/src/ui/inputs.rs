//! The left panel: model, training configuration and target GPU.

use egui::{DragValue, Ui};

use vramlab_core::plan::config::LoopShape;
use vramlab_core::plan::finetune::{
    FineTune, FineTuneMode, LoraDropout, LoraTargets, MAX_LORA_RANK,
};
use vramlab_core::plan::step_kind::StepKind;
use vramlab_core::plan::{Attention, Optimizer, Precision, TrainConfig};

use super::derived::BATCH_LIMIT;
use super::gpu_target::gpu_ui;
use super::message::Message;
use super::model_picker::{custom_ui, model_ui};
use super::{Command, Derived, PlannerState, emit, tips};

/// The whole left panel.
pub fn inputs_ui(
    state: &PlannerState,
    d: &Derived,
    message: Option<&Message>,
    ui: &mut Ui,
) -> Option<Command> {
    let mut cmd = None;
    ui.heading("Model");
    model_ui(state, d, message, ui, &mut cmd);
    ui.separator();
    ui.heading("Training");
    training_ui(state, d, ui, &mut cmd);
    ui.separator();
    ui.heading("GPU");
    gpu_ui(state, d, ui, &mut cmd);
    super::distributed_panel::distributed_section(state, ui, &mut cmd);
    ui.separator();
    custom_ui(state, d, ui, &mut cmd);
    cmd
}

fn labelled_drag(ui: &mut Ui, text: &str, tip: &str, value: &mut u64, max: u64) -> bool {
    let l = ui.label(text).on_hover_text(tip);
    ui.add(DragValue::new(value).range(1..=max).speed(0.25))
        .labelled_by(l.id)
        .on_hover_text(tip)
        .changed()
}

/// The rows only some models have: an encoder-decoder's target length, a mixture of
/// experts' routing imbalance. Returns whether `cfg` changed.
fn model_kind_rows(
    ui: &mut Ui,
    d: &Derived,
    cfg: &mut TrainConfig,
    seq2seq: bool,
    moe: bool,
) -> bool {
    let mut changed = false;
    if seq2seq {
        let default_target = d
            .preset()
            .ok()
            .and_then(|p| p.target_seq(None))
            .unwrap_or(1);
        let mut t = cfg.target_seq.unwrap_or(default_target);
        let l = ui.label("Target length").on_hover_text(tips::TARGET_SEQ).id;
        let r = ui
            .add(DragValue::new(&mut t).range(1..=1u64 << 20).speed(1.0))
            .labelled_by(l)
            .on_hover_text(tips::TARGET_SEQ);
        if r.changed() {
            cfg.target_seq = Some(t);
            changed = true;
        }
        ui.end_row();
    }
    if moe {
        let l = ui
            .label("MoE imbalance")
            .on_hover_text(tips::MOE_IMBALANCE)
            .id;
        let r = ui
            .add(
                DragValue::new(&mut cfg.moe_imbalance)
                    .range(1.0..=64.0)
                    .speed(0.05)
                    .fixed_decimals(2),
            )
            .labelled_by(l)
            .on_hover_text(tips::MOE_IMBALANCE);
        changed |= r.changed();
        ui.end_row();
    }
    changed
}

fn training_ui(state: &PlannerState, d: &Derived, ui: &mut Ui, cmd: &mut Option<Command>) {
    let mut cfg: TrainConfig = state.config;
    let mut changed = false;
    let is_tokens = d.preset().is_ok_and(|p| p.input.is_tokens());
    let default_size = d.preset().map_or(1, |p| p.default_size());
    let seq2seq = d.preset().is_ok_and(|p| p.is_seq2seq());
    let moe = d.preset().is_ok_and(|p| p.is_moe());
    // Settings of another kind of model do not carry over (they would not validate).
    if !seq2seq && cfg.target_seq.is_some() {
        cfg.target_seq = None;
        changed = true;
    }
    if !moe && cfg.moe_imbalance != 1.0 {
        cfg.moe_imbalance = 1.0;
        changed = true;
    }

    egui::Grid::new("training_grid")
        .num_columns(2)
        .spacing([10.0, 6.0])
        .show(ui, |ui| {
            changed |= labelled_drag(ui, "Batch size", tips::BATCH, &mut cfg.batch, BATCH_LIMIT);
            ui.end_row();
            ui.label("");
            changed |= ui
                .add(
                    egui::Slider::new(&mut cfg.batch, 1..=BATCH_LIMIT)
                        .logarithmic(true)
                        .show_value(false),
                )
                .on_hover_text("Batch size (logarithmic slider)")
                .changed();
            ui.end_row();

            let size_label = if is_tokens {
                "Sequence length"
            } else {
                "Image size (px)"
            };
            let mut size = cfg.size.unwrap_or(default_size);
            let l = ui.label(size_label).on_hover_text(tips::SIZE).id;
            ui.horizontal(|ui| {
                let r = ui
                    .add(DragValue::new(&mut size).range(1..=1u64 << 20).speed(1.0))
                    .labelled_by(l)
                    .on_hover_text(tips::SIZE);
                if r.changed() {
                    cfg.size = Some(size);
                    changed = true;
                }
                if cfg.size.is_some_and(|s| s != default_size)
                    && ui
                        .small_button("default")
                        .on_hover_text(format!("Back to the preset's {default_size}"))
                        .clicked()
                {
                    cfg.size = None;
                    changed = true;
                }
            });
            ui.end_row();

            changed |= model_kind_rows(ui, d, &mut cfg, seq2seq, moe);

            let l = ui.label("Precision").on_hover_text(tips::PRECISION);
            egui::ComboBox::from_id_salt("precision")
                .selected_text(cfg.precision.label())
                .show_ui(ui, |ui| {
                    for p in Precision::ALL {
                        changed |= ui
                            .selectable_value(&mut cfg.precision, p, p.label())
                            .changed();
                    }
                })
                .response
                .labelled_by(l.id)
                .on_hover_text(tips::PRECISION);
            ui.end_row();

            let l = ui.label("Optimizer").on_hover_text(tips::OPTIMIZER);
            egui::ComboBox::from_id_salt("optimizer")
                .selected_text(cfg.optimizer.label())
                .show_ui(ui, |ui| {
                    for o in Optimizer::ALL {
                        changed |= ui
                            .selectable_value(&mut cfg.optimizer, o, o.label())
                            .changed();
                    }
                })
                .response
                .labelled_by(l.id)
                .on_hover_text(tips::OPTIMIZER);
            ui.end_row();

            changed |= labelled_drag(
                ui,
                "Gradient accumulation",
                tips::ACCUMULATION,
                &mut cfg.accum,
                vramlab_core::plan::config::MAX_ACCUM,
            );
            ui.end_row();
            ui.label("");
            ui.label(format!("effective batch {}", cfg.effective_batch()))
                .on_hover_text(tips::ACCUMULATION);
            ui.end_row();
        });

    changed |= ui
        .checkbox(&mut cfg.checkpointing, "Activation checkpointing")
        .on_hover_text(tips::checkpointing())
        .changed();
    if is_tokens {
        ui.horizontal(|ui| {
            ui.label("Attention").on_hover_text(tips::ATTENTION);
            changed |= ui
                .radio_value(&mut cfg.attention, Attention::Sdpa, "SDPA / flash")
                .on_hover_text(tips::ATTENTION)
                .changed();
            changed |= ui
                .radio_value(&mut cfg.attention, Attention::Eager, "eager")
                .on_hover_text(tips::ATTENTION)
                .changed();
        });
    }
    if is_tokens {
        changed |= finetune_ui(&mut cfg.finetune, d, ui);
    }
    ui.horizontal(|ui| {
        ui.label("Training loop").on_hover_text(tips::LOOP);
        for l in LoopShape::ALL {
            changed |= ui
                .radio_value(&mut cfg.loop_shape, l, l.as_str())
                .on_hover_text(tips::LOOP)
                .changed();
        }
    });
    ui.horizontal(|ui| {
        ui.label("Step").on_hover_text(tips::STEP);
        for k in StepKind::ALL {
            changed |= ui
                .radio_value(&mut cfg.step, k, k.as_str())
                .on_hover_text(tips::STEP)
                .changed();
        }
    });
    changed |= ui
        .checkbox(
            &mut cfg.allocator.expandable_segments,
            "expandable_segments",
        )
        .on_hover_text(tips::EXPANDABLE)
        .changed();

    changed |= drop_orphaned_settings(&mut cfg);
    if changed && cfg != state.config {
        emit(cmd, Command::SetConfig(cfg));
    }
}

/// Settings that need another one (loaded from a file, set on the command line) go with
/// it: reentrant checkpointing with checkpointing, merged adapters with an adapter
/// evaluation step (they would not validate). Whether anything was dropped.
fn drop_orphaned_settings(cfg: &mut TrainConfig) -> bool {
    let mut changed = false;
    if !cfg.checkpointing && cfg.checkpoint_reentrant {
        cfg.checkpoint_reentrant = false;
        changed = true;
    }
    if cfg.finetune.lora_merged && (!cfg.step.is_eval() || !cfg.finetune.mode.has_adapters()) {
        cfg.finetune.lora_merged = false;
        changed = true;
    }
    changed
}

/// The LoRA dropout probability (0 ≤ p < 1; 0 is peft's `nn.Identity`).
fn lora_dropout_ui(dropout: &mut LoraDropout, ui: &mut Ui) -> bool {
    let l = ui.label("dropout").on_hover_text(tips::LORA_DROPOUT);
    let mut p = dropout.p();
    let changed = ui
        .add(
            DragValue::new(&mut p)
                .range(0.0..=MAX_DROPOUT)
                .speed(0.01)
                .max_decimals(4),
        )
        .labelled_by(l.id)
        .on_hover_text(tips::LORA_DROPOUT)
        .changed();
    match LoraDropout::new(p) {
        Ok(d) if changed && d != *dropout => {
            *dropout = d;
            true
        }
        _ => false,
    }
}

/// Partial full fine-tuning: "Freeze embeddings" and "Freeze first N blocks" (bounded by the
/// model's block count once known); the planner's error about either is shown under them.
fn freeze_ui(ft: &mut FineTune, d: &Derived, ui: &mut Ui) -> bool {
    let mut changed = false;
    ui.horizontal(|ui| {
        changed |= ui
            .checkbox(&mut ft.freeze_embeddings, "Freeze embeddings")
            .on_hover_text(tips::FREEZE_EMBEDDINGS)
            .changed();
        let l = ui
            .label("Freeze first N blocks")
            .on_hover_text(tips::FREEZE_BLOCKS);
        // A count past this model's (kept from a deeper model) stays, so its error shows.
        let max = d
            .block_count()
            .unwrap_or(MAX_FREEZE_BLOCKS)
            .max(ft.freeze_blocks);
        changed |= ui
            .add(
                DragValue::new(&mut ft.freeze_blocks)
                    .range(0..=max)
                    .speed(0.25),
            )
            .labelled_by(l.id)
            .on_hover_text(tips::FREEZE_BLOCKS)
            .changed();
        if let Some(n) = d.block_count() {
            ui.label(format!("of {n}"))
                .on_hover_text(tips::FREEZE_BLOCKS);
        }
    });
    if let Some(e) = d
        .error()
        .filter(|e| e.contains("freeze_blocks") || e.contains("freeze_embeddings"))
    {
        ui.colored_label(super::style::error_color(ui.visuals().dark_mode), e);
    }
    changed
}

/// The bound of "Freeze first N blocks" before the model's block count is known.
const MAX_FREEZE_BLOCKS: u32 = 1 << 12;

/// The largest LoRA dropout the field offers.
const MAX_DROPOUT: f64 = 0.99;

/// Fine-tuning: full (with its frozen parts) or LoRA / QLoRA, with the LoRA rank, dropout
/// and targets (token models).
fn finetune_ui(ft: &mut FineTune, d: &Derived, ui: &mut Ui) -> bool {
    let mut changed = false;
    ui.horizontal(|ui| {
        ui.label("Fine-tuning").on_hover_text(tips::FINETUNE);
        for m in FineTuneMode::ALL {
            changed |= ui
                .radio_value(&mut ft.mode, m, m.as_str())
                .on_hover_text(tips::FINETUNE)
                .changed();
        }
    });
    if ft.mode.has_adapters() && (ft.freeze_embeddings || ft.freeze_blocks > 0) {
        // Adapters freeze the whole base: a partial freeze does not carry over (it would not
        // validate).
        ft.freeze_embeddings = false;
        ft.freeze_blocks = 0;
        changed = true;
    }
    if ft.is_full() {
        changed |= freeze_ui(ft, d, ui);
    }
    if ft.mode == FineTuneMode::Qlora {
        ui.horizontal(|ui| {
            ui.label("quant")
                .on_hover_text("bitsandbytes base storage: NF4 / FP4 4-bit or LLM.int8");
            for q in vramlab_core::plan::finetune::Quant::ALL {
                changed |= ui.radio_value(&mut ft.quant, q, q.as_str()).changed();
            }
            if ft.quant.is_4bit() {
                changed |= ui
                    .checkbox(&mut ft.double_quant, "double quant")
                    .on_hover_text("bnb_4bit_use_double_quant: block scales stored in 8 bits")
                    .changed();
            }
        });
    }
    if ft.mode.has_adapters() {
        ui.horizontal(|ui| {
            ui.label("rank").on_hover_text(tips::LORA_RANK);
            changed |= ui
                .add(DragValue::new(&mut ft.lora_rank).range(1..=MAX_LORA_RANK))
                .on_hover_text(tips::LORA_RANK)
                .changed();
            changed |= lora_dropout_ui(&mut ft.lora_dropout, ui);
        });
        ui.horizontal(|ui| {
            ui.label("targets").on_hover_text(tips::LORA_TARGETS);
            for t in [LoraTargets::Attn, LoraTargets::AllLinear] {
                changed |= ui
                    .radio_value(&mut ft.lora_targets, t, t.to_string())
                    .on_hover_text(tips::LORA_TARGETS)
                    .changed();
            }
        });
    }
    changed
}
