//! The left panel: model, training configuration and target GPU.

use egui::{DragValue, RichText, Ui};

use crate::model::preset::FAMILIES;
use crate::plan::{Attention, Optimizer, Precision, TrainConfig};

use super::custom::{custom_model_ui, nullable_params};
use super::derived::{BATCH_LIMIT, TargetKind};
use super::style::{self, error_color};
use super::{Command, Derived, GpuChoice, PlannerState, emit, tips};

/// A status line shown under the preset buttons (save/open results).
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub text: String,
    pub is_error: bool,
}

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
    ui.separator();
    custom_ui(state, d, ui, &mut cmd);
    cmd
}

fn model_ui(
    state: &PlannerState,
    d: &Derived,
    message: Option<&Message>,
    ui: &mut Ui,
    cmd: &mut Option<Command>,
) {
    if let Some(e) = &d.presets_error {
        ui.colored_label(error_color(ui.visuals().dark_mode), e);
    }
    ui.horizontal(|ui| {
        let l = ui.label("Family");
        let current = state.family_filter.as_deref().unwrap_or("all families");
        egui::ComboBox::from_id_salt("family_filter")
            .selected_text(current)
            .show_ui(ui, |ui| {
                if ui
                    .selectable_label(state.family_filter.is_none(), "all families")
                    .clicked()
                {
                    emit(cmd, Command::SetFamilyFilter(None));
                }
                for f in FAMILIES {
                    if ui
                        .selectable_label(state.family_filter.as_deref() == Some(f), *f)
                        .clicked()
                    {
                        emit(cmd, Command::SetFamilyFilter(Some((*f).to_string())));
                    }
                }
            })
            .response
            .labelled_by(l.id);
    });
    ui.horizontal(|ui| {
        let l = ui.label("Search");
        let mut search = state.search.clone();
        let r = ui
            .add(
                egui::TextEdit::singleline(&mut search)
                    .hint_text("filter presets by name")
                    .desired_width(f32::INFINITY),
            )
            .labelled_by(l.id);
        if r.changed() {
            emit(cmd, Command::SetSearch(search));
        }
    });

    let needle = state.search.to_lowercase();
    let shown: Vec<_> = d
        .presets
        .iter()
        .filter(|p| {
            state
                .family_filter
                .as_deref()
                .is_none_or(|f| p.spec.family() == f)
        })
        .filter(|p| {
            needle.is_empty()
                || p.id.to_lowercase().contains(&needle)
                || p.display_name.to_lowercase().contains(&needle)
        })
        .collect();
    egui::Frame::group(ui.style()).show(ui, |ui| {
        egui::ScrollArea::vertical()
            // A new filter starts the list at its top.
            .id_salt((
                "preset_list",
                state.search.as_str(),
                state.family_filter.as_deref(),
            ))
            .max_height(132.0)
            .auto_shrink([false, true])
            .show(ui, |ui| {
                if shown.is_empty() {
                    ui.weak("no preset matches");
                }
                for p in shown {
                    let selected = state.custom.is_none() && state.preset_id == p.id;
                    let r = ui
                        .selectable_label(selected, p.display_name.as_str())
                        .on_hover_text(format!("{} — {}", p.id, p.reference));
                    if r.clicked() && !selected {
                        emit(cmd, Command::SelectPreset(p.id.clone()));
                    }
                    if selected {
                        scroll_once_to(ui, &r, &p.id);
                    }
                }
            });
    });

    match d.preset() {
        Ok(p) => {
            let params = d
                .planner()
                .map(|pl| {
                    format!(
                        " · {} parameters",
                        style::param_count(pl.graph.param_count())
                    )
                })
                .unwrap_or_default();
            ui.label(RichText::new(format!("{}{params}", p.display_name)).strong())
                .on_hover_text(p.reference.as_str());
        }
        Err(_) => {
            ui.colored_label(
                error_color(ui.visuals().dark_mode),
                "Custom model is invalid",
            );
        }
    }
    ui.horizontal(|ui| {
        if ui
            .button("Save preset…")
            .on_hover_text("Write the current model as a preset JSON file (usable with `vramlab plan --model FILE`).")
            .clicked()
        {
            emit(cmd, Command::SavePreset);
        }
        if ui
            .button("Open preset…")
            .on_hover_text("Load a preset JSON file as a custom model.")
            .clicked()
        {
            emit(cmd, Command::OpenPreset);
        }
        if state.custom.is_some() && ui.button("Reset").on_hover_text("Back to the built-in preset").clicked() {
            emit(cmd, Command::ResetCustom);
        }
    });
    if let Some(m) = message {
        ui.horizontal_wrapped(|ui| {
            let color = if m.is_error {
                error_color(ui.visuals().dark_mode)
            } else {
                ui.visuals().text_color()
            };
            ui.colored_label(color, m.text.as_str());
            if ui.small_button("dismiss").clicked() {
                emit(cmd, Command::DismissMessage);
            }
        });
    }
}

fn custom_ui(state: &PlannerState, d: &Derived, ui: &mut Ui, cmd: &mut Option<Command>) {
    let doc = match (&state.custom, d.base_preset(state)) {
        (Some(doc), _) => Some(doc.clone()),
        (None, Some(p)) => serde_json::to_value(p).ok(),
        (None, None) => None,
    };
    if let Some(doc) = doc {
        egui::CollapsingHeader::new("Custom model (builder parameters)")
            .id_salt("custom_model")
            .default_open(true)
            .show(ui, |ui| {
                ui.label(RichText::new(tips::CUSTOM).small().weak());
                let nullable = d
                    .base_preset(state)
                    .and_then(|p| serde_json::to_value(p).ok())
                    .map(|v| nullable_params(&v))
                    .unwrap_or_default();
                if let Some(new_doc) = custom_model_ui(ui, &doc, &nullable) {
                    emit(cmd, Command::SetCustom(new_doc));
                }
                if let Err(e) = d.preset() {
                    ui.colored_label(error_color(ui.visuals().dark_mode), e);
                }
            });
    }
}

/// Scrolls the preset list until the selected preset is visible, once per selection
/// (e.g. after a restart with a persisted preset far down the list).
fn scroll_once_to(ui: &Ui, r: &egui::Response, id: &str) {
    let key = egui::Id::unique("preset_list_scrolled_to");
    let done = ui
        .data(|d| d.get_temp::<String>(key))
        .is_some_and(|s| s == id);
    if done {
        return;
    }
    if ui.clip_rect().contains_rect(r.rect) {
        ui.data_mut(|d| d.insert_temp(key, id.to_string()));
    } else {
        r.scroll_to_me_animation(
            Some(egui::Align::Center),
            egui::style::ScrollAnimation::none(),
        );
        ui.ctx().request_repaint();
    }
}

fn labelled_drag(ui: &mut Ui, text: &str, tip: &str, value: &mut u64, max: u64) -> bool {
    let l = ui.label(text).on_hover_text(tip);
    ui.add(DragValue::new(value).range(1..=max).speed(0.25))
        .labelled_by(l.id)
        .on_hover_text(tip)
        .changed()
}

fn training_ui(state: &PlannerState, d: &Derived, ui: &mut Ui, cmd: &mut Option<Command>) {
    let mut cfg: TrainConfig = state.config;
    let mut changed = false;
    let is_tokens = d.preset().is_ok_and(|p| p.input.is_tokens());
    let default_size = d.preset().map_or(1, |p| p.default_size());

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
                crate::plan::config::MAX_ACCUM,
            );
            ui.end_row();
            ui.label("");
            ui.label(format!("effective batch {}", cfg.effective_batch()))
                .on_hover_text(tips::ACCUMULATION);
            ui.end_row();
        });

    changed |= ui
        .checkbox(&mut cfg.checkpointing, "Activation checkpointing")
        .on_hover_text(tips::CHECKPOINTING)
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
    changed |= ui
        .checkbox(
            &mut cfg.allocator.expandable_segments,
            "expandable_segments",
        )
        .on_hover_text(tips::EXPANDABLE)
        .changed();

    if changed && cfg != state.config {
        emit(cmd, Command::SetConfig(cfg));
    }
}

fn gpu_ui(state: &PlannerState, d: &Derived, ui: &mut Ui, cmd: &mut Option<Command>) {
    let target = d.target();
    let detected_text = d
        .detected
        .as_ref()
        .map(|g| format!("Detected: {} ({})", g.name, g.total));
    let selected_text = match target.kind {
        TargetKind::Detected => detected_text.clone().unwrap_or_default(),
        TargetKind::Catalog | TargetKind::Fallback => {
            format!("{} ({})", target.gpu.name, target.gpu.memory())
        }
    };
    ui.horizontal(|ui| {
        let l = ui.label("Target GPU");
        egui::ComboBox::from_id_salt("target_gpu")
            .selected_text(selected_text)
            .width(220.0)
            .show_ui(ui, |ui| {
                if let Some(t) = &detected_text
                    && ui
                        .selectable_label(target.kind == TargetKind::Detected, t.as_str())
                        .clicked()
                {
                    emit(cmd, Command::SetGpu(GpuChoice::Detected));
                }
                for g in &d.catalog {
                    let on = target.kind != TargetKind::Detected && target.gpu.id == g.id;
                    if ui
                        .selectable_label(on, format!("{} ({})", g.name, g.memory()))
                        .clicked()
                    {
                        emit(cmd, Command::SetGpu(GpuChoice::Catalog(g.id.clone())));
                    }
                }
            })
            .response
            .labelled_by(l.id);
    });

    match &d.detected {
        Some(g) => {
            ui.label(format!(
                "NVML: {} — {} free of {} ({} in use)",
                g.name,
                g.free,
                g.total,
                g.used()
            ));
            if target.kind == TargetKind::Detected {
                let mut free = state.use_free_memory;
                if ui
                    .checkbox(&mut free, "Plan against free memory only")
                    .on_hover_text(tips::FREE_MEMORY)
                    .changed()
                {
                    emit(cmd, Command::SetUseFreeMemory(free));
                }
            }
        }
        None => {
            ui.label(
                RichText::new(format!(
                    "No NVIDIA GPU detected — planning against {}",
                    target.gpu.name
                ))
                .color(ui.visuals().warn_fg_color),
            );
        }
    }
    ui.horizontal(|ui| {
        let l = ui.label("Safety margin").on_hover_text(tips::MARGIN);
        let mut m = state.margin_pct;
        if ui
            .add(
                DragValue::new(&mut m)
                    .range(0.0..=50.0)
                    .speed(0.25)
                    .suffix(" %"),
            )
            .labelled_by(l.id)
            .on_hover_text(tips::MARGIN)
            .changed()
        {
            emit(cmd, Command::SetMarginPct(m));
        }
        if ui
            .small_button("Re-detect")
            .on_hover_text("Query NVML again for GPUs and free memory")
            .clicked()
        {
            emit(cmd, Command::RefreshGpu);
        }
    });
    ui.label(format!(
        "Usable: {} of {}",
        target.budget.usable(),
        target.budget.capacity
    ))
    .on_hover_text(tips::MARGIN);
}
