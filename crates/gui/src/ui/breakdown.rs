//! Where the bytes go at the peak: a stacked horizontal bar and a table.

use egui::{RichText, Ui};
use egui_plot::{Bar, BarChart, Plot, PlotPoint, Text, VLine};

use vramlab_core::plan::Plan;
use vramlab_core::units::Bytes;

use super::derived::GpuTarget;
use super::style::{self, category_color, gib_tick, pct};
use super::tips;

/// Tooltip for a breakdown category key.
pub fn category_tip(key: &str) -> &'static str {
    match key {
        "parameters" => "The model's weights (fp32 unless pure bf16).",
        "gradients" => {
            "One gradient per parameter, created in backward and kept until the optimizer step."
        }
        "optimizer_state" => {
            "Per-parameter optimizer buffers (Adam: exp_avg and exp_avg_sq), created on the first step."
        }
        "weight_casts" => {
            "fp16/bf16 copies of the weights that autocast caches for the forward and backward."
        }
        "activations" => {
            "Forward outputs saved for backward (and the input batch); they scale with batch and sequence."
        }
        "transient" => {
            "Short-lived buffers live at the peak: activation gradients, optimizer temporaries, cuBLAS workspace."
        }
        "allocator_overhead" => tips::ALLOCATOR_OVERHEAD,
        "cuda_context" => tips::CUDA_CONTEXT,
        "unsharded" => {
            "FSDP2 / ZeRO-3: the gathered full parameters of the blocks being computed (and the root) and their unsharded gradients, transient per block."
        }
        "communication" => {
            "Collective buffers: all-gather outputs, reduce-scatter inputs, DDP reducer buckets, ZeRO reduce buckets."
        }
        _ => "",
    }
}

/// Stacked bar of the breakdown (the bar's total is the nvidia-smi figure). Hovering a
/// segment shows its exact bytes; the table below, with the same colours, is the legend.
pub fn breakdown_bar_ui(plan: &Plan, target: &GpuTarget, ui: &mut Ui, height: f32) {
    let total = plan.nvidia_smi_bytes;
    let mut charts: Vec<BarChart> = Vec::new();
    for s in &plan.breakdown {
        let color = category_color(&s.category);
        let label = s.label.to_string();
        let hover = format!("{}\n{} ({:.1} %)", s.label, s.bytes, pct(s.bytes, total));
        let bar = Bar::new(0.0, s.bytes.as_gib_f64())
            .width(0.7)
            .fill(color)
            .name(label.as_str());
        let mut chart = BarChart::new(label, vec![bar])
            .color(color)
            .horizontal()
            .element_formatter(Box::new(move |_, _| hover.clone()));
        {
            let below: Vec<&BarChart> = charts.iter().collect();
            chart = chart.stack_on(&below);
        }
        charts.push(chart);
    }
    let usable = target.budget.usable().as_gib_f64();
    let x_max = total.as_gib_f64().max(target.budget.capacity.as_gib_f64());
    // Label left of the line, unless that would run off the plot.
    let anchor = if usable > 0.3 * x_max {
        egui::Align2::RIGHT_CENTER
    } else {
        egui::Align2::LEFT_CENTER
    };
    Plot::new("breakdown_bar")
        .height(height)
        .show_axes([true, false])
        .show_grid([true, false])
        .allow_zoom(false)
        .allow_drag(false)
        .allow_scroll(false)
        .allow_boxed_zoom(false)
        .include_x(0.0)
        .include_x(x_max * 1.02)
        .default_y_bounds(-0.5, 1.0)
        .x_axis_formatter(|m, _| gib_tick(m.value, m.step_size))
        .label_formatter(|_| None)
        .show(ui, |plot_ui| {
            for c in charts {
                plot_ui.bar_chart(c);
            }
            plot_ui.vline(
                VLine::new(format!("usable {}", target.budget.usable()), usable)
                    .color(style::CAPACITY_COLOR)
                    .width(2.0),
            );
            plot_ui.text(
                Text::new(
                    "usable capacity",
                    PlotPoint::new(usable, 0.72),
                    RichText::new(format!(" usable {} ", target.budget.usable()))
                        .size(13.0)
                        .color(style::CAPACITY_COLOR),
                )
                .anchor(anchor),
            );
        });
}

/// The same numbers as a table.
pub fn breakdown_table_ui(plan: &Plan, ui: &mut Ui) {
    let total = plan.nvidia_smi_bytes;
    egui::Grid::new("breakdown_table")
        .num_columns(3)
        .striped(true)
        .spacing([14.0, 3.0])
        .show(ui, |ui| {
            if let Some(t) = plan.trainable_params {
                ui.label("Trainable parameters")
                    .on_hover_text("peft's print_trainable_parameters: adapters train, the base is frozen");
                ui.label(format!("{t} of {}", plan.params));
                ui.label(format!("{:.3} %", 100.0 * t as f64 / plan.params.max(1) as f64));
                ui.end_row();
            }
            ui.label(RichText::new("Category (legend)").strong());
            ui.label(RichText::new("Bytes").strong());
            ui.label(RichText::new("Share").strong());
            ui.end_row();
            for s in &plan.breakdown {
                ui.horizontal(|ui| {
                    style::swatch(ui, category_color(&s.category));
                    ui.label(s.label).on_hover_text(category_tip(&s.category));
                });
                ui.label(s.bytes.to_string());
                ui.label(format!("{:.1} %", pct(s.bytes, total)));
                ui.end_row();
                if s.category == "parameters"
                    && let Some(w) = plan.weights_split
                {
                    for (what, b) in [
                        ("    frozen weights", w.frozen_bytes),
                        ("    trainable weights", w.trainable_bytes),
                    ] {
                        ui.label(what);
                        ui.label(b.to_string());
                        ui.label("");
                        ui.end_row();
                    }
                }
            }
            if plan.paged_optimizer_bytes.0 > 0 {
                ui.label("Optimizer state, evictable (paged)").on_hover_text(
                    "bitsandbytes paged optimizer: state in unified memory (cudaMallocManaged), \
                     outside PyTorch's allocator and the total; the driver evicts it to host RAM under pressure",
                );
                ui.label(plan.paged_optimizer_bytes.to_string());
                ui.label("not in total");
                ui.end_row();
            }
            let sum: u64 = plan.breakdown.iter().map(|s| s.bytes.0).sum();
            ui.label(RichText::new("Total (nvidia-smi)").strong())
                .on_hover_text(tips::NVIDIA_SMI);
            ui.label(RichText::new(Bytes(sum).to_string()).strong());
            ui.label("100 %");
            ui.end_row();
        });
}
