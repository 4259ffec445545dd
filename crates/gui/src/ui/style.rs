//! Colours, text sizes and number formatting shared by the panels.

use egui::{Color32, FontId, TextStyle};

use vramlab_core::plan::Phase;
use vramlab_core::units::{Bytes, GIB};

/// Larger text than egui's defaults: the numbers are the product.
pub fn apply(ctx: &egui::Context) {
    ctx.all_styles_mut(|style| {
        let sizes = [
            (TextStyle::Small, 11.5),
            (TextStyle::Body, 14.0),
            (TextStyle::Button, 14.0),
            (TextStyle::Monospace, 13.5),
            (TextStyle::Heading, 19.0),
        ];
        for (ts, size) in sizes {
            let family = style
                .text_styles
                .get(&ts)
                .map(|f| f.family.clone())
                .unwrap_or_default();
            style.text_styles.insert(ts, FontId::new(size, family));
        }
        style.spacing.item_spacing = egui::vec2(8.0, 5.0);
        style.spacing.interact_size.y = 22.0;
    });
}

/// Green for "fits", red for "does not fit", readable on both themes.
pub fn verdict_color(fits: bool, dark: bool) -> Color32 {
    match (fits, dark) {
        (true, true) => Color32::from_rgb(96, 208, 120),
        (true, false) => Color32::from_rgb(18, 128, 48),
        (false, true) => Color32::from_rgb(255, 110, 100),
        (false, false) => Color32::from_rgb(196, 32, 32),
    }
}

pub fn error_color(dark: bool) -> Color32 {
    verdict_color(false, dark)
}

/// Colour of a breakdown category (keys as in `Plan::breakdown`).
pub fn category_color(key: &str) -> Color32 {
    match key {
        "parameters" => Color32::from_rgb(66, 133, 244),
        "gradients" => Color32::from_rgb(245, 145, 45),
        "optimizer_state" => Color32::from_rgb(160, 105, 230),
        "weight_casts" => Color32::from_rgb(0, 176, 176),
        "activations" => Color32::from_rgb(76, 186, 84),
        "transient" => Color32::from_rgb(226, 196, 40),
        "allocator_overhead" => Color32::from_rgb(150, 150, 150),
        "cuda_context" => Color32::from_rgb(205, 92, 92),
        "unsharded" => Color32::from_rgb(120, 200, 230),
        "communication" => Color32::from_rgb(230, 120, 180),
        _ => Color32::from_rgb(120, 120, 200),
    }
}

pub fn phase_color(phase: Phase) -> Color32 {
    match phase {
        Phase::Setup | Phase::ZeroGrad => Color32::from_rgb(150, 150, 150),
        Phase::Forward => Color32::from_rgb(66, 133, 244),
        Phase::Backward => Color32::from_rgb(245, 145, 45),
        Phase::Optimizer => Color32::from_rgb(160, 105, 230),
    }
}

/// Colours of the three memory curves.
pub const ALLOCATED_COLOR: Color32 = Color32::from_rgb(76, 186, 84);
pub const RESERVED_COLOR: Color32 = Color32::from_rgb(66, 133, 244);
pub const SMI_COLOR: Color32 = Color32::from_rgb(235, 100, 60);
pub const CAPACITY_COLOR: Color32 = Color32::from_rgb(205, 60, 60);

/// `part / whole` in percent (0 when `whole` is 0).
pub fn pct(part: Bytes, whole: Bytes) -> f64 {
    if whole.0 == 0 {
        0.0
    } else {
        100.0 * part.0 as f64 / whole.0 as f64
    }
}

/// A plot coordinate in GiB back to bytes, for hover labels.
pub fn gib_to_bytes(gib: f64) -> Bytes {
    if gib.is_finite() && gib > 0.0 {
        Bytes((gib * GIB as f64) as u64)
    } else {
        Bytes::ZERO
    }
}

/// "1.50 GiB" for a tick value in GiB, with as many decimals as the tick step needs.
pub fn gib_tick(value: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else if step >= 0.1 {
        1
    } else {
        2
    };
    format!("{value:.decimals$} GiB")
}

/// A signed byte difference: "saves 3.20 GiB" / "costs 120.00 MiB".
pub fn saving_text(saving: i64) -> String {
    let b = Bytes(saving.unsigned_abs());
    if saving > 0 {
        format!("−{b}")
    } else if saving < 0 {
        format!("+{b}")
    } else {
        "±0".to_string()
    }
}

/// "6.74 B" / "124.4 M" parameters.
pub fn param_count(n: u64) -> String {
    let f = n as f64;
    if f >= 1e9 {
        format!("{:.2} B", f / 1e9)
    } else if f >= 1e6 {
        format!("{:.1} M", f / 1e6)
    } else if f >= 1e3 {
        format!("{:.1} k", f / 1e3)
    } else {
        n.to_string()
    }
}

/// A painted check mark (fits) or cross (does not fit); the default fonts have neither
/// glyph. Accessible as "fits" / "does not fit".
pub fn fit_icon(ui: &mut egui::Ui, fits: bool, size: f32) -> egui::Response {
    let color = verdict_color(fits, ui.visuals().dark_mode);
    let (rect, resp) = ui.allocate_exact_size(egui::vec2(size, size), egui::Sense::hover());
    let stroke = egui::Stroke::new((size * 0.14).max(2.0), color);
    let at = |x: f32, y: f32| rect.min + egui::vec2(x * rect.width(), y * rect.height());
    let p = ui.painter();
    if fits {
        p.line_segment([at(0.12, 0.55), at(0.40, 0.82)], stroke);
        p.line_segment([at(0.40, 0.82), at(0.90, 0.18)], stroke);
    } else {
        p.line_segment([at(0.18, 0.18), at(0.82, 0.82)], stroke);
        p.line_segment([at(0.82, 0.18), at(0.18, 0.82)], stroke);
    }
    let label = if fits { "fits" } else { "does not fit" };
    resp.widget_info(|| egui::WidgetInfo::labeled(egui::Role::Label, true, label));
    resp
}

/// A small filled square in `color` (legend and table swatches).
pub fn swatch(ui: &mut egui::Ui, color: Color32) {
    let (rect, _) = ui.allocate_exact_size(egui::vec2(11.0, 11.0), egui::Sense::hover());
    ui.painter().rect_filled(rect, 2.0, color);
}
