//! Memory vs batch size, and the allocated-bytes timeline of one training step.

use egui::Ui;
use egui_plot::{
    Corner, HLine, Legend, Line, LineStyle, MarkerShape, Plot, PlotPoint, Points, Text, VLine,
};

use vramlab_core::plan::Phase;
use vramlab_core::plan::search::SweepPoint;
use vramlab_core::units::Bytes;

use super::derived::{Answer, GpuTarget};
use super::style::{self, gib_tick, gib_to_bytes, phase_color};

/// The hover label away from the curves: the sweep point nearest the pointer's batch `x`
/// (the curves' values there, not the pointer's height).
pub fn sweep_label_at(sweep: &[SweepPoint], x: f64) -> Option<String> {
    let p = sweep.iter().min_by(|a, b| {
        (a.batch as f64 - x)
            .abs()
            .total_cmp(&(b.batch as f64 - x).abs())
    })?;
    Some(format!(
        "batch {}\nnvidia-smi {}\nreserved {}\nallocated {}",
        p.batch, p.nvidia_smi, p.reserved, p.allocated
    ))
}

/// The hover label away from the timeline: the allocated bytes at the point nearest the
/// pointer's event `x`.
pub fn timeline_label_at<'a>(
    segments: impl Iterator<Item = &'a [[f64; 2]]>,
    x: f64,
) -> Option<String> {
    let [ex, y] = segments
        .flatten()
        .min_by(|a, b| (a[0] - x).abs().total_cmp(&(b[0] - x).abs()))?;
    Some(format!("event {:.0}\n{}", ex.max(0.0), gib_to_bytes(*y)))
}

/// Predicted peak allocated / reserved / nvidia-smi over batch size, with the usable
/// capacity, the max batch and the current batch.
pub fn batch_plot_ui(
    sweep: &[SweepPoint],
    target: &GpuTarget,
    max_batch: Option<u64>,
    batch: u64,
    current_smi: Bytes,
    ui: &mut Ui,
    height: f32,
) -> egui::Rect {
    let pts = |f: fn(&SweepPoint) -> Bytes| -> Vec<[f64; 2]> {
        sweep
            .iter()
            .map(|p| [p.batch as f64, f(p).as_gib_f64()])
            .collect()
    };
    let smi = pts(|p| p.nvidia_smi);
    let reserved = pts(|p| p.reserved);
    let allocated = pts(|p| p.allocated);
    let usable = target.budget.usable();
    let resp = Plot::new("batch_plot")
        .height(height)
        .legend(
            Legend::default()
                .position(Corner::LeftTop)
                .follow_insertion_order(true),
        )
        .x_axis_label("micro-batch size")
        .y_axis_label("GPU memory")
        .y_axis_formatter(|m, _| gib_tick(m.value, m.step_size))
        .y_axis_min_width(56.0)
        .include_y(0.0)
        .include_y(usable.as_gib_f64() * 1.08)
        .include_x(0.0)
        .allow_scroll(false)
        .label_formatter(|h| {
            let (name, p) = match h {
                egui_plot::HoverPosition::NearDataPoint {
                    plot_name,
                    position,
                    ..
                } => (*plot_name, *position),
                // Off the curves: their values at the pointer's batch, not its height.
                egui_plot::HoverPosition::Elsewhere { position } => {
                    return sweep_label_at(sweep, position.x);
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
        })
        .show(ui, |plot_ui| {
            plot_ui.line(
                Line::new("reserved", reserved)
                    .color(style::RESERVED_COLOR)
                    .width(2.0),
            );
            plot_ui.line(
                Line::new("allocated", allocated)
                    .color(style::ALLOCATED_COLOR)
                    .width(2.0),
            );
            plot_ui.line(
                Line::new("nvidia-smi", smi)
                    .color(style::SMI_COLOR)
                    .width(2.5),
            );
            plot_ui.hline(
                HLine::new(format!("usable capacity {usable}"), usable.as_gib_f64())
                    .color(style::CAPACITY_COLOR)
                    .style(LineStyle::dashed_loose())
                    .width(2.0),
            );
            if let Some(m) = max_batch {
                plot_ui.vline(
                    VLine::new(format!("max batch {m}"), m as f64)
                        .color(style::CAPACITY_COLOR.gamma_multiply(0.7))
                        .style(LineStyle::dotted_dense())
                        .width(1.5),
                );
            }
            plot_ui.points(
                Points::new(
                    format!("current batch {batch}"),
                    vec![[batch as f64, current_smi.as_gib_f64()]],
                )
                .shape(MarkerShape::Diamond)
                .radius(7.0)
                .filled(true)
                .color(egui::Color32::from_rgb(240, 200, 30)),
            );
        });
    resp.response.rect
}

/// Allocated bytes through one step (x = event index), coloured by phase.
pub fn timeline_plot_ui(answer: &Answer, ui: &mut Ui, height: f32) -> egui::Rect {
    let peak = answer.plan.peak_allocated_bytes;
    // The legend is a row above the plot: inside, it would hide the curve's top.
    ui.horizontal_wrapped(|ui| {
        for phase in PHASES {
            if answer
                .timeline
                .iter()
                .any(|s| phase_name(s.phase) == phase_name(phase))
            {
                style::swatch(ui, phase_color(phase));
                ui.label(phase_name(phase));
                ui.add_space(6.0);
            }
        }
    });
    let resp = Plot::new("timeline_plot")
        .height(height - 24.0)
        .x_axis_label("allocation event in one training step")
        .y_axis_label("allocated")
        .y_axis_formatter(|m, _| gib_tick(m.value, m.step_size))
        .y_axis_min_width(56.0)
        .include_y(0.0)
        .include_y(peak.as_gib_f64() * 1.12)
        .allow_scroll(false)
        .label_formatter(|h| match h {
            egui_plot::HoverPosition::NearDataPoint { position, .. } => Some(format!(
                "event {:.0}\n{}",
                position.x.max(0.0),
                gib_to_bytes(position.y)
            )),
            // Off the curve: its value at the pointer's event, not the pointer's height.
            egui_plot::HoverPosition::Elsewhere { position } => timeline_label_at(
                answer.timeline.iter().map(|s| s.points.as_slice()),
                position.x,
            ),
        })
        .show(ui, |plot_ui| {
            for seg in &answer.timeline {
                plot_ui.line(
                    Line::new(phase_name(seg.phase), seg.points.clone())
                        .color(phase_color(seg.phase))
                        .width(1.8)
                        .fill(0.0)
                        .fill_alpha(0.18),
                );
            }
            plot_ui.text(
                Text::new(
                    "peak label",
                    PlotPoint::new(0.0, peak.as_gib_f64()),
                    egui::RichText::new(format!(" peak allocated {peak}"))
                        .size(13.0)
                        .color(style::ALLOCATED_COLOR),
                )
                .anchor(egui::Align2::LEFT_BOTTOM),
            );
            plot_ui.hline(
                HLine::new(format!("peak allocated {peak}"), peak.as_gib_f64())
                    .color(style::ALLOCATED_COLOR)
                    .style(LineStyle::dashed_loose())
                    .width(1.5),
            );
        });
    resp.response.rect
}

const PHASES: [Phase; 4] = [
    Phase::ZeroGrad,
    Phase::Forward,
    Phase::Backward,
    Phase::Optimizer,
];

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Setup | Phase::ZeroGrad => "zero_grad",
        Phase::Forward => "forward",
        Phase::Backward => "backward",
        Phase::Optimizer => "optimizer step",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Away from the curves the label gives the curves' values at the pointer's batch or
    /// event, whatever the pointer's height.
    #[test]
    fn hover_labels_follow_the_curves() {
        let sweep = [1, 2, 4].map(|b| SweepPoint {
            batch: b,
            allocated: Bytes::gib(b),
            reserved: Bytes::gib(b + 1),
            nvidia_smi: Bytes::gib(b + 2),
        });
        let label = sweep_label_at(&sweep, 3.6).expect("label");
        assert_eq!(
            label,
            "batch 4\nnvidia-smi 6.00 GiB\nreserved 5.00 GiB\nallocated 4.00 GiB"
        );
        assert!(sweep_label_at(&[], 1.0).is_none());
        let seg_a = [[0.0, 1.0], [10.0, 2.0]];
        let seg_b = [[20.0, 3.0]];
        let label = timeline_label_at([&seg_a[..], &seg_b[..]].into_iter(), 18.0).expect("label");
        assert_eq!(label, format!("event 20\n{}", gib_to_bytes(3.0)));
    }
}
