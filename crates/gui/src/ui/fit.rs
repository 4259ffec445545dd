//! "Make it fit": the combinations of remedies that fit the GPU, ranked by predicted time
//! per sample, each with what it changes, what it costs and an Apply button.

use egui::{RichText, Ui};

use vramlab_core::plan::fit::FitCandidate;

use super::fit_search::FitSearch;
use super::style::{error_color, param_count, verdict_color};
use super::{Command, emit};

/// The section's body. `fits`: whether the current plan fits (then the search runs only
/// when asked for).
pub fn fit_ui(
    search: &FitSearch,
    searching_wanted: bool,
    fits: bool,
    ui: &mut Ui,
) -> Option<Command> {
    let mut cmd = None;
    let dark = ui.visuals().dark_mode;
    if fits && !searching_wanted {
        ui.weak("The plan fits. Search combinations that run faster per sample or save memory:");
        if ui.button("Search combinations").clicked() {
            emit(&mut cmd, Command::SearchFit);
        }
        return cmd;
    }
    let Some(result) = search.result() else {
        ui.horizontal(|ui| {
            ui.spinner();
            ui.weak("Searching combinations of remedies…");
        });
        return None;
    };
    let (report, ms) = match result {
        Ok(r) => r,
        Err(e) => {
            ui.colored_label(error_color(dark), e.as_str());
            return None;
        }
    };
    ui.weak(format!(
        "{} combinations: {} planned, {} ruled out (micro-batch 1 cannot fit), {} dominated. \
         Effective batch {} kept. Times from the {}.",
        report.combinations,
        report.planned,
        report.pruned_dead,
        report.dominated,
        report.effective_batch,
        report.speed_source
    ))
    .on_hover_text(format!("searched in {ms:.0} ms"));
    if let Some(reason) = &report.reason {
        ui.colored_label(error_color(dark), gui_text(reason));
        return None;
    }
    for (i, c) in report.candidates.iter().enumerate() {
        if let Some(c) = candidate_ui(i + 1, c, ui) {
            cmd = Some(c);
        }
    }
    cmd
}

/// `text` with the arrows egui's default fonts lack written as `->`.
pub fn gui_text(text: &str) -> String {
    text.replace('→', "->")
}

/// A candidate's changes as the section shows them.
pub fn changes_text(c: &FitCandidate) -> String {
    if c.changes.is_empty() {
        "your configuration as it is".to_string()
    } else {
        gui_text(&c.changes.join(" · "))
    }
}

fn candidate_ui(n: usize, c: &FitCandidate, ui: &mut Ui) -> Option<Command> {
    let mut cmd = None;
    let dark = ui.visuals().dark_mode;
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_width(ui.available_width());
        ui.horizontal(|ui| {
            let label = format!("Apply #{n}");
            if ui
                .button(label)
                .on_hover_text(
                    "Make this the configuration (micro-batch and accumulation included)",
                )
                .clicked()
            {
                emit(&mut cmd, Command::ApplyFit(c.config));
            }
            ui.label(
                RichText::new(format!("{:.1} ms/sample", c.time.ms_per_sample))
                    .strong()
                    .color(verdict_color(true, dark)),
            );
            ui.label(format!(
                "micro-batch {} × {} · {} nvidia-smi ({} allocated) · trains {}",
                c.micro_batch,
                c.accum,
                c.nvidia_smi,
                c.peak_allocated,
                param_count(c.trainable_params)
            ));
        });
        ui.add(egui::Label::new(RichText::new(changes_text(c)).strong()).wrap());
        if !c.costs.is_empty() {
            let costs = gui_text(&format!("cost: {}", c.costs.join(" · ")));
            ui.add(egui::Label::new(RichText::new(costs).weak().small()).wrap());
        }
    });
    cmd
}
