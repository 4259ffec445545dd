//! The GUI follows the current plan and the data (issue 27): the "does not fit" notice
//! after Apply, the Run tab's batch list, plot hover values, the config.json button and
//! a run whose probe OOM is far off the scale. Each at a small and a large window where
//! the layout matters.

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use vramlab_core::export::results::run_from_json;
use vramlab_core::plan::TrainConfig;
use vramlab_gui::app::{Tab, VramApp};
use vramlab_gui::ui::Command;
use vramlab_gui::ui::png::{PlotId, plot_rect};
use vramlab_gui::ui::run::{NOTHING_FITS, proposed_batches};
use vramlab_gui::ui::style::gib_to_bytes;

const SMALL: (f32, f32) = (1000.0, 650.0);
const LARGE: (f32, f32) = (1920.0, 1080.0);
const NOTICE: &str = "even at batch 1";

fn harness_at(app: VramApp, (w, h): (f32, f32)) -> Harness<'static, VramApp> {
    Harness::builder()
        .with_size(egui::vec2(w, h))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(|ui, app: &mut VramApp| app.ui(ui), app)
}

fn shows(h: &Harness<'_, VramApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

fn open_tab(h: &mut Harness<'_, VramApp>, tab: Tab) {
    h.get_by_label(tab.label()).click();
    h.run();
    assert_eq!(h.state().tab(), tab);
}

fn select_preset(h: &mut Harness<'_, VramApp>, search: &str, display_name: &str) {
    h.get_by_label("Search").click();
    h.run();
    h.get_by_label("Search").type_text(search);
    h.run();
    h.get_by_label(display_name).click_accesskit();
    h.run();
}

fn predicted_max(h: &Harness<'_, VramApp>) -> Option<u64> {
    h.state()
        .derived()
        .max_batch()
        .and_then(|m| m.as_ref().ok().copied().flatten())
}

/// Llama 3 8B on the RTX 4090 (no GPU detected): batch 1 to the notice "… does not fit
/// … even at batch 1", shown on the Planner and the Run tab.
fn llama3_does_not_fit(size: (f32, f32)) -> Harness<'static, VramApp> {
    does_not_fit(size, "llama-3-8b", "Llama 3 8B")
}

fn does_not_fit(size: (f32, f32), search: &str, name: &str) -> Harness<'static, VramApp> {
    let mut h = harness_at(VramApp::new_for_test(None), size);
    h.run();
    select_preset(&mut h, search, name);
    assert!(shows(&h, "DOES NOT FIT"));
    assert!(shows(&h, NOTICE), "the notice after the model switch");
    open_tab(&mut h, Tab::Run);
    assert!(shows(&h, NOTICE), "the Run tab shows it too");
    open_tab(&mut h, Tab::Planner);
    h
}

fn assert_notice_gone(h: &mut Harness<'_, VramApp>, size: (f32, f32)) {
    assert!(shows(h, "FITS"), "{size:?}: the applied plan fits");
    assert!(!shows(h, "DOES NOT FIT"), "{size:?}");
    assert!(
        !shows(h, NOTICE),
        "{size:?}: stale notice on the Planner tab"
    );
    assert!(h.state().message().is_none(), "{size:?}");
    open_tab(h, Tab::Run);
    assert!(!shows(h, NOTICE), "{size:?}: stale notice on the Run tab");
    open_tab(h, Tab::Planner);
}

#[test]
fn applying_a_fit_answer_drops_the_does_not_fit_notice() {
    for size in [SMALL, LARGE] {
        let mut h = llama3_does_not_fit(size);
        h.get_by_label("Apply #1").click_accesskit();
        h.run();
        assert_notice_gone(&mut h, size);
    }
}

#[test]
fn applying_a_remedy_drops_the_does_not_fit_notice() {
    for size in [SMALL, LARGE] {
        // GPT-2 XL with AdamW: a single remedy (8-bit Adam, …) makes it fit.
        let mut h = does_not_fit(size, "gpt2-xl", "GPT-2 XL");
        let fitting = h
            .state()
            .derived()
            .answer()
            .and_then(|a| a.report.remedies.as_ref().ok())
            .and_then(|list| {
                list.iter().find_map(|r| match (r.fits, r.fits_up_to) {
                    (true, _) => Some(r.config),
                    (false, Some(b)) => Some(TrainConfig {
                        batch: b,
                        ..r.config
                    }),
                    (false, None) => None,
                })
            })
            .expect("a remedy that fits GPT-2 XL on a 4090");
        let ctx = h.ctx.clone();
        h.state_mut().apply(Command::ApplyRemedy(fitting), &ctx);
        h.run();
        assert_notice_gone(&mut h, size);
    }
}

#[test]
fn a_notice_that_still_holds_stays() {
    let mut h = llama3_does_not_fit(LARGE);
    // Another tab, the search field: the plan is the same, so is the notice.
    open_tab(&mut h, Tab::Monitor);
    open_tab(&mut h, Tab::Planner);
    h.get_by_label("Search").type_text("x");
    h.run();
    assert!(shows(&h, NOTICE));
}

#[test]
fn the_run_batch_list_follows_the_plan_unless_typed() {
    for size in [SMALL, LARGE] {
        let mut h = harness_at(VramApp::new_for_test(None), size);
        h.run();
        let max = predicted_max(&h).expect("GPT-2 fits a 4090");
        open_tab(&mut h, Tab::Run);
        let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let proposal = proposed_batches(Some(max));
        assert!(proposal.iter().all(|&b| b <= max), "{proposal:?} vs {max}");
        assert_eq!(proposal.last(), Some(&max));
        assert_eq!(
            h.get_by_label("Batch list").value().as_deref(),
            Some(list(&proposal).as_str()),
            "{size:?}"
        );

        // Nothing fits: no batch proposed, and Start waits for typed batches.
        open_tab(&mut h, Tab::Planner);
        select_preset(&mut h, "llama-3-8b", "Llama 3 8B");
        assert_eq!(predicted_max(&h), None);
        open_tab(&mut h, Tab::Run);
        assert_eq!(h.get_by_label("Batch list").value().as_deref(), Some(""));
        assert!(shows(&h, NOTHING_FITS), "{size:?}");

        // A fit answer applied: the list follows its max batch.
        open_tab(&mut h, Tab::Planner);
        h.get_by_label("Apply #1").click_accesskit();
        h.run();
        let max = predicted_max(&h).expect("the fit answer fits");
        open_tab(&mut h, Tab::Run);
        let proposal = list(&proposed_batches(Some(max)));
        assert_eq!(
            h.get_by_label("Batch list").value().as_deref(),
            Some(proposal.as_str())
        );
        assert!(
            !shows(&h, "4,8,16") || max == 16,
            "{size:?}: no fixed default"
        );

        // Typed batches are the user's: kept across plans, with a note and a way back.
        h.get_by_label("Batch list").focus();
        h.get_by_label("Batch list").type_text(",4096");
        h.run();
        assert!(h.state().state.run.batches_typed);
        assert!(shows(
            &h,
            "Typed batches the plan expects to run out of memory"
        ));
        assert!(shows(&h, "4096"));
        h.get_by_label("Use the plan's batches").click_accesskit();
        h.run();
        assert!(!h.state().state.run.batches_typed);
        assert_eq!(
            h.get_by_label("Batch list").value().as_deref(),
            Some(proposal.as_str())
        );
    }
}

/// Every text painted in the last frame (tooltips are painted, not in the AccessKit tree).
fn painted_texts(h: &Harness<'_, VramApp>) -> Vec<String> {
    fn walk(shape: &egui::Shape, out: &mut Vec<String>) {
        match shape {
            egui::Shape::Text(t) => out.push(t.galley.text().to_string()),
            egui::Shape::Vec(v) => v.iter().for_each(|s| walk(s, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for clipped in &h.output().shapes {
        walk(&clipped.shape, &mut out);
    }
    out
}

#[test]
fn plot_hover_shows_the_curves_values_not_the_pointer() {
    for size in [(1400.0, 900.0), LARGE] {
        let mut h = harness_at(VramApp::new_for_test(None), size);
        h.run();
        let rect = plot_rect(&h.ctx, PlotId::PlannerBatch).expect("the batch plot");
        // Lower right: far from every curve (memory grows with the batch).
        h.hover_at(rect.lerp_inside(egui::vec2(0.9, 0.7)));
        h.run();
        // The tooltip is shown from the frame after the plot saw the pointer.
        h.step();
        let label = painted_texts(&h)
            .into_iter()
            .find(|t| t.starts_with("batch ") && t.contains("nvidia-smi: "))
            .unwrap_or_else(|| panic!("{size:?}: no hover label with the curves' values"));
        let sweep = h.state().derived().sweep();
        let hit = sweep.iter().find(|p| {
            label.starts_with(&format!("batch {}\n", p.batch))
                && label.contains(&format!(
                    "nvidia-smi: {}",
                    gib_to_bytes(p.nvidia_smi.as_gib_f64())
                ))
                && label.contains(&format!(
                    "reserved: {}",
                    gib_to_bytes(p.reserved.as_gib_f64())
                ))
        });
        assert!(hit.is_some(), "{size:?}: {label:?} is not a sweep point");
    }
}

#[test]
fn open_config_json_is_a_labelled_button_at_every_size() {
    const CONFIGS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/hf_configs");
    for size in [SMALL, LARGE] {
        let path = std::path::PathBuf::from(format!("{CONFIGS}/Qwen3-0.6B.json"));
        let mut app = VramApp::new_for_test(None);
        app.set_dialogs(Box::new(|_| None), Box::new(move || Some(path.clone())));
        let mut h = harness_at(app, size);
        h.run();
        let button = h.get_by_label("Open config.json…");
        let r = button.rect();
        assert!(
            r.min.x >= 0.0 && r.max.x <= size.0 && r.min.y >= 0.0 && r.max.y <= size.1,
            "{size:?}: the button is on screen ({r:?})"
        );
        button.click();
        h.run();
        assert!(shows(&h, "Opened "), "{size:?}");
        let custom = h.state().state.custom.as_ref().expect("custom model");
        assert_eq!(custom["params"]["model_type"].as_str(), Some("qwen3"));
    }
    // Without a file dialog it asks for the path.
    let mut h = harness_at(VramApp::new_for_test(None), LARGE);
    h.run();
    h.get_by_label("Open config.json…").click();
    h.run();
    assert!(shows(&h, "Open a Hugging Face config.json by path"));
}

#[test]
fn a_probe_oom_far_off_the_scale_does_not_stretch_the_run_plot() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/bench/gpt2-torch-primed.json"
    );
    let run = run_from_json(&std::fs::read(path).expect("recorded run")).expect("run");
    for size in [SMALL, LARGE] {
        let mut app = VramApp::new_for_test(None);
        app.state.preset_id = run.model.clone();
        app.state.config = run.config;
        let mut h = harness_at(app, size);
        h.run();
        h.state_mut()
            .show_run(run.clone(), "gpt2-torch-primed.json");
        open_tab(&mut h, Tab::Run);
        h.run();
        let shown = h.state().runs().shown().expect("shown");
        let probe = shown
            .run
            .trials
            .iter()
            .find(|t| t.batch == 100_000)
            .expect("probe");
        assert!(shown.off_scale(probe));
        assert!(shown.batch_top() < 200, "{}", shown.batch_top());
        let capacity = shown.run.device.total_bytes;
        let curve = shown.curve().expect("the predicted curve");
        assert!(
            curve.points.iter().all(|p| p.nvidia_smi.0 < 2 * capacity.0),
            "the predicted curve stays near the device's size"
        );
        assert!(
            shows(&h, "out of memory at batch 100000 (off the scale)"),
            "{size:?}: the OOM is marked"
        );
        if size == LARGE {
            h.remove_cursor();
            h.run();
            h.snapshot("run-offscale-oom");
        }
    }
}
