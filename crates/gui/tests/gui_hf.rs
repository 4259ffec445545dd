//! GUI import of Hugging Face `config.json` files (open, drop, paste; errors shown) and the
//! training-loop choice, through egui_kittest.

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use vramlab_core::plan::config::LoopShape;
use vramlab_core::plan::finetune::{FineTuneMode, LoraTargets};
use vramlab_gui::app::VramApp;

const CONFIGS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/hf_configs");

fn harness(app: VramApp) -> Harness<'static, VramApp> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .with_max_steps(16)
        .build_ui_state(|ui, app: &mut VramApp| app.ui(ui), app)
}

fn assert_shows(h: &Harness<'_, VramApp>, text: &str) {
    assert!(
        h.query_all_by_label_contains(text).next().is_some(),
        "expected a widget showing {text:?}"
    );
}

fn custom_model_type(h: &Harness<'_, VramApp>) -> Option<String> {
    let custom = h.state().state.custom.as_ref()?;
    custom["params"]["model_type"].as_str().map(str::to_string)
}

/// A fresh app whose file dialog answers `path`, after a click on "Open preset…".
fn open_via_dialog(path: std::path::PathBuf) -> Harness<'static, VramApp> {
    let mut app = VramApp::new_for_test(None);
    app.set_dialogs(Box::new(|_| None), Box::new(move || Some(path.clone())));
    let mut h = harness(app);
    h.run();
    h.get_by_label("Open preset…").click();
    h.run();
    h
}

#[derive(Debug)]
struct Dropped(std::path::PathBuf);

impl egui::DroppedFile for Dropped {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

#[test]
fn open_preset_imports_a_config_json() {
    let h = open_via_dialog(format!("{CONFIGS}/Qwen3-0.6B.json").into());
    assert_shows(&h, "Opened ");
    assert_eq!(custom_model_type(&h).as_deref(), Some("qwen3"));
}

#[test]
fn dropping_a_config_json_imports_it_and_a_bad_one_shows_the_key() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    let good = std::path::PathBuf::from(format!("{CONFIGS}/gemma-2-2b.json"));
    h.input_mut()
        .dropped_files
        .push(std::sync::Arc::new(Dropped(good)));
    h.run();
    assert_shows(&h, "Imported ");
    assert_eq!(custom_model_type(&h).as_deref(), Some("gemma2"));

    let dir = std::env::temp_dir().join(format!("vramlab-gui-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let bad = dir.join("config.json");
    std::fs::write(&bad, r#"{"model_type": "llama", "hidden_size": 64}"#).expect("write");
    h.input_mut()
        .dropped_files
        .push(std::sync::Arc::new(Dropped(bad)));
    h.run();
    assert_shows(&h, "Could not import");
    assert_shows(&h, "vocab_size");
    // The error changes nothing: the imported Gemma 2 stays.
    assert_eq!(custom_model_type(&h).as_deref(), Some("gemma2"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn pasting_config_json_text_imports_it() {
    let text =
        std::fs::read_to_string(format!("{CONFIGS}/Phi-3-mini-4k-instruct.json")).expect("config");
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    h.input_mut().events.push(egui::Event::Paste(text));
    h.run();
    assert_shows(&h, "Imported pasted config.json");
    assert_eq!(custom_model_type(&h).as_deref(), Some("phi3"));
    h.input_mut()
        .events
        .push(egui::Event::Paste(r#"{"model_type": "mamba2"}"#.into()));
    h.run();
    assert_shows(&h, "closest is");
    // Text that is not a config.json is not an import.
    h.input_mut()
        .events
        .push(egui::Event::Paste("hello".into()));
    h.run();
    assert_eq!(custom_model_type(&h).as_deref(), Some("phi3"));
}

#[test]
fn the_loop_choice_changes_the_plan() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    assert_eq!(h.state().state.config.loop_shape, LoopShape::Plain);
    h.get_by_label("trainer").click();
    h.run();
    assert_eq!(h.state().state.config.loop_shape, LoopShape::Trainer);
}

/// The fine-tuning choice: LoRA shows its rank and targets, and the plan follows it.
#[test]
fn the_finetune_choice_plans_lora() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    assert_eq!(h.state().state.config.finetune.mode, FineTuneMode::Full);
    assert!(h.query_by_label("all-linear").is_none());
    h.get_by_label("lora").click();
    h.run();
    assert_eq!(h.state().state.config.finetune.mode, FineTuneMode::Lora);
    h.get_by_label("all-linear").click();
    h.run();
    assert_eq!(
        h.state().state.config.finetune.lora_targets,
        LoraTargets::AllLinear
    );
    // The dropout field next to the rank: typed, it reaches the plan's config.
    assert!(h.state().state.config.finetune.lora_dropout.is_zero());
    h.get_by_label("dropout").focus();
    h.run();
    h.get_by_label("dropout").type_text("0.05");
    h.key_press(egui::Key::Enter);
    h.run();
    assert_eq!(
        h.state().state.config.finetune.lora_dropout,
        vramlab_words::parse("0.05").expect("p")
    );
}

/// An imported T5 shows a "Target length" field (typed, it reaches the config); an imported
/// MoE config shows "MoE imbalance"; a dense decoder shows neither, and a target length set
/// for T5 does not carry over to it (it would not validate).
#[test]
fn t5_and_moe_imports_show_their_own_fields() {
    let open = |name: &str| {
        open_via_dialog(
            format!(
                "{}/../../tests/data/hf_configs_device/{name}",
                env!("CARGO_MANIFEST_DIR")
            )
            .into(),
        )
    };
    let mut h = open("t5-small.json");
    let custom = h.state().state.custom.clone().expect("imported");
    assert_eq!(custom["family"], "t5", "{custom}");
    assert!(h.query_by_label("MoE imbalance").is_none());
    h.get_by_label("Target length").focus();
    h.run();
    h.get_by_label("Target length").type_text("64");
    h.key_press(egui::Key::Enter);
    h.run();
    assert_eq!(h.state().state.config.target_seq, Some(64));
    assert_shows(&h, "FITS");
    // The status line names the opened file's absolute path (machine-specific): dismissed
    // before the snapshot.
    h.get_by_label("dismiss").click();
    h.run();
    h.remove_cursor();
    h.run();
    h.snapshot("t5-import");

    let h = open("Qwen3-30B-A3B-L2.json");
    assert_eq!(custom_model_type(&h).as_deref(), Some("qwen3_moe"));
    assert!(h.query_by_label("MoE imbalance").is_some());
    assert!(h.query_by_label("Target length").is_none());
}

/// Partial full fine-tuning: "Freeze embeddings" and "Freeze first N blocks" show for full
/// fine-tuning only, reach the config, lower the plan's trainable count, stay bounded by the
/// model's block count, and a count the next model does not have shows the planner's error.
#[test]
fn the_freeze_controls_plan_a_partial_full_finetune() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    let trainable = |h: &Harness<'_, VramApp>| {
        h.state()
            .derived()
            .planner()
            .map(|p| p.trainable)
            .expect("a plan")
    };
    let all = trainable(&h);
    h.get_by_label("Freeze embeddings").click();
    h.run();
    assert!(h.state().state.config.finetune.freeze_embeddings);
    let no_embeddings = trainable(&h);
    assert!(no_embeddings < all, "{no_embeddings} < {all}");

    h.get_by_label("Freeze first N blocks").focus();
    h.run();
    h.get_by_label("Freeze first N blocks").type_text("6");
    h.key_press(egui::Key::Enter);
    h.run();
    assert_eq!(h.state().state.config.finetune.freeze_blocks, 6);
    let half = trainable(&h);
    assert!(half < no_embeddings, "{half} < {no_embeddings}");
    assert_shows(&h, "of 12");

    // Typed past GPT-2's 12 blocks: the field holds 12.
    h.get_by_label("Freeze first N blocks").focus();
    h.run();
    h.get_by_label("Freeze first N blocks").type_text("99");
    h.key_press(egui::Key::Enter);
    h.run();
    assert_eq!(h.state().state.config.finetune.freeze_blocks, 12);

    // LoRA freezes the whole base: the controls go, and the partial freeze is dropped.
    h.get_by_label("lora").click();
    h.run();
    assert!(h.query_by_label("Freeze embeddings").is_none());
    assert!(h.query_by_label("Freeze first N blocks").is_none());
    let ft = h.state().state.config.finetune;
    assert!(!ft.freeze_embeddings && ft.freeze_blocks == 0, "{ft:?}");
    h.get_by_label("full").click();
    h.run();
    assert!(h.query_by_label("Freeze embeddings").is_some());
}

/// A block count the model does not have (set for a deeper model) is refused by the planner,
/// and the error naming `freeze_blocks` shows under the field.
#[test]
fn a_freeze_count_past_the_model_shows_the_error() {
    let mut app = VramApp::new_for_test(None);
    app.state.preset_id = "gpt2-large".into();
    app.state.config.finetune.freeze_blocks = 30;
    let mut h = harness(app);
    h.run();
    assert!(h.state().derived().planner().is_some());
    let ctx = h.ctx.clone();
    h.state_mut()
        .apply(vramlab_gui::ui::Command::SelectPreset("gpt2".into()), &ctx);
    h.run();
    assert_eq!(h.state().state.config.finetune.freeze_blocks, 30);
    assert_shows(&h, "freeze_blocks");
    assert_shows(&h, "30 is more than the model's 12 blocks");
}

/// Settings that need another one go with it: unchecking checkpointing drops reentrant
/// checkpointing, choosing the train step drops merged adapters (both would not validate).
#[test]
fn dependent_settings_follow_their_switch() {
    let mut app = VramApp::new_for_test(None);
    app.state.config.checkpointing = true;
    app.state.config.checkpoint_reentrant = true;
    app.state.config.step = vramlab_core::plan::step_kind::StepKind::Eval;
    app.state.config.finetune.mode = FineTuneMode::Lora;
    app.state.config.finetune.lora_merged = true;
    let mut h = harness(app);
    h.run();
    assert!(h.state().state.config.checkpoint_reentrant);
    assert!(h.state().state.config.finetune.lora_merged);
    h.get_by_label("Activation checkpointing").click();
    h.run();
    assert!(!h.state().state.config.checkpoint_reentrant);
    h.get_by_label("train").click();
    h.run();
    assert!(!h.state().state.config.finetune.lora_merged);
}
