//! What-if remedies: each one planned for real, with an Apply button. Changes that add
//! memory (the core's `Remedy::adds_memory`, listed last) are shown as costs, without a
//! fit mark.

use egui::{RichText, Ui};

use vramlab_core::plan::PlanError;
use vramlab_core::plan::remedies::Remedy;
use vramlab_core::units::Bytes;

use super::derived::RemediesOf;
use super::style::{error_color, fit_icon, saving_text};
use super::{Command, emit};

/// The remedies table; `of`: which batch they were planned at (they are planned on a worker
/// while the batch changes); `current_allocated` is the current plan's peak allocated bytes.
pub fn remedies_ui(
    remedies: &Result<Vec<Remedy>, PlanError>,
    of: RemediesOf,
    current_allocated: Bytes,
    ui: &mut Ui,
) -> Option<Command> {
    let mut cmd = None;
    let dark = ui.visuals().dark_mode;
    match of {
        RemediesOf::Current => {}
        RemediesOf::Batch(b) => {
            ui.weak(format!(
                "Planning the remedies at this batch… (shown: those at batch {b})"
            ));
        }
        RemediesOf::Pending => {
            ui.weak("Planning the remedies…");
            return None;
        }
        RemediesOf::Failed => {
            ui.colored_label(
                error_color(dark),
                "The remedies could not be planned at this batch (an internal error, printed in \
                 the terminal; please report it). Change the batch or a setting to try again.",
            );
            return None;
        }
    }
    let list = match remedies {
        Ok(l) => l,
        Err(e) => {
            ui.colored_label(error_color(dark), format!("{e:#}"));
            return None;
        }
    };
    if list.is_empty() {
        ui.weak("No remedy applies: this configuration already uses all of them.");
        return None;
    }
    if list.iter().any(|r| r.note.is_some()) {
        ui.weak(
            "Savings of allocated memory can stay off nvidia-smi: PyTorch's caching allocator \
             keeps freed blocks reserved (hover a row).",
        );
    }
    egui::Grid::new("remedies_table")
        .num_columns(6)
        .striped(true)
        .spacing([14.0, 4.0])
        .show(ui, |ui| {
            ui.label(RichText::new("Remedy").strong());
            ui.label(RichText::new("nvidia-smi").strong());
            ui.label(RichText::new("Saving").strong())
                .on_hover_text("nvidia-smi saving");
            ui.label(RichText::new("Allocated").strong())
                .on_hover_text("saving of peak allocated memory (the tensors themselves)");
            ui.label(RichText::new("Fits").strong());
            ui.label("");
            ui.end_row();
            let mut costs_header = false;
            for r in list {
                if r.adds_memory && !costs_header {
                    costs_header = true;
                    ui.label(RichText::new("Adds memory here (costs, not remedies)").weak())
                        .on_hover_text(
                            "These changes make the nvidia-smi figure grow on this plan; \
                             apply them for speed or accuracy, not to fit.",
                        );
                    ui.end_row();
                }
                ui.label(r.name).on_hover_text(r.description.as_str());
                ui.label(r.nvidia_smi.to_string()).on_hover_text(format!(
                    "peak allocated {} (now {current_allocated}); the verdict uses nvidia-smi, which also counts cached segments",
                    r.peak_allocated
                ));
                let saving = ui.label(saving_text(r.saving));
                if let Some(n) = &r.note {
                    saving.on_hover_text(n.as_str());
                }
                ui.label(saving_text(r.allocated_saving));
                if r.adds_memory {
                    ui.label(RichText::new("cost").color(error_color(dark)))
                        .on_hover_text(r.verdict());
                } else {
                    ui.horizontal(|ui| {
                        fit_icon(ui, r.fits, 16.0);
                        if let Some(b) = r.fits_up_to {
                            ui.label(format!("up to {b}"))
                                .on_hover_text(format!("fits at micro-batch {b} or less"));
                        }
                    })
                    .response
                    .on_hover_text(r.verdict());
                }
                let apply_tip = match r.fits_up_to {
                    Some(b) => format!("{} Applied at micro-batch {b}, the largest it allows.", r.description),
                    None => r.description.clone(),
                };
                // A remedy of an earlier batch would apply that batch's configuration.
                let current = of == RemediesOf::Current;
                let apply = ui
                    .add_enabled(current, egui::Button::new("Apply"))
                    .on_hover_text(apply_tip)
                    .on_disabled_hover_text("Planning the remedies at this batch…");
                if apply.clicked() {
                    emit(&mut cmd, Command::ApplyRemedy(r.config_to_apply()));
                }
                ui.end_row();
            }
        });
    cmd
}
