//! Saving a plot as PNG: each plot remembers its screen rectangle (egui temp data), the
//! app asks the integration for a screenshot of the next frame, crops it to the plot and
//! encodes it ([`crop_to_png`], pure, tested headless).

use egui::{ColorImage, Rect};

/// Plots that can be saved as PNG.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlotId {
    PlannerBatch,
    PlannerTimeline,
    RunBatch,
    RunTimeline,
    Monitor,
}

impl PlotId {
    /// The suggested file name.
    pub fn file_name(self) -> &'static str {
        match self {
            PlotId::PlannerBatch => "memory-vs-batch.png",
            PlotId::PlannerTimeline => "step-timeline.png",
            PlotId::RunBatch => "run-measured-vs-predicted.png",
            PlotId::RunTimeline => "run-trial-timeline.png",
            PlotId::Monitor => "gpu-monitor.png",
        }
    }

    fn key(self) -> egui::Id {
        egui::Id::unique(("vramlab_plot_rect", self))
    }
}

/// Records where `id` was drawn this frame (with a margin for its axis labels).
pub fn remember_rect(ctx: &egui::Context, id: PlotId, rect: Rect) {
    ctx.data_mut(|d| d.insert_temp(id.key(), rect.expand(2.0)));
}

/// Where `id` was drawn last.
pub fn plot_rect(ctx: &egui::Context, id: PlotId) -> Option<Rect> {
    ctx.data(|d| d.get_temp(id.key()))
}

/// A small "PNG…" button; true when clicked.
pub fn save_button(ui: &mut egui::Ui) -> bool {
    ui.small_button("Save PNG…")
        .on_hover_text("Save this plot as a PNG image")
        .clicked()
}

/// Why a plot image could not be made.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PngError {
    #[error("the plot is outside the screenshot ({0})")]
    OutOfBounds(String),
    #[error("PNG encoding failed: {0}")]
    Encode(String),
}

/// Crops `image` (a screenshot, physical pixels) to `rect` (points, scaled by
/// `pixels_per_point`), clamped to the image, and encodes it as PNG (RGBA, 8 bit).
pub fn crop_to_png(
    image: &ColorImage,
    rect: Rect,
    pixels_per_point: f32,
) -> Result<Vec<u8>, PngError> {
    let [w, h] = image.size;
    let px = |v: f32, max: usize| ((v * pixels_per_point).round().max(0.0) as usize).min(max);
    let (x0, x1) = (px(rect.min.x, w), px(rect.max.x, w));
    let (y0, y1) = (px(rect.min.y, h), px(rect.max.y, h));
    if x1 <= x0 || y1 <= y0 {
        return Err(PngError::OutOfBounds(format!(
            "rect {rect:?} at {pixels_per_point} px/pt in a {w}×{h} image"
        )));
    }
    let (cw, ch) = (x1 - x0, y1 - y0);
    let mut rgba = Vec::with_capacity(cw * ch * 4);
    for y in y0..y1 {
        for p in &image.pixels[y * w + x0..y * w + x1] {
            let [r, g, b, a] = p.to_srgba_unmultiplied();
            rgba.extend_from_slice(&[r, g, b, a]);
        }
    }
    encode_rgba(&rgba, cw as u32, ch as u32)
}

fn encode_rgba(rgba: &[u8], width: u32, height: u32) -> Result<Vec<u8>, PngError> {
    let err = |e: png::EncodingError| PngError::Encode(e.to_string());
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, width, height);
        enc.set_color(png::ColorType::Rgba);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(err)?;
        writer.write_image_data(rgba).map_err(err)?;
        writer.finish().map_err(err)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use egui::{Color32, pos2};

    #[test]
    fn crops_and_encodes_the_plot_pixels() {
        // 40×20 px image at 2 px/pt: left half red, right half blue.
        let mut img = ColorImage::filled([40, 20], Color32::RED);
        for y in 0..20 {
            for x in 20..40 {
                img.pixels[y * 40 + x] = Color32::BLUE;
            }
        }
        // Points 10..20 × 0..10 → pixels 20..40 × 0..20: all blue.
        let bytes = crop_to_png(
            &img,
            Rect::from_min_max(pos2(10.0, 0.0), pos2(20.0, 10.0)),
            2.0,
        )
        .expect("png");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().expect("header");
        let mut buf = vec![0; reader.output_buffer_size().expect("size")];
        let info = reader.next_frame(&mut buf).expect("frame");
        assert_eq!((info.width, info.height), (20, 20));
        assert_eq!(&buf[..4], &[0, 0, 255, 255]);
        assert!(
            buf[..info.buffer_size()]
                .chunks(4)
                .all(|p| p == [0, 0, 255, 255])
        );
    }

    #[test]
    fn clamps_to_the_image_and_rejects_empty_crops() {
        let img = ColorImage::filled([10, 10], Color32::WHITE);
        let big = Rect::from_min_max(pos2(-5.0, -5.0), pos2(50.0, 50.0));
        assert!(crop_to_png(&img, big, 1.0).is_ok());
        let outside = Rect::from_min_max(pos2(20.0, 20.0), pos2(30.0, 30.0));
        assert!(matches!(
            crop_to_png(&img, outside, 1.0),
            Err(PngError::OutOfBounds(_))
        ));
    }
}
