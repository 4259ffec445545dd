//! The "Make it fit" section: shown when the plan does not fit (the search's candidates,
//! each with an Apply button), behind a collapsed header when it fits.

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::fit::{FitReport, FitRequest, fit};
use vramlab_core::plan::search::fits;
use vramlab_core::plan::{Planner, TrainConfig};
use vramlab_gui::app::VramApp;
use vramlab_gui::ui::GpuChoice;
use vramlab_gui::ui::fit::changes_text;

fn harness_at(app: VramApp, w: f32, h: f32) -> Harness<'static, VramApp> {
    Harness::builder()
        .with_size(egui::vec2(w, h))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(|ui, app: &mut VramApp| app.ui(ui), app)
}

/// Llama-3-8B, seq 2048, micro-batch 4 × 4, AMP bf16 AdamW on an RTX 4090: does not fit.
pub fn llama3_on_4090_app() -> VramApp {
    let mut app = VramApp::new_for_test(None);
    app.state.preset_id = "Meta-Llama-3-8B".into();
    app.state.gpu = GpuChoice::Catalog("rtx-4090".into());
    app.state.config = TrainConfig {
        batch: 4,
        accum: 4,
        size: Some(2048),
        ..TrainConfig::default()
    };
    app
}

fn core_fit(id: &str, cfg: &TrainConfig) -> FitReport {
    let preset = find_builtin(id).expect("preset");
    let gpu = vramlab_words::find_gpu("rtx-4090").expect("gpu");
    fit(&preset, cfg, &FitRequest::for_gpu(&gpu, 0.05)).expect("fit")
}

fn shows(h: &Harness<'_, VramApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

#[test]
fn make_it_fit_lists_the_candidates_and_apply_sets_the_config() {
    let mut h = harness_at(llama3_on_4090_app(), 1400.0, 2400.0);
    h.run();
    let cfg = h.state().state.config;
    let report = core_fit("Meta-Llama-3-8B", &cfg);
    assert!(!report.candidates.is_empty());
    assert!(shows(&h, "DOES NOT FIT"));
    assert!(shows(&h, "Make it fit"));
    for (i, c) in report.candidates.iter().enumerate() {
        assert!(shows(&h, &format!("Apply #{}", i + 1)));
        assert!(shows(&h, &changes_text(c)), "{}", c.summary());
    }
    let pick = &report.candidates[0];
    h.get_by_label("Apply #1").click();
    h.run();
    let applied = h.state().state.config;
    assert_eq!(applied, pick.config);
    assert_ne!(applied, cfg);
    assert_eq!(applied.effective_batch(), cfg.effective_batch());
    // The applied configuration fits: the verdict turns, and the core agrees.
    assert!(shows(&h, "FITS"));
    let preset = find_builtin("Meta-Llama-3-8B").expect("preset");
    let planner = Planner::new(&preset, &applied).expect("planner");
    let budget =
        FitRequest::for_gpu(&vramlab_words::find_gpu("rtx-4090").expect("gpu"), 0.05).budget;
    assert!(fits(&planner, budget, applied.batch).expect("fits"));
}

#[test]
fn make_it_fit_is_behind_a_header_when_the_plan_fits() {
    let mut h = harness_at(VramApp::new_for_test(None), 1400.0, 2400.0);
    h.run();
    assert!(shows(&h, "FITS"));
    assert!(!shows(&h, "Search combinations"));
    h.get_by_label("Make it fit").click();
    h.run();
    h.get_by_label("Search combinations").click();
    h.run();
    // The user's configuration fits and comes first, marked as such.
    assert!(
        shows(&h, "your configuration as it is"),
        "user config first"
    );
    assert!(shows(&h, "Apply #1"));
}

#[test]
fn make_it_fit_draws_at_small_and_large_windows() {
    for (w, hh) in [(1000.0, 650.0), (1920.0, 1080.0)] {
        let mut h = harness_at(llama3_on_4090_app(), w, hh);
        h.run();
        assert!(shows(&h, "Make it fit"), "{w}x{hh}");
        assert!(shows(&h, "Apply #1"), "{w}x{hh}");
    }
}

#[test]
fn snapshot_make_it_fit() {
    let mut h = harness_at(llama3_on_4090_app(), 1400.0, 1900.0);
    h.run();
    h.remove_cursor();
    h.run();
    h.snapshot("fit");
}

/// Off the UI thread: one search at a time, and the answer is for the latest configuration.
#[test]
fn the_background_search_answers_for_the_latest_configuration() {
    use vramlab_gui::ui::fit_search::FitSearch;
    let preset = find_builtin("gpt2").expect("preset");
    let gpu = vramlab_words::find_gpu("rtx-4090").expect("gpu");
    let req = FitRequest::for_gpu(&gpu, 0.05);
    let mut s = FitSearch::default();
    let mut cfg = TrainConfig {
        batch: 64,
        size: Some(1024),
        ..TrainConfig::default()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    for batch in [64, 48, 32] {
        cfg.batch = batch;
        s.ensure(&preset, &cfg, req.budget, &gpu.id, || req.clone());
    }
    let r = loop {
        s.ensure(&preset, &cfg, req.budget, &gpu.id, || req.clone());
        if let Some(r) = s.result() {
            break r.clone();
        }
        assert!(std::time::Instant::now() < deadline, "no answer");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let (report, _) = r.expect("search");
    assert!(!s.running());
    let want = fit(&preset, &cfg, &req).expect("fit");
    assert_eq!(report.effective_batch, 32);
    assert_eq!(report.candidates.len(), want.candidates.len());
    for (a, b) in report.candidates.iter().zip(&want.candidates) {
        assert_eq!(a.config, b.config);
    }
}
