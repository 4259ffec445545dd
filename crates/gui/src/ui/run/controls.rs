//! The Run tab's left panel: what runs (the planner's model and config), the engine,
//! the batches, Start / Cancel, progress, errors, and the kept runs with Open / Save.

use egui::{DragValue, RichText, Ui};

use crate::ui::message::Message;
use crate::ui::style::error_color;
use vramlab_device::bench::EngineKind;

use super::session::RunSource;
use super::{BatchMode, MAX_STEPS, RunCommand, RunSession, RunSettings};

/// What the planner contributes to the form.
pub struct RunContext<'a> {
    /// "GPT-2 (124M) · AMP BF16 · AdamW · seq 1024", or why the model cannot run.
    pub what: Result<String, String>,
    /// The planner's max batch for the chosen GPU (the sweep's seed).
    pub predicted_max: Option<u64>,
    /// The GPU the planner plans for.
    pub gpu_name: &'a str,
    /// The app's status line (saved / opened / errors).
    pub message: Option<&'a Message>,
    /// "world 4 · fsdp2" when the plan is a multi-GPU world (it runs with the PyTorch
    /// engine).
    pub world: Option<String>,
    /// The planner is in Inference mode: the run benches its inference call with the
    /// PyTorch engine (`infer_runner.py`), one measured call per batch.
    pub inference: bool,
}

/// The whole left panel of the Run tab.
pub fn controls_ui(
    settings: &RunSettings,
    session: &RunSession,
    cx: &RunContext<'_>,
    ui: &mut Ui,
) -> Option<RunCommand> {
    let mut cmd = None;
    let red = error_color(ui.visuals().dark_mode);
    ui.heading("Run on the GPU");
    ui.label(if cx.inference {
        "Measures the planner's inference call:"
    } else {
        "Measures the planner's model and training settings:"
    });
    match &cx.what {
        Ok(what) => {
            ui.label(RichText::new(what).strong());
        }
        Err(e) => {
            ui.colored_label(red, format!("Cannot run: {e}"));
        }
    }
    ui.add_space(4.0);
    form_ui(settings, session, cx, ui, &mut cmd);
    ui.add_space(6.0);
    start_ui(settings, session, cx, ui, &mut cmd);
    ui.separator();
    runs_ui(session, cx, ui, &mut cmd);
    cmd
}

fn form_ui(
    settings: &RunSettings,
    session: &RunSession,
    cx: &RunContext<'_>,
    ui: &mut Ui,
    cmd: &mut Option<RunCommand>,
) {
    let mut s = settings.clone();
    let red = error_color(ui.visuals().dark_mode);
    ui.add_enabled_ui(!session.is_running(), |ui| {
        egui::Grid::new("run_form")
            .num_columns(2)
            .spacing([10.0, 6.0])
            .show(ui, |ui| {
                ui.label("Engine");
                if cx.inference {
                    ui.label(EngineKind::Torch.label()).on_hover_text(
                        "Inference calls run in PyTorch and transformers (infer_runner.py); the native engine replays training steps only",
                    );
                } else {
                    ui.vertical(|ui| {
                        for e in EngineKind::ALL {
                            ui.radio_value(&mut s.engine, e, e.label());
                        }
                    });
                }
                ui.end_row();
                if s.engine == EngineKind::Torch || cx.world.is_some() || cx.inference {
                    let l = ui.label("Python").on_hover_text(
                        "Interpreter with PyTorch (CUDA build) for the reference model",
                    );
                    ui.add(egui::TextEdit::singleline(&mut s.python).desired_width(180.0))
                        .labelled_by(l.id);
                    ui.end_row();
                }
                ui.label("Batches");
                ui.vertical(|ui| {
                    ui.radio_value(&mut s.mode, BatchMode::List, "List");
                    ui.radio_value(&mut s.mode, BatchMode::Sweep, "Sweep until OOM")
                        .on_hover_text(
                            "Start at the predicted max batch, then up or down to the exact boundary: the largest batch that runs and the smallest that runs out of memory",
                        );
                });
                ui.end_row();
                if s.mode == BatchMode::List {
                    let l = ui.label("Batch list").on_hover_text(
                        "Proposed from the plan's max batch (a quarter, a half and the max itself); type your own to measure others",
                    );
                    let mut text = s.batch_list(cx.predicted_max);
                    let edit = ui
                        .add(
                            egui::TextEdit::singleline(&mut text)
                                .desired_width(180.0)
                                .hint_text("4,8,16"),
                        )
                        .labelled_by(l.id);
                    if edit.changed() {
                        s.batches = text;
                        s.batches_typed = true;
                    }
                    ui.end_row();
                }
                if !cx.inference {
                    let l = ui.label("Steps per trial").on_hover_text(
                        "Timed training steps per batch size, after one warm-up step",
                    );
                    ui.add(DragValue::new(&mut s.steps).range(1..=MAX_STEPS))
                        .labelled_by(l.id);
                    ui.end_row();
                }
            });
    });
    if cx.inference {
        ui.label(RichText::new(
            "Inference mode: each batch runs in a fresh infer_runner.py process (random weights, one warm-up call, then one measured call), measured against the inference plan.",
        ).small());
    }
    if let Some(w) = &cx.world {
        ui.label(RichText::new(format!(
            "Multi-GPU plan ({w}): runs with the PyTorch engine, under torchrun when the GPUs are here, else rank 0 emulated on GPU 0."
        )).small());
    }
    if s.mode == BatchMode::List && s.batches_typed {
        list_note_ui(&mut s, cx, ui);
    }
    match s.batch_plan(cx.predicted_max, crate::ui::derived::BATCH_LIMIT) {
        Err(e) => {
            ui.colored_label(red, e);
        }
        Ok(_) if s.mode == BatchMode::Sweep => {
            let seed = match cx.predicted_max {
                Some(m) => format!(
                    "Starts at batch {m}, the predicted max batch on {}.",
                    cx.gpu_name
                ),
                None => "No predicted max batch (not even batch 1 fits): starts at 1.".into(),
            };
            ui.label(RichText::new(seed).small());
        }
        Ok(_) => {}
    }
    if s != *settings {
        *cmd = Some(RunCommand::SetSettings(s));
    }
}

/// Under a typed list: which of its batches the plan expects to run out of memory, and
/// a way back to the plan's proposal.
fn list_note_ui(s: &mut RunSettings, cx: &RunContext<'_>, ui: &mut Ui) {
    if let Ok(vramlab_device::bench::BatchPlan::List(list)) =
        vramlab_words::batches::batch_list(&s.batches)
    {
        let over: Vec<String> = list
            .iter()
            .filter(|&&b| cx.predicted_max.is_none_or(|m| b > m))
            .map(u64::to_string)
            .collect();
        if !over.is_empty() {
            let max = cx
                .predicted_max
                .map_or_else(|| "none fits".to_string(), |m| format!("max batch {m}"));
            ui.label(
                RichText::new(format!(
                    "Typed batches the plan expects to run out of memory ({max} on {}): {}.",
                    cx.gpu_name,
                    over.join(", ")
                ))
                .small(),
            );
        }
    }
    let proposal = super::proposed_batches(cx.predicted_max);
    if !proposal.is_empty()
        && ui
            .small_button("Use the plan's batches")
            .on_hover_text(format!(
                "{}: a quarter, a half and the plan's max batch",
                proposal
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ))
            .clicked()
    {
        s.batches_typed = false;
    }
}

fn start_ui(
    settings: &RunSettings,
    session: &RunSession,
    cx: &RunContext<'_>,
    ui: &mut Ui,
    cmd: &mut Option<RunCommand>,
) {
    let red = error_color(ui.visuals().dark_mode);
    let can_start = !session.is_running()
        && cx.what.is_ok()
        && settings.batch_plan(cx.predicted_max, 1).is_ok();
    ui.horizontal(|ui| {
        let start = egui::Button::new(RichText::new("Start").strong());
        if ui
            .add_enabled(can_start, start)
            .on_hover_text("Run the trials on GPU 0")
            .clicked()
        {
            *cmd = Some(RunCommand::Start);
        }
        let cancelling = session.live.as_ref().is_some_and(|l| l.cancelling);
        if ui
            .add_enabled(
                session.is_running() && !cancelling,
                egui::Button::new("Cancel"),
            )
            .on_hover_text("Stop after the current op; the trial's memory is freed")
            .clicked()
        {
            *cmd = Some(RunCommand::Cancel);
        }
    });
    if let Some(live) = &session.live {
        let done = session.run(live.run_id).map_or(0, |r| r.run.trials.len());
        ui.add(
            egui::ProgressBar::new(live.fraction(done))
                .text(live.status(done))
                .animate(true),
        );
    } else if let Some(r) = session.shown().filter(|r| r.source == RunSource::Session) {
        let how = match &r.run.stopped {
            Some(s) if s == "cancelled" => "Cancelled".to_string(),
            Some(_) => "Stopped early".to_string(),
            None => "Finished".to_string(),
        };
        ui.label(format!("{how}: {} trials.", r.run.trials.len()));
    }
    let problems = session.problems();
    for p in &problems {
        ui.colored_label(red, p);
    }
    if session.error.is_some() && ui.small_button("dismiss").clicked() {
        *cmd = Some(RunCommand::DismissError);
    }
}

fn runs_ui(session: &RunSession, cx: &RunContext<'_>, ui: &mut Ui, cmd: &mut Option<RunCommand>) {
    ui.heading("Runs");
    if session.runs.is_empty() {
        ui.label("No runs yet: Start one, or open a saved run.");
    }
    let shown = session.shown().map(|r| r.id);
    let live = session.live.as_ref().map(|l| l.run_id);
    for r in &session.runs {
        ui.horizontal(|ui| {
            let mut overlay = r.overlay || Some(r.id) == shown;
            let resp = ui
                .add_enabled(
                    Some(r.id) != shown,
                    egui::Checkbox::new(&mut overlay, "compare"),
                )
                .on_hover_text("Overlay this run's measured points on the batch plot");
            if resp.changed() {
                *cmd = Some(RunCommand::SetOverlay(r.id, overlay));
            }
            let mut label = r.short_label();
            if Some(r.id) == live {
                label.push_str(" · running");
            }
            if ui
                .selectable_label(Some(r.id) == shown, label)
                .on_hover_text(r.label())
                .clicked()
            {
                *cmd = Some(RunCommand::Select(r.id));
            }
        });
    }
    ui.horizontal_wrapped(|ui| {
        if ui
            .button("Open run…")
            .on_hover_text("Open a saved run (.json)")
            .clicked()
        {
            *cmd = Some(RunCommand::OpenRun);
        }
        let any = session.shown().is_some_and(|r| !r.run.trials.is_empty());
        if ui
            .add_enabled(any, egui::Button::new("Save JSON…"))
            .on_hover_text("The full record of the shown run, to open again or compare")
            .clicked()
        {
            *cmd = Some(RunCommand::SaveJson);
        }
        if ui
            .add_enabled(any, egui::Button::new("Save CSV…"))
            .on_hover_text("One row per trial, measured and predicted columns")
            .clicked()
        {
            *cmd = Some(RunCommand::SaveCsv);
        }
    });
    if let Some(m) = cx.message {
        let color = if m.is_error {
            error_color(ui.visuals().dark_mode)
        } else {
            ui.visuals().text_color()
        };
        ui.colored_label(color, m.text.as_str());
    }
}
