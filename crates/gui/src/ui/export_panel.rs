//! The "Export" section: the current plan as a `.vramlab.json` document or as a
//! framework config (DeepSpeed, Hugging Face, Lightning, PyTorch loop, allocator env),
//! with a read-only preview, Copy and Save….

use egui::{RichText, Ui};

use vramlab_core::export::vramlab_file::DetectedCard;
use vramlab_core::export::{ExportError, Format, VramlabConfig, render};
use vramlab_core::plan::Plan;

use super::derived::TargetKind;
use super::{Command, Derived, GpuChoice, PlannerState, emit};

/// The name shown for a format in the selector.
pub fn format_label(f: Format) -> &'static str {
    match f {
        Format::Vramlab => "vramlab",
        Format::DeepSpeed => "DeepSpeed",
        Format::HuggingFace => "HF TrainingArguments",
        Format::Lightning => "Lightning",
        Format::PyTorch => "PyTorch loop",
        Format::Env => "env",
        Format::Accelerate => "accelerate YAML",
        Format::Torchrun => "torchrun",
        Format::Fsdp2 => "FSDP2 snippet",
        Format::Peft => "peft / QLoRA",
    }
}

/// The file name the save dialog suggests for `format` (`model`: the preset id).
pub fn suggested_file_name(format: Format, model: &str) -> String {
    match format {
        Format::Vramlab => format!("{model}.vramlab.json"),
        Format::DeepSpeed => "ds_config.json".into(),
        Format::HuggingFace => "training_args.json".into(),
        Format::Lightning => "trainer_args.json".into(),
        Format::PyTorch => "train.py".into(),
        Format::Env => "vramlab.env".into(),
        Format::Accelerate => "accelerate_config.yaml".into(),
        Format::Torchrun => "launch.sh".into(),
        Format::Fsdp2 => "fsdp2_setup.py".into(),
        Format::Peft => "finetune_peft.py".into(),
    }
}

/// The GPU as written into a `.vramlab.json`: the concrete card planned for. A detected
/// GPU is stored as the card NVML reported (so the file plans the same on any machine)
/// and the catalog card of the same name or memory, or "detected" when there is none;
/// with no GPU detected, the catalog card the plan fell back to.
pub fn gpu_id(state: &PlannerState, d: &Derived) -> (String, Option<DetectedCard>) {
    let target = d.target();
    match (&state.gpu, target.kind, &d.detected) {
        (GpuChoice::Detected, TargetKind::Detected, Some(det)) => {
            let card = DetectedCard {
                name: det.name.clone(),
                memory_mib: det.total.0 >> 20,
            };
            let id = d
                .catalog
                .iter()
                .find(|g| g.name.eq_ignore_ascii_case(&det.name))
                .or_else(|| d.catalog.iter().find(|g| g.memory_mib == card.memory_mib))
                .map_or_else(|| "detected".to_string(), |g| g.id.clone());
            (id, Some(card))
        }
        (GpuChoice::Catalog(id), ..) => (id.clone(), None),
        _ => (target.gpu.id.clone(), None),
    }
}

/// The `.vramlab.json` document of the current state (`None`: the model is invalid).
pub fn vramlab_config(
    state: &PlannerState,
    d: &Derived,
    plan: Option<&Plan>,
) -> Option<VramlabConfig> {
    let preset = d.preset().ok()?;
    let (gpu, detected) = gpu_id(state, d);
    let mut doc = VramlabConfig::new(
        preset,
        state.custom.is_some(),
        state.config,
        &gpu,
        state.margin(),
        plan,
    );
    doc.gpu_detected = detected;
    Some(doc)
}

/// The text `format` exports for the current state and `plan` (`None`: the model is
/// invalid; `Some(Err)`: the format cannot carry this plan, the error says which can).
pub fn export_text(
    state: &PlannerState,
    d: &Derived,
    plan: &Plan,
    format: Format,
) -> Option<Result<String, ExportError>> {
    let doc = vramlab_config(state, d, Some(plan))?.to_json();
    // A custom model may reuse a built-in id for other weights: only built-ins name a Hub id.
    let hub_id = match state.custom {
        Some(_) => None,
        None => d.preset().ok().and_then(|p| p.hub_id()),
    };
    Some(render(format, &state.config, plan, &doc, hub_id))
}

/// The section's body (inside the collapsing header drawn by the caller).
pub fn export_ui(
    state: &PlannerState,
    d: &Derived,
    plan: &Plan,
    format: Format,
    ui: &mut Ui,
) -> Option<Command> {
    let mut cmd = None;
    ui.horizontal_wrapped(|ui| {
        ui.label("Format");
        for f in Format::ALL {
            if ui
                .selectable_label(f == format, format_label(f))
                .on_hover_text(format!("--format {}", f.as_str()))
                .clicked()
                && f != format
            {
                emit(&mut cmd, Command::SetExportFormat(f));
            }
        }
    });
    let Some(text) = export_text(state, d, plan, format) else {
        ui.colored_label(
            super::style::error_color(ui.visuals().dark_mode),
            "The model is invalid: nothing to export.",
        );
        return cmd;
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            ui.colored_label(
                super::style::error_color(ui.visuals().dark_mode),
                format!("{e:#}"),
            );
            return cmd;
        }
    };
    ui.horizontal(|ui| {
        if ui
            .button("Copy")
            .on_hover_text("Copy the preview to the clipboard")
            .clicked()
        {
            ui.ctx().copy_text(text.clone());
        }
        if ui
            .button("Save…")
            .on_hover_text("Write the preview to a file (Ctrl+S saves the .vramlab.json)")
            .clicked()
        {
            emit(&mut cmd, Command::SaveExport);
        }
        ui.weak("Ctrl+S saves, Ctrl+O opens a .vramlab.json (or drop one on the window)");
    });
    egui::Frame::group(ui.style()).show(ui, |ui| {
        ui.set_min_width(ui.available_width());
        egui::ScrollArea::both()
            .id_salt("export_preview")
            .max_height(480.0)
            .min_scrolled_height(240.0)
            .show(ui, |ui| {
                ui.add(egui::Label::new(RichText::new(text).monospace()).extend());
            });
    });
    cmd
}
