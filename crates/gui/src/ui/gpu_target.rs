//! Target GPU: the NVML-detected device or a catalog card, and the safety margin.

use egui::{DragValue, RichText, Ui};

use super::derived::TargetKind;
use super::{Command, Derived, GpuChoice, PlannerState, emit, tips};

pub(crate) fn gpu_ui(state: &PlannerState, d: &Derived, ui: &mut Ui, cmd: &mut Option<Command>) {
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
