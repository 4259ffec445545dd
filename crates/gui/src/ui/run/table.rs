//! The results table: one row per trial, measured next to predicted, the prediction
//! error, step time, throughput and whether the memory came back.

use egui::{Color32, RichText, Ui};

use crate::ui::style::error_color;
use vramlab_core::export::results::RETURN_TOLERANCE;
use vramlab_core::record::{Outcome, Trial};
use vramlab_core::units::Bytes;

use super::RunCommand;

/// "−3.2 %" with the sign; colour by size (within 5 % green, 15 % amber, else red).
pub fn error_text(e: Option<f64>, dark: bool) -> RichText {
    let Some(e) = e.filter(|e| e.is_finite()) else {
        return RichText::new("–");
    };
    let color = if e.abs() <= 5.0 {
        crate::ui::style::verdict_color(true, dark)
    } else if e.abs() <= 15.0 {
        Color32::from_rgb(230, 170, 40)
    } else {
        error_color(dark)
    };
    RichText::new(format!("{e:+.1} %")).color(color)
}

fn bytes(b: Option<Bytes>) -> String {
    b.map_or_else(|| "–".to_string(), |b| b.to_string())
}

fn outcome_text(t: &Trial, dark: bool) -> RichText {
    let r = RichText::new(t.outcome.label());
    match t.outcome {
        Outcome::Ran => r,
        Outcome::Oom { .. } | Outcome::Error { .. } => r.color(error_color(dark)).strong(),
        Outcome::Cancelled => r.italics(),
    }
}

/// The table; clicking a batch shows its timeline.
pub fn results_table_ui(
    trials: &[Trial],
    selected: Option<u32>,
    ui: &mut Ui,
) -> Option<RunCommand> {
    let mut cmd = None;
    let dark = ui.visuals().dark_mode;
    egui::ScrollArea::horizontal()
        .id_salt("run_table_scroll")
        .show(ui, |ui| {
            egui::Grid::new("run_results_table")
                .striped(true)
                .num_columns(14)
                .spacing([9.0, 4.0])
                .show(ui, |ui| {
                    let groups = [
                        "", "", "measured", "", "", "predicted", "", "", "error %", "", "", "", "", "",
                    ];
                    for g in groups {
                        ui.label(RichText::new(g).small().weak());
                    }
                    ui.end_row();
                    let heads = [
                        "Batch", "Outcome", "allocated", "reserved", "nvidia-smi", "allocated", "reserved",
                        "nvidia-smi", "allocated", "reserved", "nvidia-smi", "Step", "TFLOP/s", "Memory back",
                    ];
                    for h in heads {
                        ui.label(RichText::new(h).strong());
                    }
                    ui.end_row();
                    for (i, t) in trials.iter().enumerate() {
                        let is_sel = selected == Some(t.index);
                        if ui
                            .selectable_label(is_sel, format!("{}", t.batch))
                            .on_hover_text("Show this trial's memory timeline")
                            .clicked()
                        {
                            cmd = Some(RunCommand::SelectTrial(i));
                        }
                        let o = ui.label(outcome_text(t, dark));
                        if let Outcome::Oom { message } | Outcome::Error { message } = &t.outcome {
                            o.on_hover_text(message.as_str());
                        }
                        ui.label(bytes(t.peak_allocated));
                        ui.label(bytes(t.peak_reserved));
                        ui.label(bytes(t.process_bytes));
                        let p = t.predicted;
                        ui.label(bytes(p.map(|p| p.allocated)));
                        ui.label(bytes(p.map(|p| p.reserved)));
                        ui.label(bytes(p.map(|p| p.nvidia_smi)));
                        let e = t.errors_pct();
                        ui.label(error_text(e.allocated, dark));
                        ui.label(error_text(e.reserved, dark));
                        ui.label(error_text(e.nvidia_smi, dark));
                        ui.label(t.step_ms.map_or_else(|| "–".into(), |ms| format!("{ms:.1} ms")));
                        ui.label(t.tflops.map_or_else(|| "–".into(), |f| format!("{f:.1}")));
                        let back = match t.memory_returned(RETURN_TOLERANCE) {
                            Some(true) => RichText::new("yes"),
                            Some(false) => RichText::new("no (leak?)").color(error_color(dark)),
                            None => RichText::new("–"),
                        };
                        ui.label(back).on_hover_text(
                            "Device memory after the trial was released, within 8 MiB of the baseline before it",
                        );
                        ui.end_row();
                    }
                });
        });
    cmd
}
