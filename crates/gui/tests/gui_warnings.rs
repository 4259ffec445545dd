//! The plan report's warnings in the answer panel: bf16 on a pre-Ampere card is warned
//! about in the GUI as in `vramlab plan` (the same words, from the core).

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use vramlab_core::answer::warnings;
use vramlab_core::plan::{Precision, TrainConfig};
use vramlab_gui::app::VramApp;
use vramlab_gui::ui::GpuChoice;

fn harness(gpu: &str, precision: Precision) -> Harness<'static, VramApp> {
    let mut app = VramApp::new_for_test(None);
    app.state.preset_id = "resnet18".into();
    app.state.gpu = GpuChoice::Catalog(gpu.into());
    app.state.config = TrainConfig {
        batch: 32,
        precision,
        ..TrainConfig::default()
    };
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(|ui, app: &mut VramApp| app.ui(ui), app)
}

fn shows(h: &Harness<'_, VramApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

#[test]
fn bf16_on_a_t4_is_warned_about_with_the_cores_words() {
    let mut h = harness("t4", Precision::AmpBf16);
    h.run();
    let t4 = vramlab_words::find_gpu("t4").expect("t4");
    let expected = warnings::for_config(&h.state().state.config, &t4);
    assert_eq!(expected.len(), 1, "{expected:?}");
    assert!(shows(&h, &expected[0]), "the GUI shows {:?}", expected[0]);
    let report = &h.state().derived().answer().expect("an answer").report;
    assert_eq!(report.warnings, expected);
}

#[test]
fn no_warning_for_fp16_on_a_t4_nor_bf16_on_an_ampere_card() {
    for (gpu, precision) in [("t4", Precision::AmpFp16), ("a10", Precision::AmpBf16)] {
        let mut h = harness(gpu, precision);
        h.run();
        assert!(h.state().derived().answer().is_some(), "{gpu}: an answer");
        assert!(!shows(&h, "no bf16 tensor cores"), "{gpu} {precision:?}");
    }
}
