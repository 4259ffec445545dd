//! The results table: one row per trial, measured next to predicted, the prediction
//! error, step time, throughput and whether the memory came back.

use egui::{Color32, RichText, Ui};

use crate::ui::style::error_color;
use vramlab_core::export::results::RETURN_TOLERANCE;
use vramlab_core::record::{EngineKind, Outcome, Trial};
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

/// What the native engine checks, shown above its table.
pub const NATIVE_CAPTION: &str = "Native engine: the planned allocations are replayed with real \
     buffers (cudarc + cuBLAS), so its allocated and reserved bytes are the plan itself, not a \
     measurement of PyTorch. It checks whether the planned memory fits this GPU, the device \
     memory used against the predicted nvidia-smi, step time and TFLOP/s. The PyTorch engine \
     measures PyTorch's allocated and reserved bytes.";

/// Device memory a native trial used: the process's NVML memory, else the device's used
/// memory above its baseline.
pub fn device_used(t: &Trial) -> Option<Bytes> {
    t.process_bytes.or(t.device_used_peak)
}

/// (measured − predicted) / predicted of the device memory against the predicted
/// nvidia-smi figure, in percent.
pub fn device_vs_predicted_pct(t: &Trial) -> Option<f64> {
    let used = device_used(t)?;
    let p = t.predicted?.nvidia_smi;
    (p.0 > 0).then(|| 100.0 * (used.0 as f64 - p.0 as f64) / p.0 as f64)
}

/// The table; clicking a batch shows its timeline. The native engine's table shows what it
/// checks ([`NATIVE_CAPTION`]); the PyTorch engine's compares measured with predicted.
pub fn results_table_ui(
    trials: &[Trial],
    engine: EngineKind,
    selected: Option<u32>,
    ui: &mut Ui,
) -> Option<RunCommand> {
    if engine == EngineKind::Native {
        return native_table_ui(trials, selected, ui);
    }
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

fn memory_back(t: &Trial, dark: bool) -> RichText {
    match t.memory_returned(RETURN_TOLERANCE) {
        Some(true) => RichText::new("yes"),
        Some(false) => RichText::new("no (leak?)").color(error_color(dark)),
        None => RichText::new("–"),
    }
}

fn native_table_ui(trials: &[Trial], selected: Option<u32>, ui: &mut Ui) -> Option<RunCommand> {
    let mut cmd = None;
    let dark = ui.visuals().dark_mode;
    ui.label(RichText::new(NATIVE_CAPTION).small().weak());
    egui::ScrollArea::horizontal()
        .id_salt("run_table_scroll")
        .show(ui, |ui| {
            egui::Grid::new("run_results_table")
                .striped(true)
                .num_columns(8)
                .spacing([12.0, 4.0])
                .show(ui, |ui| {
                    let heads = [
                        ("Batch", "Micro-batch of the trial"),
                        ("Planned memory", "Whether the planned allocations fit on this GPU"),
                        ("Device used", "NVML memory of the process (or device used above the baseline)"),
                        ("Predicted nvidia-smi", "What the planner predicts nvidia-smi shows for PyTorch"),
                        ("Used vs predicted", "(device used − predicted) / predicted; the native CUDA context is smaller than PyTorch's"),
                        ("Step", "Median step time"),
                        ("TFLOP/s", "Throughput of the step's GEMMs"),
                        ("Memory back", "Device memory after the trial was released, within 8 MiB of the baseline before it"),
                    ];
                    for (h, tip) in heads {
                        ui.label(RichText::new(h).strong()).on_hover_text(tip);
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
                        let fits = match &t.outcome {
                            Outcome::Ran => RichText::new("fits (ran)"),
                            Outcome::Oom { .. } => RichText::new("OOM").color(error_color(dark)).strong(),
                            _ => outcome_text(t, dark),
                        };
                        let o = ui.label(fits);
                        if let Outcome::Oom { message } | Outcome::Error { message } = &t.outcome {
                            o.on_hover_text(message.as_str());
                        }
                        ui.label(bytes(device_used(t)));
                        ui.label(bytes(t.predicted.map(|p| p.nvidia_smi)));
                        ui.label(error_text(device_vs_predicted_pct(t), dark));
                        ui.label(t.step_ms.map_or_else(|| "–".into(), |ms| format!("{ms:.1} ms")));
                        ui.label(t.tflops.map_or_else(|| "–".into(), |f| format!("{f:.1}")));
                        ui.label(memory_back(t, dark));
                        ui.end_row();
                    }
                });
        });
    cmd
}
