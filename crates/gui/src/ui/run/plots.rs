//! Measured vs predicted: peak memory over batch size (predicted lines, measured points
//! per trial, OOMs marked) and the memory timeline of one trial.

use egui::{Color32, RichText, Ui};
use egui_plot::{Corner, HLine, Legend, Line, LineStyle, MarkerShape, Plot, Points, VLine};

use crate::ui::style::{self, gib_tick, gib_to_bytes};
use vramlab_core::record::{MemSample, Outcome, Trial};
use vramlab_core::units::Bytes;

use super::KeptRun;

/// Red of OOM markers.
pub const OOM_COLOR: Color32 = Color32::from_rgb(230, 50, 50);

/// Colours of overlaid runs (the shown run uses the curve colours).
const OVERLAY_COLORS: [Color32; 4] = [
    Color32::from_rgb(220, 120, 220),
    Color32::from_rgb(80, 200, 200),
    Color32::from_rgb(230, 200, 80),
    Color32::from_rgb(170, 170, 170),
];

/// One measured figure of a trial.
type Measure = fn(&Trial) -> Option<Bytes>;

fn gib(b: Bytes) -> f64 {
    b.as_gib_f64()
}

fn measured(trials: &[Trial], f: Measure) -> Vec<[f64; 2]> {
    trials
        .iter()
        .filter(|t| t.outcome.ran())
        .filter_map(|t| f(t).map(|b| [t.batch as f64, gib(b)]))
        .collect()
}

fn hover_label(h: &egui_plot::HoverPosition<'_>) -> Option<String> {
    let (name, p) = match h {
        egui_plot::HoverPosition::NearDataPoint {
            plot_name,
            position,
            ..
        } => (*plot_name, *position),
        // Off the series: the batch only; the pointer's height is no series' value.
        egui_plot::HoverPosition::Elsewhere { position } => {
            return Some(format!("batch {:.0}", position.x.max(0.0)));
        }
    };
    let head = if name.is_empty() {
        String::new()
    } else {
        format!("{name}\n")
    };
    Some(format!(
        "{head}batch {:.0}\n{}",
        p.x.max(0.0),
        gib_to_bytes(p.y)
    ))
}

/// Predicted allocated / reserved / nvidia-smi over the run's batch range, measured
/// points of `shown` and of every overlaid run, OOM trials as red crosses on the axis.
#[allow(
    clippy::too_many_lines,
    reason = "one plot: its series are drawn in one closure; not yet split"
)]
pub fn batch_plot_ui(
    shown: &KeptRun,
    overlays: &[&KeptRun],
    ui: &mut Ui,
    height: f32,
) -> egui::Rect {
    let run = &shown.run;
    let top = shown.batch_top() as f64;
    let predicted: [(&str, Color32, Vec<[f64; 2]>); 3] = match shown.curve() {
        Some(c) => {
            let pts = |f: fn(&vramlab_core::plan::search::SweepPoint) -> Bytes| {
                c.points
                    .iter()
                    .map(|p| [p.batch as f64, gib(f(p))])
                    .collect()
            };
            [
                (
                    "predicted reserved",
                    style::RESERVED_COLOR,
                    pts(|p| p.reserved),
                ),
                (
                    "predicted allocated",
                    style::ALLOCATED_COLOR,
                    pts(|p| p.allocated),
                ),
                (
                    "predicted nvidia-smi",
                    style::SMI_COLOR,
                    pts(|p| p.nvidia_smi),
                ),
            ]
        }
        None => {
            let mut ts: Vec<&Trial> = run
                .trials
                .iter()
                .filter(|t| t.predicted.is_some() && t.batch as f64 <= top)
                .collect();
            ts.sort_by_key(|t| t.batch);
            let pts = |f: fn(&vramlab_core::record::Predicted) -> Bytes| {
                ts.iter()
                    .filter_map(|t| t.predicted.as_ref().map(|p| [t.batch as f64, gib(f(p))]))
                    .collect()
            };
            [
                (
                    "predicted reserved",
                    style::RESERVED_COLOR,
                    pts(|p| p.reserved),
                ),
                (
                    "predicted allocated",
                    style::ALLOCATED_COLOR,
                    pts(|p| p.allocated),
                ),
                (
                    "predicted nvidia-smi",
                    style::SMI_COLOR,
                    pts(|p| p.nvidia_smi),
                ),
            ]
        }
    };
    let capacity = run.device.total_bytes;
    let resp = Plot::new("run_batch_plot")
        .height(height)
        .legend(
            // Memory grows with the batch: the lower right is empty.
            Legend::default()
                .position(Corner::RightBottom)
                .follow_insertion_order(true),
        )
        .x_axis_label("micro-batch size")
        .y_axis_label("peak GPU memory")
        .y_axis_formatter(|m, _| gib_tick(m.value, m.step_size))
        .y_axis_min_width(56.0)
        .include_y(0.0)
        .include_x(0.0)
        .include_x(top)
        .allow_scroll(false)
        .label_formatter(hover_label)
        .show(ui, |plot_ui| {
            for (name, color, pts) in predicted {
                plot_ui.line(
                    Line::new(name, pts)
                        .color(color.gamma_multiply(0.8))
                        .width(1.5),
                );
            }
            // The native engine's allocated/reserved are the plan replayed, not measured.
            let native = run.engine == vramlab_core::record::EngineKind::Native;
            let series: [(&str, Color32, MarkerShape, Measure); 3] = [
                (
                    if native {
                        "replayed reserved (the plan)"
                    } else {
                        "measured reserved"
                    },
                    style::RESERVED_COLOR,
                    MarkerShape::Square,
                    |t| t.peak_reserved,
                ),
                (
                    if native {
                        "replayed allocated (the plan)"
                    } else {
                        "measured allocated"
                    },
                    style::ALLOCATED_COLOR,
                    MarkerShape::Circle,
                    |t| t.peak_allocated,
                ),
                (
                    "measured nvidia-smi (process)",
                    style::SMI_COLOR,
                    MarkerShape::Diamond,
                    |t| t.process_bytes,
                ),
            ];
            for (name, color, shape, f) in series {
                plot_ui.points(
                    Points::new(name, measured(&run.trials, f))
                        .shape(shape)
                        .radius(5.0)
                        .filled(true)
                        .color(color),
                );
            }
            for (i, o) in overlays.iter().enumerate() {
                let color = OVERLAY_COLORS[i % OVERLAY_COLORS.len()];
                let name = format!("run {}: {}", o.id, o.run.title());
                for (shape, f) in [
                    (MarkerShape::Square, (|t| t.peak_reserved) as Measure),
                    (MarkerShape::Circle, |t| t.peak_allocated),
                    (MarkerShape::Diamond, |t| t.process_bytes),
                ] {
                    plot_ui.points(
                        Points::new(name.clone(), measured(&o.run.trials, f))
                            .shape(shape)
                            .radius(4.5)
                            .filled(false)
                            .color(color),
                    );
                }
            }
            let ooms: Vec<[f64; 2]> = run
                .trials
                .iter()
                .filter(|t| matches!(t.outcome, Outcome::Oom { .. }) && t.batch as f64 <= top)
                .map(|t| [t.batch as f64, 0.0])
                .collect();
            if !ooms.is_empty() {
                plot_ui.points(
                    Points::new("out of memory", ooms)
                        .shape(MarkerShape::Cross)
                        .radius(8.0)
                        .color(OOM_COLOR),
                );
            }
            if let Some(m) = run.max_batch_ran() {
                plot_ui.vline(
                    VLine::new(format!("largest batch that ran: {m}"), m as f64)
                        .color(style::ALLOCATED_COLOR.gamma_multiply(0.8))
                        .style(LineStyle::dotted_dense())
                        .width(1.5),
                );
            }
            if let Some(m) = run.predicted_max_batch {
                plot_ui.vline(
                    VLine::new(format!("predicted max batch: {m}"), m as f64)
                        .color(style::CAPACITY_COLOR.gamma_multiply(0.7))
                        .style(LineStyle::dashed_loose())
                        .width(1.5),
                );
            }
            if capacity.0 > 0 {
                plot_ui.hline(
                    HLine::new(format!("device memory {capacity}"), gib(capacity))
                        .color(style::CAPACITY_COLOR)
                        .style(LineStyle::dashed_loose())
                        .width(1.5),
                );
            }
        });
    let off = shown.off_range_ooms();
    if !off.is_empty() {
        let list = off
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        ui.label(
            RichText::new(format!(
                "Out of memory at batch {list}: off the plot (beyond 4× the largest batch that ran)."
            ))
            .small(),
        );
    }
    resp.response.rect
}

/// Where a sample goes on the x axis: the planned step's event index when every sample
/// has one, else milliseconds.
fn uses_events(samples: &[MemSample]) -> bool {
    !samples.is_empty() && samples.iter().all(|s| s.event.is_some())
}

fn x_of(s: &MemSample, events: bool) -> f64 {
    match (events, s.event) {
        (true, Some(e)) => f64::from(e),
        _ => s.t_ms,
    }
}

/// The memory of one trial over time: measured device memory beyond the baseline, and
/// the planner's allocated / reserved at the same points where the engine knows them.
pub fn timeline_plot_ui(samples: &[MemSample], what: &str, ui: &mut Ui, height: f32) -> egui::Rect {
    let events = uses_events(samples);
    let pts = |f: fn(&MemSample) -> Option<Bytes>| -> Vec<[f64; 2]> {
        samples
            .iter()
            .filter_map(|s| f(s).map(|b| [x_of(s, events), gib(b)]))
            .collect()
    };
    let meas = pts(|s| Some(s.measured));
    let meas_hover = meas.clone();
    let alloc = pts(|s| s.predicted_allocated);
    let res = pts(|s| s.predicted_reserved);
    let peak = samples.iter().map(|s| s.measured).max();
    let x_label = if events {
        "allocation event in the measured step"
    } else {
        "time in the trial (ms)"
    };
    let x_unit = if events { "event" } else { "ms" };
    if samples.is_empty() {
        ui.label(format!("No memory samples for {what}."));
    }
    let resp = Plot::new("run_timeline_plot")
        .height(height)
        .legend(
            // A step ends low (activations freed): the upper right is empty.
            Legend::default()
                .position(Corner::RightTop)
                .follow_insertion_order(true),
        )
        .x_axis_label(x_label)
        .y_axis_label("GPU memory")
        .y_axis_formatter(|m, _| gib_tick(m.value, m.step_size))
        .y_axis_min_width(56.0)
        .include_y(0.0)
        .include_y(peak.map_or(1.0, |p| gib(p) * 1.25))
        .allow_scroll(false)
        .label_formatter(move |h| {
            let p = match h {
                egui_plot::HoverPosition::NearDataPoint { position, .. } => {
                    [position.x, position.y]
                }
                // Off the curves: the measured value at the pointer's x, not its height.
                egui_plot::HoverPosition::Elsewhere { position } => {
                    *meas_hover.iter().min_by(|a, b| {
                        (a[0] - position.x)
                            .abs()
                            .total_cmp(&(b[0] - position.x).abs())
                    })?
                }
            };
            Some(format!(
                "{x_unit} {:.0}\n{}",
                p[0].max(0.0),
                gib_to_bytes(p[1])
            ))
        })
        .show(ui, |plot_ui| {
            if !res.is_empty() {
                plot_ui.line(
                    Line::new("predicted reserved", res)
                        .color(style::RESERVED_COLOR)
                        .style(LineStyle::dashed_dense())
                        .width(1.5),
                );
            }
            if !alloc.is_empty() {
                plot_ui.line(
                    Line::new("predicted allocated", alloc)
                        .color(style::ALLOCATED_COLOR)
                        .style(LineStyle::dashed_dense())
                        .width(1.5),
                );
            }
            let name = match peak {
                Some(p) => format!("measured (beyond baseline), peak {p}"),
                None => "measured (beyond baseline)".to_string(),
            };
            plot_ui.line(
                Line::new(name, meas)
                    .color(style::SMI_COLOR)
                    .width(2.0)
                    .fill(0.0)
                    .fill_alpha(0.15),
            );
        });
    resp.response.rect
}
