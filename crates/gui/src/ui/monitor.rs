//! The Monitor tab: device memory and utilisation of the last minutes, and the
//! processes on the GPU (like nvitop), from the [`vramlab_device::gpu::monitor`] sampler.

use egui::{RichText, Ui};
use egui_plot::{Corner, HLine, Legend, Line, LineStyle, Plot};

use vramlab_core::units::Bytes;
use vramlab_device::gpu::monitor::{MonitorModel, MonitorState, WINDOW_SECS};

use super::hover::{self, Series};
use super::png::{self, PlotId};
use super::style::{self, error_color, gib_tick, gib_to_bytes, pct};

/// Draws the monitor; returns a plot to save as PNG when asked.
pub fn monitor_ui(model: &MonitorModel, ui: &mut Ui) -> Option<PlotId> {
    let mut save = None;
    let dark = ui.visuals().dark_mode;
    let device = match &model.state {
        MonitorState::Starting => {
            ui.heading("Live GPU monitor");
            ui.label("Opening NVML…");
            return None;
        }
        MonitorState::Running { device } | MonitorState::Lost { device, .. } => device.clone(),
        MonitorState::Unavailable(why) => return unavailable_ui(why, ui),
    };
    ui.horizontal(|ui| {
        let title = if device.is_empty() {
            "Live GPU monitor".to_string()
        } else {
            format!("Live GPU monitor · {device}")
        };
        ui.heading(title);
        if model.latest().is_some() && png::save_button(ui) {
            save = Some(PlotId::Monitor);
        }
    });
    if let Some(m) = model.state.message() {
        ui.colored_label(error_color(dark), RichText::new(m).size(16.0));
    }
    let Some(last) = model.latest() else {
        if matches!(model.state, MonitorState::Running { .. }) {
            ui.label("Waiting for the first sample…");
        }
        return save;
    };
    let r = &last.reading;
    ui.horizontal_wrapped(|ui| {
        ui.label("Used");
        ui.label(
            RichText::new(format!(
                "{} of {} ({:.0} %)",
                r.used,
                r.total,
                pct(r.used, r.total)
            ))
            .size(20.0)
            .strong(),
        );
        ui.add_space(16.0);
        if let Some(u) = r.util_pct {
            ui.label("GPU utilisation");
            ui.label(RichText::new(format!("{u} %")).size(20.0).strong());
            ui.add_space(16.0);
        }
        if let Some(p) = model.peak_used() {
            ui.label(format!("peak in the window {p}"));
        }
    });
    plots_ui(model, r.total, ui);
    ui.add_space(6.0);
    ui.label(RichText::new("Processes on the GPU").heading());
    if r.processes.is_empty() {
        ui.label("No process holds GPU memory.");
    } else {
        egui::Grid::new("monitor_processes")
            .striped(true)
            .num_columns(4)
            .spacing([16.0, 4.0])
            .show(ui, |ui| {
                for head in ["PID", "Name", "GPU memory", "Share"] {
                    ui.label(RichText::new(head).strong());
                }
                ui.end_row();
                for p in &r.processes {
                    ui.label(p.pid.to_string());
                    ui.label(&p.name);
                    ui.label(p.used.map_or("n/a".into(), |b| b.to_string()));
                    ui.label(
                        p.used
                            .map_or("".into(), |b: Bytes| format!("{:.1} %", pct(b, r.total))),
                    );
                    ui.end_row();
                }
            });
    }
    save
}

/// Device memory and utilisation over the window, their x axes linked.
fn plots_ui(model: &MonitorModel, total: Bytes, ui: &mut Ui) {
    let total_gib = total.as_gib_f64();
    let h = (ui.available_height() - 360.0).clamp(200.0, 460.0);
    let used = model.used_points();
    let util_points = model.util_points();
    let used_series = [Series::new("used", &used)];
    let util_series = [Series::new("GPU utilisation", &util_points)];
    let resp = Plot::new("monitor_plot")
        .height(h)
        .link_axis(egui::Id::unique("monitor_x"), [true, false])
        .legend(Legend::default().position(Corner::LeftTop))
        .x_axis_label(format!(
            "seconds before now (last {:.0} min kept)",
            WINDOW_SECS / 60.0
        ))
        .y_axis_label("device memory used")
        .y_axis_formatter(|m, _| gib_tick(m.value, m.step_size))
        .y_axis_min_width(56.0)
        .include_y(0.0)
        .include_y(total_gib * 1.05)
        .include_x(0.0)
        .allow_scroll(false)
        .label_formatter(|h| {
            hover::label(
                h,
                &used_series,
                |x| format!("{x:.0} s"),
                |y| gib_to_bytes(y).to_string(),
            )
        })
        .show(ui, |plot_ui| {
            plot_ui.hline(
                HLine::new(format!("total {total}"), total_gib)
                    .color(style::CAPACITY_COLOR)
                    .style(LineStyle::dashed_loose()),
            );
            plot_ui.line(
                Line::new("used", used)
                    .color(style::SMI_COLOR)
                    .width(2.0)
                    .fill(0.0)
                    .fill_alpha(0.15),
            );
        });
    let util = Plot::new("monitor_util_plot")
        .height(130.0)
        .link_axis(egui::Id::unique("monitor_x"), [true, false])
        .x_axis_label("seconds before now")
        .y_axis_label("GPU utilisation")
        .y_axis_formatter(|m, _| format!("{:.0} %", m.value))
        .y_axis_min_width(56.0)
        .include_y(0.0)
        .include_y(100.0)
        .include_x(0.0)
        .allow_scroll(false)
        .label_formatter(|h| {
            hover::label(
                h,
                &util_series,
                |x| format!("{x:.0} s"),
                |y| format!("{y:.0} %"),
            )
        })
        .show(ui, |plot_ui| {
            plot_ui.line(
                Line::new("GPU utilisation", util_points)
                    .color(style::RESERVED_COLOR)
                    .width(1.5),
            );
        });
    png::remember_rect(
        ui.ctx(),
        PlotId::Monitor,
        resp.response.rect.union(util.response.rect),
    );
}

/// What the tab would show, and why it is empty: no NVIDIA GPU or NVML on this machine.
fn unavailable_ui(why: &str, ui: &mut Ui) -> Option<PlotId> {
    ui.label(
        RichText::new("No GPU to monitor on this machine")
            .size(18.0)
            .strong(),
    );
    ui.add_space(4.0);
    ui.label(
        "With an NVIDIA GPU and its driver (NVML, libnvidia-ml.so.1), this tab shows the \
         device's used memory and utilisation over the last minutes and every process \
         using it, with its memory — like nvidia-smi or nvitop — so you can watch a \
         training run against the plan.",
    );
    ui.label(
        "The planner does not need a GPU: it plans against the catalog card chosen under GPU.",
    );
    ui.add_space(4.0);
    ui.label(RichText::new(format!("Why it is empty: {why}")).weak());
    None
}
