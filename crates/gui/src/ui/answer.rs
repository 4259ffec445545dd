//! The answer at a glance: fits / does not fit, peak vs capacity, where the peak is,
//! and the largest batch that fits.

use egui::{Color32, RichText, Ui};

use vramlab_core::plan::search::accumulation_for;

use super::derived::BATCH_LIMIT;
use super::style::{error_color, fit_icon, pct, verdict_color};
use super::{Command, Derived, PlannerState, emit, tips};

/// The verdict line as shown, e.g. "21.40 GiB of 22.79 GiB usable (94 %)".
pub fn usage_text(smi: vramlab_core::units::Bytes, usable: vramlab_core::units::Bytes) -> String {
    format!("{smi} of {usable} usable ({:.0} %)", pct(smi, usable))
}

/// The measured error band under the verdict: the upper edge the verdict was judged at,
/// and the band's basis (or that no measurement covers this mode).
fn band_ui(v: &vramlab_core::answer::Verdict, ui: &mut Ui) {
    let b = &v.error_band;
    let edge = format!(
        "judged at the band's upper edge: {} nvidia-smi",
        v.nvidia_smi_upper_bytes
    );
    ui.label(RichText::new(edge).strong())
        .on_hover_text(tips::ERROR_BAND);
    let text = v.band_line();
    if b.measured {
        ui.label(text).on_hover_text(tips::ERROR_BAND);
    } else {
        ui.colored_label(error_color(ui.visuals().dark_mode), text)
            .on_hover_text(tips::ERROR_BAND);
    }
}

/// The report's warnings (settings the card runs badly or not at all), one line each.
fn warnings_ui(warnings: &[String], ui: &mut Ui) {
    for w in warnings {
        ui.colored_label(ui.visuals().warn_fg_color, format!("Warning: {w}"));
    }
}

pub fn answer_ui(state: &PlannerState, d: &Derived, ui: &mut Ui) -> Option<Command> {
    let mut cmd = None;
    let dark = ui.visuals().dark_mode;
    let Some(a) = d.answer() else {
        let err = d.error().unwrap_or("nothing to plan yet");
        egui::Frame::group(ui.style()).show(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.label(
                RichText::new("Cannot plan this configuration")
                    .size(24.0)
                    .strong()
                    .color(error_color(dark)),
            );
            ui.colored_label(error_color(dark), err);
        });
        return None;
    };
    let r = &a.report;
    let plan = &r.plan;
    let target = d.target();
    let usable = target.budget.usable();
    let color = verdict_color(r.fits(), dark);
    let fill = Color32::from_rgba_unmultiplied(color.r(), color.g(), color.b(), 28);

    egui::Frame::group(ui.style())
        .fill(fill)
        .stroke(egui::Stroke::new(1.5, color))
        .inner_margin(12.0)
        .show(ui, |ui| {
            ui.set_width(ui.available_width());
            ui.horizontal_top(|ui| {
                ui.vertical(|ui| {
                    ui.set_width((ui.available_width() * 0.6).max(360.0));
                    let verdict = if r.fits() { "FITS" } else { "DOES NOT FIT" };
                    ui.horizontal(|ui| {
                        fit_icon(ui, r.fits(), 30.0);
                        ui.label(RichText::new(verdict).size(32.0).strong().color(color));
                        ui.label(RichText::new(format!("on {}", target.gpu.name)).size(18.0));
                    });
                    ui.label(
                        RichText::new(usage_text(plan.nvidia_smi_bytes, usable))
                            .size(21.0)
                            .strong(),
                    )
                    .on_hover_text(tips::NVIDIA_SMI);
                    band_ui(&r.verdict, ui);
                    ui.label(format!(
                        "predicted nvidia-smi at the peak · {} total, {:.0} % safety margin",
                        target.budget.capacity,
                        target.budget.margin * 100.0
                    ))
                    .on_hover_text(tips::MARGIN);
                    ui.horizontal_wrapped(|ui| {
                        ui.label(format!("allocated {}", plan.peak_allocated_bytes))
                            .on_hover_text(tips::ALLOCATED);
                        ui.label("·");
                        ui.label(format!("reserved {}", plan.peak_reserved_bytes))
                            .on_hover_text(tips::RESERVED);
                        ui.label("·");
                        ui.label(format!("CUDA context {}", plan.cuda_context_bytes))
                            .on_hover_text(tips::CUDA_CONTEXT);
                    });
                    let layer = if plan.peak_layer.is_empty() {
                        String::new()
                    } else {
                        format!(" · {}", plan.peak_layer)
                    };
                    ui.label(format!("Peak during {}{layer}", plan.peak_phase.label()))
                        .on_hover_text(tips::PEAK_PHASE);
                    warnings_ui(&r.warnings, ui);
                });
                ui.add_space(16.0);
                ui.vertical(|ui| {
                    max_batch_ui(state, d, ui, &mut cmd);
                });
            });
        });
    cmd
}

fn max_batch_ui(state: &PlannerState, d: &Derived, ui: &mut Ui, cmd: &mut Option<Command>) {
    let dark = ui.visuals().dark_mode;
    ui.label("Largest micro-batch that fits")
        .on_hover_text(tips::MAX_BATCH);
    let cfg = state.config;
    match d.max_batch() {
        Some(Ok(Some(m))) => {
            let text = if *m >= BATCH_LIMIT {
                format!("≥ {m}")
            } else {
                m.to_string()
            };
            ui.label(RichText::new(text).size(30.0).strong())
                .on_hover_text(tips::MAX_BATCH);
            if *m != cfg.batch && ui.button(format!("Use batch {m}")).clicked() {
                let mut c = cfg;
                c.batch = *m;
                emit(cmd, Command::SetConfig(c));
            }
            let eff = cfg.effective_batch();
            if cfg.batch > *m {
                let steps = accumulation_for(eff, *m);
                let label = format!("Keep effective batch {eff}: {m} × {steps} accumulation steps");
                if ui.button(label).on_hover_text(tips::ACCUMULATION).clicked() {
                    let mut c = cfg;
                    c.batch = *m;
                    c.accum = steps;
                    emit(cmd, Command::SetConfig(c));
                }
            } else {
                ui.label(format!(
                    "effective batch {} = {} × {} accumulation",
                    eff, cfg.batch, cfg.accum
                ))
                .on_hover_text(tips::ACCUMULATION);
            }
        }
        Some(Ok(None)) => {
            ui.label(
                RichText::new("none")
                    .size(30.0)
                    .strong()
                    .color(error_color(dark)),
            );
            ui.label(nothing_fits_text(d));
        }
        Some(Err(e)) => {
            ui.colored_label(error_color(dark), format!("{e:#}"));
        }
        None => {
            ui.weak("—");
        }
    }
}

/// What to say when even batch 1 does not fit: which remedies would fit, and at which
/// micro-batch (each remedy is planned, and searched for the largest batch it allows).
pub fn nothing_fits_text(d: &Derived) -> String {
    let Some(a) = d.answer() else {
        return "Even batch 1 does not fit.".into();
    };
    // The remedies are planned on a worker: until this batch's arrive, say only what is known.
    if a.report.remedies.is_err() || a.remedies_of != super::derived::RemediesOf::Current {
        return "Even batch 1 does not fit.".into();
    }
    let fitting: Vec<String> = a
        .report
        .fitting_remedies()
        .iter()
        .map(|f| {
            let up_to = if f.as_configured { "" } else { "up to " };
            format!(
                "{} (at micro-batch {up_to}{})",
                f.remedy.name, f.micro_batch
            )
        })
        .collect();
    if fitting.is_empty() {
        "Even batch 1 does not fit, and no single remedy below makes it fit: \"Make it fit\" \
         below lists the combinations that do, or choose a larger GPU."
            .into()
    } else {
        format!(
            "Even batch 1 does not fit. These would: {}. Apply sets that batch.",
            fitting.join(", ")
        )
    }
}
