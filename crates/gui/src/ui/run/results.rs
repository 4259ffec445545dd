//! The Run tab's central panel: the shown run's summary, the two measured-vs-predicted
//! plots and the results table.

use egui::{RichText, Ui};

use crate::ui::png::{self, PlotId};
use crate::ui::style::error_color;

use super::{RunCommand, RunSession, plots, table};

fn heading_with_png(ui: &mut Ui, title: &str, tip: &str, id: PlotId, cmd: &mut Option<RunCommand>) {
    ui.horizontal(|ui| {
        ui.label(RichText::new(title).heading()).on_hover_text(tip);
        if png::save_button(ui) {
            *cmd = Some(RunCommand::SavePlot(id));
        }
    });
}

/// Summary, plots and table of the shown run.
pub fn results_ui(session: &RunSession, ui: &mut Ui) -> Option<RunCommand> {
    let mut cmd = None;
    let Some(shown) = session.shown() else {
        ui.add_space(40.0);
        ui.vertical_centered(|ui| {
            ui.label(RichText::new("No run to show yet").size(22.0).strong());
            ui.label(
                "Start a run on the left, or open a saved run: the measured peaks appear here beside the planner's prediction.",
            );
        });
        return None;
    };
    let run = &shown.run;
    let dark = ui.visuals().dark_mode;
    egui::Frame::group(ui.style())
        .inner_margin(10.0)
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.label(RichText::new(shown.label()).size(18.0).strong());
            ui.horizontal_wrapped(|ui| {
            let big = |ui: &mut Ui, label: &str, value: String, tip: &str| {
                ui.label(label).on_hover_text(tip);
                ui.label(RichText::new(value).size(20.0).strong());
                ui.add_space(16.0);
            };
            big(
                ui,
                "Largest batch that ran",
                run.max_batch_ran().map_or("none".into(), |b| b.to_string()),
                "The largest micro-batch whose trial ran without running out of memory",
            );
            big(
                ui,
                "First OOM",
                run.first_oom().map_or("none".into(), |b| b.to_string()),
                "The smallest micro-batch that ran out of memory",
            );
            big(
                ui,
                "Predicted max batch",
                run.predicted_max_batch.map_or("–".into(), |b| b.to_string()),
                "What the planner predicted for the GPU it planned against when the run started",
            );
        });
            let device = if run.device.name.is_empty() {
                "device: waiting for the engine".to_string()
            } else {
                format!("{} ({})", run.device.name, run.device.total_bytes)
            };
            let mut facts = vec![
                device,
                format!("engine {}", run.engine.as_str()),
                match &run.inference {
                    Some(i) => i.describe(),
                    None => format!("size {}", run.size),
                },
                format!("{} trials", run.trials.len()),
            ];
            if let Some(d) = &run.device.driver {
                facts.push(format!("driver {d}"));
            }
            for (k, v) in &run.device.versions {
                facts.push(format!("{k} {v}"));
            }
            ui.label(RichText::new(facts.join(" · ")).weak());
            super::ranks::world_ui(run, shown.shown_trial(), ui);
            if let Some(s) = run.stopped.as_deref().filter(|s| *s != "cancelled") {
                ui.colored_label(error_color(dark), format!("Stopped early: {s}"));
            }
        });
    ui.add_space(4.0);

    let overlays: Vec<_> = session
        .runs
        .iter()
        .filter(|r| r.overlay && r.id != shown.id)
        .collect();
    let live = session.live.as_ref().filter(|l| l.run_id == shown.id);
    // Leave room for the table: two header rows and one row per trial.
    let table_h = 90.0 + 25.0 * run.trials.len() as f32;
    let plot_h = (ui.available_height() - table_h - 60.0).clamp(220.0, 460.0);
    let ctx = ui.ctx().clone();
    ui.columns(2, |cols| {
        let (l, r) = cols.split_at_mut(1);
        let l = &mut l[0];
        heading_with_png(
            l,
            "Peak memory vs batch size",
            "Lines: the planner's prediction over the batch range. Points: what each trial measured. Red crosses: batches that ran out of memory.",
            PlotId::RunBatch,
            &mut cmd,
        );
        let rect = plots::batch_plot_ui(shown, &overlays, l, plot_h);
        png::remember_rect(&ctx, PlotId::RunBatch, rect);

        let r = &mut r[0];
        heading_with_png(
            r,
            "Memory through one trial",
            "Device memory beyond the baseline while the trial's step ran, with the planner's allocated / reserved at the same points where known.",
            PlotId::RunTimeline,
            &mut cmd,
        );
        let running = live.filter(|l| !l.samples.is_empty() && shown.selected_trial.is_none());
        let (samples, what) = match (running, shown.shown_trial()) {
            (Some(l), _) => {
                let b = l.progress.as_ref().map_or(0, |p| p.1);
                (l.samples.as_slice(), format!("running trial (batch {b})"))
            }
            (None, Some(t)) => (
                t.timeline.as_slice(),
                format!("trial {} (batch {}, {})", t.index + 1, t.batch, t.outcome.label()),
            ),
            (None, None) => (&[][..], "no trial yet".to_string()),
        };
        let selected_idx = shown
            .shown_trial()
            .and_then(|t| run.trials.iter().position(|x| x.index == t.index));
        r.horizontal(|ui| {
            let l = ui.label("Trial");
            egui::ComboBox::from_id_salt("run_trial_pick")
                .selected_text(what.clone())
                .width(260.0)
                .show_ui(ui, |ui| {
                    for (i, t) in run.trials.iter().enumerate() {
                        let text = format!("trial {} · batch {} · {}", t.index + 1, t.batch, t.outcome.label());
                        if ui.selectable_label(selected_idx == Some(i), text).clicked() {
                            cmd = Some(RunCommand::SelectTrial(i));
                        }
                    }
                })
                .response
                .labelled_by(l.id);
        });
        let rect = plots::timeline_plot_ui(samples, &what, r, plot_h - 28.0);
        png::remember_rect(&ctx, PlotId::RunTimeline, rect);
    });
    ui.add_space(6.0);
    ui.label(RichText::new("Trials").heading()).on_hover_text(
        "Measured peaks next to the prediction; error = (predicted − measured) / measured. Click a batch to show its timeline.",
    );
    let selected = shown.shown_trial().map(|t| t.index);
    if let Some(c) = table::results_table_ui(&run.trials, run.engine, selected, ui) {
        cmd = Some(c);
    }
    cmd
}
