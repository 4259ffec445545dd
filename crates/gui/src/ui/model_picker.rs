//! Model picker (family, search, preset list, save/open) and the custom-model section.

use egui::{RichText, Ui};

use vramlab_core::model::preset::FAMILIES;

use super::custom::{custom_model_ui, nullable_params};
use super::message::Message;
use super::style::{self, error_color};
use super::{Command, Derived, PlannerState, emit, tips};

pub(crate) fn model_ui(
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
    search_ui(state, ui, cmd);

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
    ui.horizontal_wrapped(|ui| {
        if ui
            .button("Open config.json…")
            .on_hover_text("Import a Hugging Face model's config.json (the model page's \"Files\" tab, or the folder a downloaded model is in) as a custom model. You can also drop it on the window or paste its text.")
            .clicked()
        {
            emit(cmd, Command::OpenHfConfig);
        }
        if ui
            .button("Open preset…")
            .on_hover_text("Load a vramlab preset JSON file (or a Hugging Face config.json) as a custom model.")
            .clicked()
        {
            emit(cmd, Command::OpenPreset);
        }
        if ui
            .button("Save preset…")
            .on_hover_text("Write the current model as a preset JSON file (usable with `vramlab plan --model FILE`).")
            .clicked()
        {
            emit(cmd, Command::SavePreset);
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

/// The search field, and under it a button when the text is a Hub id or a model folder.
fn search_ui(state: &PlannerState, ui: &mut Ui, cmd: &mut Option<Command>) {
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
    // A Hub id or a model folder typed in the search field loads as `--model` does.
    if let Some(label) = button_label(&state.search)
        && ui.button(label).on_hover_text(tips::HUB_MODEL).clicked()
    {
        emit(
            cmd,
            Command::LoadModelSource(state.search.trim().to_string()),
        );
    }
}

pub(crate) fn custom_ui(state: &PlannerState, d: &Derived, ui: &mut Ui, cmd: &mut Option<Command>) {
    // Borrowed, not cloned: this runs every frame, and a captured graph's document is megabytes.
    let doc = match (&state.custom, d.base_preset(state)) {
        (Some(doc), _) => Some(std::borrow::Cow::Borrowed(doc.value())),
        (None, Some(p)) => serde_json::to_value(p).ok().map(std::borrow::Cow::Owned),
        (None, None) => None,
    };
    // A captured graph has no builder parameters (its `params` are counts it recorded):
    // changing the model means capturing it again.
    if let Some(doc) = doc.filter(|d| !vramlab_core::model::captured::is_graph_value(d)) {
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

/// The model picker's button for `typed`, when it is a Hub id or a folder and no built-in
/// preset goes by that name (`ViT-B/16` stays the preset, as on the command line).
fn button_label(typed: &str) -> Option<String> {
    let typed = typed.trim();
    // The cheap test first: the preset names are parsed only for a Hub-shaped text.
    if typed.is_empty()
        || !vramlab_hub::source::is_source(typed)
        || vramlab_words::vocabulary::model_id(typed).is_ok()
    {
        return None;
    }
    Some(if std::path::Path::new(typed).is_dir() {
        format!("Open model folder {typed}")
    } else {
        format!("Load {typed} from the Hugging Face Hub")
    })
}
