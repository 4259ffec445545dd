//! Memory vs batch size, and the allocated-bytes timeline of one training step.

use egui::Ui;
use egui_plot::{
    Corner, HLine, Legend, Line, LineStyle, MarkerShape, Plot, PlotPoint, Points, Text, VLine,
};

use vramlab_core::plan::Phase;
use vramlab_core::plan::search::SweepPoint;
use vramlab_core::units::Bytes;

use super::derived::{Answer, GpuTarget};
use super::hover::{self, Series};
use super::style::{self, gib_tick, gib_to_bytes, phase_color};

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
    let series = [
        Series::new("nvidia-smi", &smi),
        Series::new("reserved", &reserved),
        Series::new("allocated", &allocated),
    ];
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
            hover::label(
                h,
                &series,
                |x| format!("batch {:.0}", x.max(0.0)),
                |y| gib_to_bytes(y).to_string(),
            )
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
    let peak = answer.report.plan.peak_allocated_bytes;
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
    let series: Vec<Series> = answer
        .timeline
        .iter()
        .map(|seg| Series::new(phase_name(seg.phase), &seg.points))
        .collect();
    let resp = Plot::new("timeline_plot")
        .height(height - 24.0)
        .x_axis_label("allocation event in one training step")
        .y_axis_label("allocated")
        .y_axis_formatter(|m, _| gib_tick(m.value, m.step_size))
        .y_axis_min_width(56.0)
        .include_y(0.0)
        .include_y(peak.as_gib_f64() * 1.12)
        .allow_scroll(false)
        .label_formatter(|h| {
            hover::label(
                h,
                &series,
                |x| format!("event {:.0}", x.max(0.0)),
                |y| gib_to_bytes(y).to_string(),
            )
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
