//! The Inference mode's panels: the Training / Inference switch, the left panel's inputs
//! (model, the call, GPU), and the central answer (verdict, peaks, KV cache, weights, the
//! largest batch) with the call's memory over its forwards.

use egui::{DragValue, RichText, Ui};
use egui_plot::{HLine, Legend, Line, LineStyle, Plot, VLine};

use vramlab_core::answer::inference::InferAnswer;
use vramlab_core::plan::config::Attention;
use vramlab_core::plan::finetune_mode::Quant;
use vramlab_core::plan::inference::{InferStep, KvCache, TracePoint, quant};
use vramlab_core::units::Bytes;

use super::answer::usage_text;
use super::derived::BATCH_LIMIT;
use super::gpu_target::gpu_ui;
use super::hover::{self, Series};
use super::inference::{InferSettings, PRECISIONS, PlannerMode};
use super::message::Message;
use super::model_picker::model_ui;
use super::style::{self, error_color, fit_icon, gib_tick, gib_to_bytes, verdict_color};
use super::{Command, Derived, PlannerState, emit};

/// Longest prompt or generation the fields take (the model's `max_position_embeddings`
/// bounds it further; the planner names it).
const MAX_TOKENS: u64 = 1 << 20;

/// What is not modelled yet, said where the settings are.
pub const NOT_MODELLED: &str = "Checkpoints stored pre-quantized are not modelled yet; beam \
    search is planned by the CLI (--num-beams). Quantized weights under device_map=\"auto\" are \
    planned with llm_int8_enable_fp32_cpu_offload=True (transformers refuses the offload \
    without it); int8 only when a layer leaves the GPU: offloaded 4-bit layers fail at the \
    first forward (transformers 5.17, bitsandbytes 0.50.2, measured).";

const PREFILL_COLOR: egui::Color32 = egui::Color32::from_rgb(235, 160, 40);

/// "Plan: Training step | Inference call" in the top bar (Planner tab).
pub fn mode_switch(state: &PlannerState, ui: &mut Ui, cmd: &mut Option<Command>) {
    ui.label("Plan");
    let mut mode = state.mode;
    ui.selectable_value(&mut mode, PlannerMode::Training, "Training step")
        .on_hover_text("One training step (forward, backward, optimizer)");
    ui.selectable_value(&mut mode, PlannerMode::Inference, "Inference call")
        .on_hover_text("model.generate() or a forward under torch.no_grad()");
    if mode != state.mode {
        emit(cmd, Command::SetMode(mode));
    }
}

/// The left panel in Inference mode.
pub fn infer_inputs_ui(
    state: &PlannerState,
    d: &Derived,
    message: Option<&Message>,
    ui: &mut Ui,
) -> Option<Command> {
    let mut cmd = None;
    ui.heading("Model");
    model_ui(state, d, message, ui, &mut cmd);
    ui.separator();
    ui.heading("Inference");
    settings_ui(&state.infer, ui, &mut cmd);
    ui.separator();
    ui.heading("GPU");
    gpu_ui(state, d, ui, &mut cmd);
    cmd
}

fn choice<T: PartialEq + Copy>(ui: &mut Ui, value: &mut T, options: &[(T, &str, &str)]) -> bool {
    let mut changed = false;
    ui.horizontal(|ui| {
        for &(v, text, tip) in options {
            changed |= ui
                .selectable_value(value, v, text)
                .on_hover_text(tip)
                .changed();
        }
    });
    changed
}

fn tokens_drag(ui: &mut Ui, label: &str, tip: &str, value: &mut u64, max: u64) -> bool {
    let l = ui.label(label).on_hover_text(tip);
    ui.add(DragValue::new(value).range(1..=max).speed(1.0))
        .labelled_by(l.id)
        .on_hover_text(tip)
        .changed()
}

const DEVICE_MAP_TIP: &str = "from_pretrained(..., device_map=\"auto\", max_memory=...): the \
    modules that do not fit the GPU budget stay on the CPU (or disk); their weights are copied \
    to the GPU as they run";

fn size_edit(ui: &mut Ui, label: &str, tip: &str, value: &mut String) -> bool {
    let l = ui.label(label).on_hover_text(tip);
    ui.add(egui::TextEdit::singleline(value).desired_width(90.0))
        .labelled_by(l.id)
        .on_hover_text(tip)
        .changed()
}

/// The "Weights" row: the dtype or bitsandbytes nf4 (with its double-quantization box) or
/// int8 (`--quant`, `--no-double-quant`); whether it changed.
fn weights_row(ui: &mut Ui, n: &mut InferSettings) -> bool {
    let mut changed = false;
    ui.label("Weights");
    ui.horizontal(|ui| {
        changed |= choice(
            ui,
            &mut n.quant,
            &[
                (
                    None,
                    "dtype",
                    "Every weight in the precision (no quantization_config)",
                ),
                (
                    Some(Quant::Nf4),
                    "nf4",
                    "bitsandbytes 4-bit NormalFloat: from_pretrained(..., \
                     quantization_config=BitsAndBytesConfig(load_in_4bit=True, \
                     bnb_4bit_quant_type=\"nf4\")), the compute dtype the precision; \
                     the kernels as bitsandbytes picks them on H100 / H200",
                ),
                (
                    Some(Quant::Int8),
                    "int8",
                    "bitsandbytes LLM.int8 (load_in_8bit)",
                ),
            ],
        );
        if n.quant.is_some_and(Quant::is_4bit) {
            changed |= ui
                .checkbox(&mut n.double_quant, "double quant")
                .on_hover_text("bnb_4bit_use_double_quant: the 4-bit block scales quantized again")
                .changed();
        }
    });
    ui.end_row();
    changed
}

fn settings_ui(s: &InferSettings, ui: &mut Ui, cmd: &mut Option<Command>) {
    let mut n = s.clone();
    let mut changed = false;
    let generate = s.step == InferStep::Generate;
    egui::Grid::new("infer_grid")
        .num_columns(2)
        .spacing([10.0, 6.0])
        .show(ui, |ui| {
            ui.label("Step");
            changed |= choice(
                ui,
                &mut n.step,
                &[
                    (
                        InferStep::Generate,
                        "generate",
                        "model.generate(): the prefill, then one decode step per new token",
                    ),
                    (
                        InferStep::Prefill,
                        "prefill",
                        "A forward over the prompt under torch.no_grad() (every position's logits)",
                    ),
                ],
            );
            ui.end_row();
            changed |= tokens_drag(
                ui,
                "Batch (sequences)",
                "Sequences generated together",
                &mut n.batch,
                BATCH_LIMIT,
            );
            ui.end_row();
            changed |= tokens_drag(
                ui,
                "Prompt tokens",
                "Tokens of each prompt (--seq)",
                &mut n.prompt,
                MAX_TOKENS,
            );
            ui.end_row();
            if generate {
                changed |= tokens_drag(
                    ui,
                    "New tokens",
                    "max_new_tokens (--new-tokens)",
                    &mut n.new_tokens,
                    MAX_TOKENS,
                );
            } else {
                ui.label("New tokens");
                ui.label("0 (a prefill generates nothing)");
            }
            ui.end_row();
            ui.label("Precision");
            ui.horizontal(|ui| {
                for p in PRECISIONS {
                    if ui
                        .selectable_label(n.precision == p, p)
                        .on_hover_text("The dtype the weights are loaded in (no autocast)")
                        .clicked()
                        && n.precision != p
                    {
                        n.precision = p.to_string();
                        changed = true;
                    }
                }
            });
            ui.end_row();
            ui.label("Attention");
            changed |= choice(
                ui,
                &mut n.attention,
                &[
                    (
                        Attention::Sdpa,
                        "sdpa",
                        "torch scaled_dot_product_attention",
                    ),
                    (
                        Attention::Eager,
                        "eager",
                        "attn_implementation=\"eager\": the score matrix is materialised",
                    ),
                ],
            );
            ui.end_row();
            ui.label("KV cache");
            if generate {
                changed |= choice(
                    ui,
                    &mut n.kv_cache,
                    &[
                        (
                            KvCache::Dynamic,
                            "dynamic",
                            "DynamicCache: grows by torch.cat at every step",
                        ),
                        (
                            KvCache::Static,
                            "static",
                            "StaticCache: preallocated to prompt + new tokens",
                        ),
                    ],
                );
            } else {
                ui.label("dynamic (the forward's own)");
            }
            ui.end_row();
            changed |= weights_row(ui, &mut n);
            let l = ui.label("Offload").on_hover_text(DEVICE_MAP_TIP);
            changed |= ui
                .checkbox(&mut n.device_map, "device_map=\"auto\"")
                .labelled_by(l.id)
                .on_hover_text(DEVICE_MAP_TIP)
                .changed();
            ui.end_row();
            if n.device_map {
                changed |= size_edit(
                    ui,
                    "Max GPU memory",
                    "max_memory[0] (--max-gpu-memory): 10GiB, 500MB, 1.5GB or bytes",
                    &mut n.max_gpu_memory,
                );
                ui.end_row();
                changed |= size_edit(
                    ui,
                    "Max CPU memory",
                    "max_memory[\"cpu\"] (--max-cpu-memory); what exceeds it goes to disk; \
                     empty: no limit",
                    &mut n.max_cpu_memory,
                );
                ui.end_row();
            }
        });
    ui.label(RichText::new(NOT_MODELLED).weak().small());
    if changed {
        emit(cmd, Command::SetInfer(n));
    }
}

/// The longest prompt's row and the sentence saying what limits it: the core's answer
/// (`answer::max_context`), or that it is being searched.
fn longest_prompt_text(
    m: Option<&Result<vramlab_core::answer::max_context::MaxContext, String>>,
) -> (String, Option<String>) {
    match m {
        None => ("searching…".into(), None),
        Some(Err(e)) => (format!("no answer: {e}"), None),
        Some(Ok(m)) => match m.max_length {
            None => ("none: even 1 token does not fit".into(), None),
            Some(l) => (format!("{l} tokens"), m.limit_words()),
        },
    }
}

/// The central panel in Inference mode.
pub fn infer_results_ui(state: &PlannerState, d: &Derived, ui: &mut Ui) {
    let dark = ui.visuals().dark_mode;
    let target = d.target();
    let a = match d.infer.result() {
        Ok(a) => a,
        Err(e) => {
            ui.heading("Inference");
            ui.colored_label(error_color(dark), format!("Cannot plan this call: {e}"));
            ui.label(NOT_MODELLED);
            return;
        }
    };
    let p = &a.plan;
    let model = d
        .preset()
        .map_or(p.model.as_str(), |m| m.display_name.as_str());
    ui.heading(format!("{model} — inference"));
    ui.label(p.config.step.describe());
    ui.add_space(4.0);
    ui.horizontal(|ui| {
        fit_icon(ui, a.fits, 30.0);
        let verdict = if a.fits { "FITS" } else { "DOES NOT FIT" };
        ui.label(
            RichText::new(verdict)
                .size(26.0)
                .strong()
                .color(verdict_color(a.fits, dark)),
        );
        ui.label(RichText::new(format!("on {}", target.gpu.name)).size(16.0));
    });
    ui.label(format!(
        "nvidia-smi {}",
        usage_text(p.nvidia_smi_bytes, a.usable)
    ));
    ui.add_space(4.0);
    let batch_text = match a.max_batch {
        Some(m) => format!("{m} sequences"),
        None => "none: even batch 1 does not fit".into(),
    };
    let tokens = match p.config.step {
        InferStep::Generate => format!(
            "prompt {} + {} new tokens",
            p.config.prompt, p.config.new_tokens
        ),
        InferStep::Prefill => format!("prompt {} tokens", p.config.prompt),
    };
    let longest = longest_prompt_text(d.infer.longest_prompt());
    egui::Grid::new("infer_numbers")
        .num_columns(2)
        .spacing([16.0, 4.0])
        .striped(true)
        .show(ui, |ui| {
            let mut row = |k: &str, v: String| {
                ui.label(k);
                ui.label(v);
                ui.end_row();
            };
            row(
                "Peak allocated",
                format!("{} (at the {})", p.peak_allocated_bytes, p.peak_at),
            );
            row("Peak reserved", p.peak_reserved_bytes.to_string());
            row(
                "nvidia-smi estimate",
                format!(
                    "{} (reserved + {} CUDA context)",
                    p.nvidia_smi_bytes, p.cuda_context_bytes
                ),
            );
            row("KV cache (peak)", p.kv_cache_bytes.to_string());
            match &p.device_map {
                Some(pl) => {
                    row("Weights on GPU 0", p.weights_bytes.to_string());
                    row(
                        "Offloaded weights",
                        format!(
                            "cpu {}, disk {}",
                            Bytes(pl.offload.cpu_bytes),
                            Bytes(pl.offload.disk_bytes)
                        ),
                    );
                    row("device_map", pl.summary());
                }
                None => row(
                    "Weights",
                    match p.quant {
                        Some(q) => format!("{} ({})", p.weights_bytes, quant::describe(q)),
                        None => p.weights_bytes.to_string(),
                    },
                ),
            }
            row(&format!("Largest batch ({tokens})"), batch_text);
            let (what, fixed) = match p.config.step {
                InferStep::Generate => ("prompt", format!(", {} new tokens", p.config.new_tokens)),
                InferStep::Prefill => ("prefill prompt", String::new()),
            };
            row(
                &format!("Longest {what} (batch {}{fixed})", p.config.batch),
                longest.0.clone(),
            );
        });
    if let Some(words) = &longest.1 {
        let what = match p.config.step {
            InferStep::Generate => "prompt",
            InferStep::Prefill => "prefill prompt",
        };
        ui.add(
            egui::Label::new(RichText::new(format!("The longest {what} is {words}.")).small())
                .wrap(),
        );
    }
    if let Some(pl) = &p.device_map {
        egui::CollapsingHeader::new(format!(
            "Device map ({} entries; consecutive layers merged here)",
            pl.device_map.entries.len()
        ))
        .id_salt("infer_device_map")
        .show(ui, |ui| {
            egui::Grid::new("infer_device_map_grid")
                .num_columns(2)
                .striped(true)
                .show(ui, |ui| {
                    for (module, device) in &pl.device_map.runs() {
                        ui.label(if module.is_empty() {
                            "(whole model)"
                        } else {
                            module
                        });
                        ui.label(device.as_str());
                        ui.end_row();
                    }
                });
        });
    }
    ui.add_space(6.0);
    ui.horizontal(|ui| {
        ui.label(RichText::new("Memory over the call").heading())
            .on_hover_text(
                "Allocated and reserved bytes after every allocation and free of the measured \
                 call, over its forwards: 0–1 is the prefill, k–k+1 decode step k.",
            );
    });
    let height = (ui.available_height() - 30.0).clamp(200.0, 420.0);
    trace_plot_ui(a, state.infer.step, ui, height);
}

fn series(trace: &[TracePoint], keep: impl Fn(&TracePoint) -> bool) -> Vec<[f64; 2]> {
    trace
        .iter()
        .filter(|q| keep(q))
        .map(|q| [q.x, q.allocated.as_gib_f64()])
        .collect()
}

/// Allocated (prefill and decode in two colours) and reserved over the call's forwards, with
/// the usable memory and where the decode steps begin.
fn trace_plot_ui(a: &InferAnswer, step: InferStep, ui: &mut Ui, height: f32) -> egui::Rect {
    let prefill = series(&a.trace, |q| q.forward == 0);
    // the decode curve starts where the prefill's ends, so the two stay connected
    let decode: Vec<[f64; 2]> = prefill
        .last()
        .copied()
        .into_iter()
        .chain(series(&a.trace, |q| q.forward > 0))
        .collect();
    let reserved: Vec<[f64; 2]> = a
        .trace
        .iter()
        .map(|q| [q.x, q.reserved.as_gib_f64()])
        .collect();
    let hover_series = [
        Series::new("allocated: prefill", &prefill),
        Series::new("allocated: decode steps", &decode),
        Series::new("reserved", &reserved),
    ];
    let usable = a.usable.as_gib_f64();
    let peak = a.plan.peak_reserved_bytes.as_gib_f64();
    // The weights dwarf the KV cache's growth: the axis starts a little under the lowest
    // point (the label says so) so the prefill spike and the decode growth show.
    let lowest = a
        .trace
        .iter()
        .map(|q| q.allocated.as_gib_f64())
        .fold(peak, f64::min);
    let low = (lowest - (peak - lowest) * 0.3).max(0.0);
    let x_label = match step {
        InferStep::Generate => "forward: 0–1 the prefill, k–k+1 decode step k",
        InferStep::Prefill => "the prefill forward (fraction of its allocations and frees)",
    };
    let resp = Plot::new("infer_trace_plot")
        .height(height)
        .legend(Legend::default())
        .x_axis_label(x_label)
        .y_axis_label(if low > 0.0 {
            "GPU memory (axis not from 0)"
        } else {
            "GPU memory"
        })
        .y_axis_formatter(|m, _| gib_tick(m.value, m.step_size))
        .y_axis_min_width(56.0)
        .include_y(low)
        .include_y(peak + (peak - low) * 0.12)
        .allow_scroll(false)
        .label_formatter(|h| {
            hover::label(
                h,
                &hover_series,
                |x| format!("forward {:.2}", x.max(0.0)),
                |y| gib_to_bytes(y).to_string(),
            )
        })
        .show(ui, |plot_ui| {
            plot_ui.line(
                Line::new("reserved", reserved)
                    .color(style::RESERVED_COLOR)
                    .style(LineStyle::dashed_loose())
                    .width(1.5),
            );
            plot_ui.line(
                Line::new("allocated: prefill", prefill)
                    .color(PREFILL_COLOR)
                    .width(1.8)
                    .fill(0.0)
                    .fill_alpha(0.18),
            );
            if decode.len() > 1 {
                plot_ui.line(
                    Line::new("allocated: decode steps", decode)
                        .color(style::ALLOCATED_COLOR)
                        .width(1.8)
                        .fill(0.0)
                        .fill_alpha(0.18),
                );
                plot_ui.vline(
                    VLine::new("decode begins", 1.0)
                        .color(egui::Color32::GRAY)
                        .style(LineStyle::dashed_dense()),
                );
            }
            if usable <= peak * 1.5 {
                plot_ui.hline(
                    HLine::new(format!("usable {}", a.usable), usable)
                        .color(style::CAPACITY_COLOR)
                        .width(1.5),
                );
            }
        });
    resp.response.rect
}
