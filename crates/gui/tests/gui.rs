//! GUI tests: the real planner app driven through egui_kittest, checked against the core.
//!
//! Snapshots (`tests/snapshots/*.png`) render with wgpu on a software adapter; create or
//! update them with `UPDATE_SNAPSHOTS=1 cargo test --test gui`. The screenshots in
//! `screenshots/` and the frame-time measurement are `#[ignore]`d generators:
//! `cargo test --test gui -- --ignored --nocapture`.

use std::time::Instant;

use egui::accesskit::{Role, Toggled};
use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT as _, Queryable};
use vramlab_core::export::VramlabConfig;
use vramlab_core::model::Preset;
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::remedies::remedies;
use vramlab_core::plan::search::{Budget, max_batch};
use vramlab_core::plan::step_kind::StepKind;
use vramlab_core::plan::{Optimizer, Plan, Planner, Precision, TrainConfig};
use vramlab_core::units::Bytes;
use vramlab_device::gpu::DetectedGpu;
use vramlab_gui::app::VramApp;
use vramlab_gui::ui::PlannerState;
use vramlab_gui::ui::answer::usage_text;
use vramlab_gui::ui::derived::BATCH_LIMIT;
use vramlab_gui::ui::state::STATE_VERSION;

const W: f32 = 1400.0;
const H: f32 = 900.0;

fn harness(app: VramApp) -> Harness<'static, VramApp> {
    harness_themed(app, egui::Theme::Dark)
}

fn harness_themed(app: VramApp, theme: egui::Theme) -> Harness<'static, VramApp> {
    Harness::builder()
        .with_size(egui::vec2(W, H))
        .with_theme(theme)
        .with_max_steps(16)
        .build_ui_state(|ui, app: &mut VramApp| app.ui(ui), app)
}

/// A window tall enough that the remedies and the open Export section are on screen
/// without scrolling (for tests of what they do, not of the layout).
fn harness_tall(app: VramApp) -> Harness<'static, VramApp> {
    Harness::builder()
        .with_size(egui::vec2(W, 2000.0))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(|ui, app: &mut VramApp| app.ui(ui), app)
}

fn rtx4090_budget() -> Budget {
    Budget {
        capacity: vramlab_words::find_gpu("rtx-4090")
            .expect("catalog has the 4090")
            .memory(),
        margin: 0.05,
    }
}

/// What the core predicts for `id` under `cfg`.
fn core_plan(id: &str, cfg: &TrainConfig) -> (Preset, Planner, Plan) {
    let preset = find_builtin(id).expect("built-in preset");
    let planner = Planner::new(&preset, cfg).expect("planner");
    let plan = planner.plan(cfg.batch).expect("plan");
    (preset, planner, plan)
}

fn assert_shows(h: &Harness<'_, VramApp>, text: &str) {
    assert!(
        h.query_all_by_label_contains(text).next().is_some(),
        "expected a widget showing {text:?}"
    );
}

/// Asserts the answer panel shows the core's nvidia-smi figure for `preset` under the
/// app's current config, against the RTX 4090 budget.
fn assert_shows_usage_of(h: &Harness<'_, VramApp>, preset: &Preset) {
    let cfg = h.state().state.config;
    let plan = Planner::new(preset, &cfg)
        .and_then(|p| p.plan(cfg.batch))
        .expect("plan");
    assert_shows(
        h,
        &usage_text(plan.nvidia_smi_bytes, rtx4090_budget().usable()),
    );
}

fn select_preset(h: &mut Harness<'_, VramApp>, search: &str, display_name: &str) {
    h.get_by_label("Search").click();
    h.run();
    h.get_by_label("Search").type_text(search);
    h.run();
    h.get_by_label(display_name).click();
    h.run();
}

fn set_value(h: &mut Harness<'_, VramApp>, label: &str, v: f64) {
    h.get_by_label(label).set_value_accesskit(v);
    h.run();
}

fn pick_combo(h: &mut Harness<'_, VramApp>, combo_label: &str, option: &str) {
    h.get_by_label(combo_label).click();
    h.run();
    h.get_by_label(option).click();
    h.run();
}

#[test]
fn starts_without_gpu_and_shows_the_core_plan() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    assert_shows(
        &h,
        "No NVIDIA GPU detected — planning against NVIDIA GeForce RTX 4090",
    );
    let cfg = TrainConfig::default();
    let (_, planner, plan) = core_plan("gpt2", &cfg);
    let budget = rtx4090_budget();
    let fits = plan.nvidia_smi_bytes <= budget.usable();
    assert!(fits, "the default example should fit");
    assert_shows(&h, "FITS");
    assert_shows(&h, &usage_text(plan.nvidia_smi_bytes, budget.usable()));
    assert_shows(&h, &format!("allocated {}", plan.peak_allocated_bytes));
    assert_shows(&h, &format!("reserved {}", plan.peak_reserved_bytes));
    assert_shows(&h, &format!("Peak during {}", plan.peak_phase.label()));
    assert_shows(&h, "Sequence length");
    assert!(h.query_by_label("SDPA / flash").is_some());
    let m = max_batch(&planner, budget, BATCH_LIMIT)
        .expect("search")
        .expect("batch 1 fits");
    assert!(h.query_by_label(&m.to_string()).is_some(), "max batch {m}");
    // The breakdown table shows every category's bytes.
    for s in &plan.breakdown {
        assert_shows(&h, s.label);
    }
}

#[test]
fn preset_batch_precision_accumulation_match_the_core() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    select_preset(&mut h, "resnet", "ResNet-50");
    assert_eq!(h.state().state.preset_id, "resnet50");
    // Image models: an image size, no attention choice.
    assert_shows(&h, "Image size (px)");
    assert!(h.query_by_label("SDPA / flash").is_none());
    set_value(&mut h, "Batch size", 96.0);
    pick_combo(&mut h, "Precision", "FP32");
    set_value(&mut h, "Gradient accumulation", 4.0);

    let cfg = TrainConfig {
        batch: 96,
        precision: Precision::Fp32,
        accum: 4,
        ..TrainConfig::default()
    };
    assert_eq!(h.state().state.config, cfg);
    let (_, _, plan) = core_plan("resnet50", &cfg);
    let budget = rtx4090_budget();
    let verdict = if plan.nvidia_smi_bytes <= budget.usable() {
        "FITS"
    } else {
        "DOES NOT FIT"
    };
    assert_shows(&h, verdict);
    assert_shows(&h, &usage_text(plan.nvidia_smi_bytes, budget.usable()));
    assert_shows(&h, &format!("allocated {}", plan.peak_allocated_bytes));
    assert_shows(&h, "effective batch 384");
    for s in &plan.breakdown {
        assert_shows(&h, &s.bytes.to_string());
    }
}

#[test]
fn llama_7b_fp32_adamw_does_not_fit_a_4090() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    select_preset(&mut h, "llama-2-7b", "Llama 2 7B");
    pick_combo(&mut h, "Precision", "FP32");
    set_value(&mut h, "Batch size", 1.0);
    let cfg = TrainConfig {
        batch: 1,
        precision: Precision::Fp32,
        optimizer: Optimizer::AdamW,
        ..TrainConfig::default()
    };
    assert_eq!(h.state().state.config, cfg);
    let (_, _, plan) = core_plan("Llama-2-7b-hf", &cfg);
    let budget = rtx4090_budget();
    assert!(plan.nvidia_smi_bytes > budget.usable());
    assert_shows(&h, "DOES NOT FIT");
    assert_shows(&h, &usage_text(plan.nvidia_smi_bytes, budget.usable()));
    assert_shows(&h, "Even batch 1 does not fit");
    h.remove_cursor();
    h.run();
    h.snapshot("planner-does-not-fit");
}

#[test]
fn applying_a_remedy_sets_the_config_and_replans() {
    let mut h = harness_tall(VramApp::new_for_test(None));
    h.run();
    select_preset(&mut h, "gpt2-large", "GPT-2 Large");
    set_value(&mut h, "Batch size", 4.0);
    let cfg = h.state().state.config;
    assert!(!cfg.checkpointing);
    let preset = find_builtin("gpt2-large").expect("preset");
    let before = Planner::new(&preset, &cfg)
        .and_then(|p| p.plan(cfg.batch))
        .expect("plan");
    let budget = rtx4090_budget();
    let list = remedies(&preset, &cfg, budget).expect("remedies");
    let i = list
        .iter()
        .position(|r| r.name == "Activation checkpointing")
        .expect("checkpointing is offered");
    for r in &list {
        assert_shows(&h, r.name);
    }
    let checkbox = h.get_by_role_and_label(Role::CheckBox, "Activation checkpointing");
    assert_eq!(checkbox.accesskit_node().toggled(), Some(Toggled::False));

    let applies = h.get_all_by_label("Apply").collect::<Vec<_>>();
    assert_eq!(applies.len(), list.len());
    applies[i].click();
    h.run();

    assert!(h.state().state.config.checkpointing);
    assert_eq!(h.state().state.config, list[i].config);
    let checkbox = h.get_by_role_and_label(Role::CheckBox, "Activation checkpointing");
    assert_eq!(checkbox.accesskit_node().toggled(), Some(Toggled::True));
    let after = usage_text(list[i].nvidia_smi, budget.usable());
    assert_ne!(after, usage_text(before.nvidia_smi_bytes, budget.usable()));
    assert_shows(&h, &after);
}

/// Changes that add memory are listed after the remedies under their own heading, each
/// marked "cost" instead of a fit mark, in the core's order.
#[test]
fn remedies_that_add_memory_are_shown_as_costs() {
    let mut h = harness_tall(VramApp::new_for_test(None));
    h.run();
    select_preset(&mut h, "llama-2-7b", "Llama 2 7B");
    pick_combo(&mut h, "Precision", "FP32");
    set_value(&mut h, "Batch size", 1.0);
    let cfg = h.state().state.config;
    let preset = find_builtin("Llama-2-7b-hf").expect("preset");
    let list = remedies(&preset, &cfg, rtx4090_budget()).expect("remedies");
    let costs = list.iter().filter(|r| r.adds_memory).count();
    assert!(
        costs > 0,
        "AMP adds bf16 weight copies at batch 1: {list:#?}"
    );
    // The core lists the savers first.
    assert!(
        list.iter()
            .skip_while(|r| !r.adds_memory)
            .all(|r| r.adds_memory)
    );
    assert_shows(&h, "Adds memory here (costs, not remedies)");
    assert_eq!(h.query_all_by_label("cost").count(), costs);
    for r in list.iter().filter(|r| r.adds_memory) {
        assert!(
            r.verdict().contains("a cost, not a remedy"),
            "{}",
            r.verdict()
        );
    }
}

/// The model-switch notice ("does not fit … see the remedies") goes once a remedy is
/// applied: it described the batch before, not the plan now.
#[test]
fn applying_a_remedy_clears_the_model_switch_notice() {
    let mut h = harness_tall(VramApp::new_for_test(None));
    h.run();
    select_preset(&mut h, "llama-2-7b", "Llama 2 7B");
    let notice = h
        .state()
        .message()
        .map(|m| m.text.clone())
        .unwrap_or_default();
    assert!(notice.contains("see the remedies"), "{notice:?}");
    assert_shows(&h, &notice);
    h.get_all_by_label("Apply")
        .next()
        .expect("a remedy")
        .click();
    h.run();
    assert!(h.state().message().is_none());
    assert_eq!(h.query_all_by_label_contains(&notice).count(), 0);
}

#[test]
fn custom_model_replans_and_shows_model_errors() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    set_value(&mut h, "n_layer", 24.0);
    let doc = h.state().state.custom.clone().expect("a custom model");
    assert_eq!(doc["id"], "custom");
    assert_eq!(doc["params"]["n_layer"], 24);
    let preset = Preset::from_value(&doc).expect("valid custom preset");
    assert_shows_usage_of(&h, &preset);

    // 768 is not divisible by 7: the model's own error text is shown, nothing panics.
    set_value(&mut h, "n_head", 7.0);
    let doc = h.state().state.custom.clone().expect("custom");
    let err = Preset::from_value(&doc).expect_err("invalid").to_string();
    assert!(
        h.query_all_by_label(&err).count() >= 1,
        "error {err:?} shown"
    );
    assert_shows(&h, "Cannot plan this configuration");

    // Back to a valid model.
    h.get_by_label("Reset").click();
    h.run();
    assert!(h.state().state.custom.is_none());
    assert_shows(&h, "FITS");
}

#[test]
fn batch_changes_reuse_the_planner() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    let builds = h.state().derived().planner_builds();
    for b in [2.0, 3.0, 17.0, 200.0] {
        set_value(&mut h, "Batch size", b);
    }
    assert_eq!(h.state().state.config.batch, 200);
    assert_eq!(h.state().derived().planner_builds(), builds);
    h.get_by_role_and_label(Role::CheckBox, "Activation checkpointing")
        .click();
    h.run();
    assert_eq!(h.state().derived().planner_builds(), builds + 1);
}

#[test]
fn detected_gpu_is_the_default_target() {
    let gpu = DetectedGpu {
        index: 0,
        name: "NVIDIA H200".into(),
        total: Bytes::mib(143_771),
        free: Bytes::mib(143_000),
    };
    let mut h = harness(VramApp::new_for_test(Some(gpu.clone())));
    h.run();
    assert_shows(
        &h,
        &format!("NVML: NVIDIA H200 — {} free of {}", gpu.free, gpu.total),
    );
    assert_shows(&h, "on NVIDIA H200");
    let (_, _, plan) = core_plan("gpt2", &TrainConfig::default());
    // NVML's total less the driver's idle reservation measured on an H200 (616 MiB).
    let budget = Budget {
        capacity: Bytes::mib(143_771 - 616),
        margin: 0.05,
    };
    assert_shows(&h, &usage_text(plan.nvidia_smi_bytes, budget.usable()));

    h.get_by_label("Plan against free memory only").click();
    h.run();
    let budget = Budget {
        capacity: gpu.free,
        margin: 0.05,
    };
    assert_shows(&h, &usage_text(plan.nvidia_smi_bytes, budget.usable()));
}

#[test]
fn save_preset_without_a_dialog_explains_and_with_one_writes_the_file() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    h.get_by_label("Save preset…").click();
    h.run();
    assert_shows(&h, "copied to the clipboard");

    let path = std::env::temp_dir().join(format!("vramlab-gui-test-{}.json", std::process::id()));
    let p2 = path.clone();
    h.state_mut()
        .set_dialogs(Box::new(move |_| Some(p2.clone())), Box::new(|| None));
    h.get_by_label("dismiss").click();
    h.run();
    h.get_by_label("Save preset…").click();
    h.run();
    assert_shows(&h, "Saved ");
    let text = std::fs::read_to_string(&path).expect("saved file");
    let saved = Preset::from_json(&text).expect("a valid preset");
    assert_eq!(saved, find_builtin("gpt2").expect("gpt2"));
    std::fs::remove_file(&path).ok();
}

#[test]
fn open_preset_loads_a_file_as_the_custom_model() {
    let mut preset = find_builtin("resnet18").expect("resnet18");
    preset.id = "my-net".into();
    preset.display_name = "My ResNet".into();
    let path = std::env::temp_dir().join(format!("vramlab-gui-open-{}.json", std::process::id()));
    std::fs::write(&path, preset.to_json()).expect("write preset");
    let mut app = VramApp::new_for_test(None);
    let p2 = path.clone();
    app.set_dialogs(Box::new(|_| None), Box::new(move || Some(p2.clone())));
    let mut h = harness(app);
    h.run();
    h.get_by_label("Open preset…").click();
    h.run();
    assert_shows(&h, "Opened ");
    assert_shows(&h, "My ResNet");
    assert_shows_usage_of(&h, &preset);
    std::fs::remove_file(&path).ok();
}

fn temp_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vramlab-gui-{}-{name}", std::process::id()))
}

/// A file dropped on the window (what eframe hands egui on native platforms).
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

fn open_export(h: &mut Harness<'_, VramApp>) {
    h.get_by_label("Export").click();
    h.run();
}

/// A LoRA plan: the peft tab writes the model's Hub id and a `LoraConfig` that parses
/// (the targets' comment on its own line); the HF tab refuses, naming the formats that
/// carry the adapters.
#[test]
fn a_lora_plan_exports_peft_and_refuses_trainer_arguments() {
    let mut h = harness_tall(VramApp::new_for_test(None));
    h.run();
    h.get_by_role_and_label(Role::RadioButton, "lora").click();
    h.run();
    assert!(h.state().state.config.finetune.mode.has_adapters());
    open_export(&mut h);
    h.get_by_label("peft / QLoRA").click();
    h.run();
    assert_shows(&h, "MODEL = \"openai-community/gpt2\"");
    assert_shows(&h, "# target_modules=None: peft's default");
    assert_shows(&h, "target_modules=None, task_type=\"CAUSAL_LM\")");
    h.get_by_label("HF TrainingArguments").click();
    h.run();
    assert_shows(&h, "cannot hold the LoRA adapters");
    assert_shows(&h, "--format peft");
}

#[test]
fn export_preview_shows_the_deepspeed_config_of_the_current_batch() {
    let mut h = harness_tall(VramApp::new_for_test(None));
    h.run();
    // A batch that fits at the band's upper edge (GPT-2's largest on the 4090 is 11), so that
    // no "make it fit" search opens above the export.
    set_value(&mut h, "Batch size", 10.0);
    open_export(&mut h);
    // The default format is the .vramlab.json document.
    assert_shows(&h, "\"schema_version\": 2");
    h.get_by_label("DeepSpeed").click();
    h.run();
    let batch = h.state().state.config.batch;
    assert_eq!(batch, 10);
    assert_shows(&h, &format!("\"train_micro_batch_size_per_gpu\": {batch}"));
    set_value(&mut h, "Batch size", 5.0);
    assert_shows(&h, "\"train_micro_batch_size_per_gpu\": 5");

    // Save… writes the previewed text through the save dialog.
    let path = temp_path("ds_config.json");
    let p2 = path.clone();
    let suggested = std::rc::Rc::new(std::cell::RefCell::new(String::new()));
    let s2 = suggested.clone();
    h.state_mut().set_dialogs(
        Box::new(move |name| {
            *s2.borrow_mut() = name.to_string();
            Some(p2.clone())
        }),
        Box::new(|| None),
    );
    h.get_by_label("Save…").click_accesskit();
    h.run();
    assert_eq!(suggested.borrow().as_str(), "ds_config.json");
    let text = std::fs::read_to_string(&path).expect("saved export");
    let ds: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(ds["train_micro_batch_size_per_gpu"], 5);
    std::fs::remove_file(&path).ok();
}

#[test]
fn ctrl_s_then_ctrl_o_restores_the_saved_plan() {
    let path = temp_path("plan.vramlab.json");
    let (p_save, p_open) = (path.clone(), path.clone());
    let suggested = std::rc::Rc::new(std::cell::RefCell::new(String::new()));
    let s2 = suggested.clone();
    let mut app = VramApp::new_for_test(None);
    app.set_dialogs(
        Box::new(move |name| {
            *s2.borrow_mut() = name.to_string();
            Some(p_save.clone())
        }),
        Box::new(move || Some(p_open.clone())),
    );
    let mut h = harness(app);
    h.run();
    select_preset(&mut h, "resnet", "ResNet-50");
    set_value(&mut h, "Batch size", 48.0);
    pick_combo(&mut h, "Precision", "FP32");
    let saved = h.state().state.clone();
    let (_, _, plan) = core_plan("resnet50", &saved.config);
    let peak = format!("allocated {}", plan.peak_allocated_bytes);
    assert_shows(&h, &peak);

    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::S);
    h.run();
    assert_eq!(suggested.borrow().as_str(), "resnet50.vramlab.json");
    assert_shows(&h, "Saved ");
    let doc = VramlabConfig::from_bytes(&std::fs::read(&path).expect("saved")).expect("valid");
    assert_eq!(doc.training, saved.config);
    assert_eq!(
        doc.prediction.as_ref().map(|p| p.peak_allocated_bytes),
        Some(plan.peak_allocated_bytes.0)
    );

    // Change the model, batch and precision, then open the file again.
    let ctx = h.ctx.clone();
    h.state_mut()
        .apply(vramlab_gui::ui::Command::SelectPreset("gpt2".into()), &ctx);
    h.run();
    set_value(&mut h, "Batch size", 3.0);
    pick_combo(&mut h, "Precision", "AMP FP16");
    assert_ne!(h.state().state.config, saved.config);
    assert!(h.query_by_label(&peak).is_none());

    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::O);
    h.run();
    assert_shows(&h, "Opened ");
    let s = &h.state().state;
    assert_eq!(s.preset_id, "resnet50");
    assert!(s.custom.is_none());
    assert_eq!(s.config, saved.config);
    assert_eq!(s.config.batch, 48);
    assert_eq!(s.config.precision, Precision::Fp32);
    // Saved without a GPU: the file holds the concrete card planned for, not "detected".
    assert_eq!(
        s.gpu,
        vramlab_gui::ui::GpuChoice::Catalog("rtx-4090".into()),
        "was {:?}",
        saved.gpu
    );
    assert_eq!(s.margin_pct, saved.margin_pct);
    assert_shows(&h, &peak);
    std::fs::remove_file(&path).ok();
}

#[test]
fn a_custom_model_plan_round_trips_and_drops_open_too() {
    let path = temp_path("custom.vramlab.json");
    let p_save = path.clone();
    let mut app = VramApp::new_for_test(None);
    app.set_dialogs(Box::new(move |_| Some(p_save.clone())), Box::new(|| None));
    let mut h = harness(app);
    h.run();
    set_value(&mut h, "n_layer", 6.0);
    set_value(&mut h, "Batch size", 7.0);
    let saved = h.state().state.clone();
    assert!(saved.custom.is_some());
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::S);
    h.run();
    assert_shows(&h, "Saved ");

    h.get_by_label("Reset").click();
    h.run();
    set_value(&mut h, "Batch size", 2.0);
    assert!(h.state().state.custom.is_none());

    h.input_mut()
        .dropped_files
        .push(std::sync::Arc::new(Dropped(path.clone())));
    h.run();
    assert_shows(&h, "Opened ");
    let s = &h.state().state;
    assert_eq!(s.config, saved.config);
    let custom = s.custom.as_ref().expect("custom model");
    assert_eq!(custom["params"]["n_layer"], 6);
    std::fs::remove_file(&path).ok();
}

#[test]
fn opening_a_malformed_plan_shows_the_field_and_changes_nothing() {
    let good = VramlabConfig::new(
        &find_builtin("resnet50").expect("resnet50"),
        false,
        TrainConfig {
            batch: 33,
            ..TrainConfig::default()
        },
        "h200",
        0.1,
        None,
    )
    .to_json();
    let bad = good.replace("\"batch\": 33", "\"batch\": \"many\"");
    assert_ne!(bad, good);
    let path = temp_path("bad.vramlab.json");
    std::fs::write(&path, &bad).expect("write");
    let p_open = path.clone();
    let mut app = VramApp::new_for_test(None);
    app.set_dialogs(Box::new(|_| None), Box::new(move || Some(p_open.clone())));
    let mut h = harness(app);
    h.run();
    set_value(&mut h, "Batch size", 9.0);
    let before = h.state().state.clone();

    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::O);
    h.run();
    assert_shows(&h, "Could not open");
    assert_shows(&h, "training.batch");
    assert_eq!(h.state().state, before);
    let msg = h.state().message().expect("a message");
    assert!(
        msg.is_error && msg.text.contains("training.batch"),
        "{msg:?}"
    );

    // A GPU that is not in the catalog is refused as well, naming the field.
    std::fs::write(&path, good.replace("\"h200\"", "\"gtx-9999\"")).expect("write");
    h.get_by_label("dismiss").click();
    h.run();
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::O);
    h.run();
    assert_shows(&h, "gpu: unknown GPU `gtx-9999`");
    assert_eq!(h.state().state, before);
    std::fs::remove_file(&path).ok();
}

#[test]
fn state_round_trips_and_old_versions_are_discarded() {
    let s = PlannerState {
        preset_id: "resnet50".into(),
        config: TrainConfig {
            batch: 123,
            ..TrainConfig::default()
        },
        ..PlannerState::default()
    };
    let json = serde_json::to_string(&s).expect("serialise");
    let back: PlannerState = serde_json::from_str(&json).expect("deserialise");
    assert_eq!(PlannerState::from_persisted(Some(back)), s);
    let mut old = s.clone();
    old.version = STATE_VERSION + 1;
    assert_eq!(
        PlannerState::from_persisted(Some(old)),
        PlannerState::default()
    );
    // Missing keys take their defaults.
    let partial: PlannerState = serde_json::from_str(r#"{"version": 1}"#).expect("partial");
    assert_eq!(partial, PlannerState::default());
}

#[test]
fn snapshot_planner() {
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    h.snapshot("planner");
}

/// The light theme (the app follows the system's) stays readable.
#[test]
fn snapshot_planner_light() {
    let mut h = harness_themed(VramApp::new_for_test(None), egui::Theme::Light);
    h.run();
    h.snapshot("planner-light");
}

fn does_not_fit_app() -> VramApp {
    let mut app = VramApp::new_for_test(None);
    app.state.preset_id = "Llama-2-7b-hf".into();
    app.state.config = TrainConfig {
        batch: 1,
        precision: Precision::Fp32,
        ..TrainConfig::default()
    };
    app
}

/// Writes `screenshots/planner.png` and `screenshots/planner-does-not-fit.png` (1400×900),
/// and `screenshots/fit.png` (1400×1900).
#[test]
#[ignore = "generator: cargo test --test gui -- --ignored write_screenshots"]
fn write_screenshots() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../screenshots");
    std::fs::create_dir_all(&dir).expect("screenshots dir");
    let apps = [
        ("planner.png", VramApp::new_for_test(None)),
        ("planner-does-not-fit.png", does_not_fit_app()),
    ];
    for (name, app) in apps {
        let mut h = harness(app);
        h.run();
        let img = h.render().expect("render");
        img.save(dir.join(name)).expect("save png");
        println!("wrote {}", dir.join(name).display());
    }
    // "Make it fit" for Llama-3-8B at seq 2048 on an RTX 4090, tall enough to show it.
    let mut h = Harness::builder()
        .with_size(egui::vec2(W, 1900.0))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(
            |ui, app: &mut VramApp| app.ui(ui),
            crate::gui_fit::llama3_on_4090_app(),
        );
    h.run();
    h.remove_cursor();
    h.run();
    let path = dir.join("fit.png");
    h.render().expect("render").save(&path).expect("save png");
    println!("wrote {}", path.display());
}

/// Milliseconds per frame of `frames` frames, each after `change(app, i)`: (median, p99,
/// max), sorted. The frame-time measurements of every tab use it.
pub(crate) fn frame_times(
    h: &mut Harness<'static, VramApp>,
    frames: u64,
    mut change: impl FnMut(&mut VramApp, u64),
) -> (f64, f64, f64) {
    let mut ms = Vec::with_capacity(frames as usize);
    for i in 0..frames {
        change(h.state_mut(), i);
        let start = Instant::now();
        h.step();
        ms.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    if std::env::var_os("VRAMLAB_SLOW_FRAMES").is_some() {
        let mut worst: Vec<(f64, u64)> = ms.iter().copied().zip(0..).collect();
        worst.sort_by(|a, b| b.0.total_cmp(&a.0));
        println!(
            "slowest frames (ms, frame): {:?}",
            &worst[..worst.len().min(8)]
        );
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
    (at(0.5), at(0.99), at(1.0))
}

fn frame_time(mut app: VramApp, label: &str) {
    const N: u64 = 300;
    // As in the app: where a batch does not fit, the search runs on its worker thread.
    app.search_in_background();
    let mut h = harness(app);
    h.run();
    // Like dragging the batch slider: a new batch every frame.
    let (p50, p99, max) = frame_times(&mut h, N, |app, i| app.state.config.batch = 1 + i);
    let (idle, idle99, _) = frame_times(&mut h, N, |_, _| ());
    println!(
        "frame time ({label}), dragging the batch (a new batch every frame): median {p50:.2} ms, \
         p99 {p99:.2} ms, max {max:.2} ms; unchanged: median {idle:.2} ms, p99 {idle99:.2} ms \
         ({N} frames each)"
    );
}

#[test]
#[ignore = "measurement: cargo test --release -p vramlab-gui --test tests -- --ignored --nocapture --test-threads=1 frame_time"]
fn frame_time_with_batch_changes() {
    frame_time(VramApp::new_for_test(None), "gpt2");
    let mut app = VramApp::new_for_test(None);
    app.state.preset_id = "Llama-2-7b-hf".into();
    frame_time(app, "Llama-2-7b-hf");
    let mut app = VramApp::new_for_test(None);
    app.state.preset_id = "resnet50".into();
    frame_time(app, "resnet50");
}

/// The app with `tests/data/captured/NAME.vramlab-graph.json` open as the custom model.
fn with_captured_graph(name: &str) -> VramApp {
    let path = format!(
        "{}/../../tests/data/captured/{name}.vramlab-graph.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("captured graph");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let mut app = VramApp::new_for_test(None);
    app.state.custom = Some(doc.into());
    app
}

/// A captured graph has no builder parameters: its `params` are the counts it recorded, and
/// the custom-model editor (which offered them as editable numbers) is not shown for it; an
/// edited built-in preset still gets it.
#[test]
fn a_captured_graph_shows_no_builder_parameter_editor() {
    let mut h = harness_tall(with_captured_graph("oddnet"));
    h.run();
    assert!(
        h.query_all_by_label_contains("builder parameters")
            .next()
            .is_none(),
        "the builder editor is shown for a captured graph"
    );
    let mut h = harness_tall(VramApp::new_for_test(None));
    h.run();
    assert_shows(&h, "builder parameters");
}

/// Frames with a captured graph open (`vramlab capture` of Qwen3-0.6B, 2.0 MB of JSON): the
/// custom model's document is part of what the caches are keyed by.
#[test]
#[ignore = "measurement: cargo test --release -p vramlab-gui --test tests -- --ignored --nocapture --test-threads=1 frame_time"]
fn frame_time_with_a_captured_model() {
    frame_time(with_captured_graph("qwen3_06b"), "captured Qwen3-0.6B");
}

/// Frames while the "make it fit" search runs on its worker thread, as in the app: an 8 B
/// model that does not fit on a 12 GB card, the batch dragged every frame (each change asks
/// for a new search; one runs at a time), then frames with nothing changed while the last
/// search finishes.
#[test]
#[ignore = "measurement: cargo test --release -p vramlab-gui --test tests -- --ignored --nocapture --test-threads=1 frame_time"]
fn frame_time_during_a_search() {
    const N: u64 = 300;
    let mut app = VramApp::new_for_test(None);
    app.state.preset_id = "Meta-Llama-3-8B".into();
    app.state.gpu = vramlab_gui::ui::GpuChoice::Catalog("rtx-3060".into());
    app.search_in_background();
    let mut h = harness(app);
    h.run();
    let mut running = 0u64;
    let (p50, p99, max) = frame_times(&mut h, N, |app, i| {
        app.state.config.batch = 1 + i % 64;
        running += u64::from(app.search_running());
    });
    let (q50, q99, qmax) = frame_times(&mut h, N, |app, _| {
        running += u64::from(app.search_running());
    });
    println!(
        "frame time (Meta-Llama-3-8B on an RTX 3060, searches on the worker): dragging: median \
         {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms; unchanged: median {q50:.2} ms, p99 \
         {q99:.2} ms, max {qmax:.2} ms ({N} frames each; a search was running at {running} \
         of the {} frames)",
        2 * N
    );
    assert!(running > 0, "no frame ran beside a search");
}

/// Switching model keeps a batch that fits, else takes the largest that does, and says so.
#[test]
fn switching_model_picks_a_batch_that_fits() {
    let mut app = VramApp::new_for_test(None);
    app.state.config.batch = 32;
    let mut h = harness(app);
    h.run();
    select_preset(&mut h, "Llama", "Llama 3 8B");
    let cfg = h.state().state.config;
    let (_, planner, _) = core_plan("Meta-Llama-3-8B", &cfg);
    let m = max_batch(&planner, rtx4090_budget(), BATCH_LIMIT).expect("search");
    match m {
        Some(m) => {
            assert_eq!(cfg.batch, m.min(32));
            assert_shows(&h, &format!("Batch 32 to {m}"));
        }
        None => {
            assert_eq!(cfg.batch, 1);
            assert_shows(&h, "Batch 32 to 1");
            assert_shows(&h, "Even batch 1 does not fit");
        }
    }
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    let batch = h.state().state.config.batch;
    select_preset(&mut h, "resnet", "ResNet-18");
    assert_eq!(h.state().state.config.batch, batch);
    assert_shows(&h, &format!("Batch {batch} kept"));
}

/// The planner at `w`×`h` (nothing may overlap or be clipped; the snapshots are checked
/// by eye when they change).
fn snapshot_planner_at(w: f32, h_px: f32) {
    let mut h = Harness::builder()
        .with_size(egui::vec2(w, h_px))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(
            |ui, app: &mut VramApp| app.ui(ui),
            VramApp::new_for_test(None),
        );
    h.run();
    h.remove_cursor();
    h.run();
    assert_shows(&h, "FITS");
    h.snapshot(format!("planner-{w}x{h_px}"));
}

/// The declared minimum window.
#[test]
fn snapshot_planner_1000x650() {
    snapshot_planner_at(1000.0, 650.0);
}

/// A common laptop.
#[test]
fn snapshot_planner_1280x800() {
    snapshot_planner_at(1280.0, 800.0);
}

#[test]
fn snapshot_planner_1920x1080() {
    snapshot_planner_at(1920.0, 1080.0);
}

/// Without a file dialog, Ctrl+O offers a path field that opens the plan.
#[test]
fn without_a_dialog_a_path_field_opens_the_plan() {
    let preset = find_builtin("resnet50").expect("resnet50");
    let cfg = TrainConfig {
        batch: 40,
        ..TrainConfig::default()
    };
    let doc = VramlabConfig::new(&preset, false, cfg, "a100-80gb", 0.05, None).to_json();
    let path = std::env::temp_dir().join(format!(
        "vramlab-path-field-{}.vramlab.json",
        std::process::id()
    ));
    std::fs::write(&path, doc).expect("write");
    let mut h = harness(VramApp::new_for_test(None));
    h.run();
    h.key_press_modifiers(egui::Modifiers::COMMAND, egui::Key::O);
    h.run();
    assert_shows(&h, "type the file's path");
    h.get_by_label("Path").click();
    h.run();
    h.get_by_label("Path")
        .type_text(path.to_str().expect("utf-8"));
    h.run();
    h.get_by_label("Open").click();
    h.run();
    assert_shows(&h, "Opened ");
    assert_eq!(h.state().state.preset_id, "resnet50");
    assert_eq!(h.state().state.config.batch, 40);
    assert!(h.query_by_label("type the file's path").is_none());
    std::fs::remove_file(&path).ok();
}

#[test]
fn choosing_the_eval_step_replans_with_and_without_no_grad() {
    let mut h = harness_tall(VramApp::new_for_test(None));
    h.run();
    let mut shown = Vec::new();
    for (label, step) in [
        ("eval-grad", StepKind::EvalGrad),
        ("eval", StepKind::Eval),
        ("train", StepKind::Train),
    ] {
        h.get_by_role_and_label(Role::RadioButton, label).click();
        h.run();
        let cfg = h.state().state.config;
        assert_eq!(cfg.step, step);
        let (_, _, plan) = core_plan("gpt2", &cfg);
        assert_shows(&h, &format!("allocated {}", plan.peak_allocated_bytes));
        shown.push(plan.peak_allocated_bytes);
    }
    // Without no_grad the evaluation keeps the graph: more than under no_grad.
    assert!(shown[0] > shown[1], "{shown:?}");
}

/// The "More than one GPU" section: 8 GPUs with FSDP2 and bf16 mixed precision plan one
/// rank, the answer is the core's per-rank plan, and the global batch is shown.
#[test]
fn more_than_one_gpu_plans_one_rank_as_the_core_does() {
    let mut h = harness_tall(VramApp::new_for_test(None));
    h.run();
    select_preset(&mut h, "gpt2", "GPT-2 (124M)");
    h.get_by_label("More than one GPU").click();
    h.run();
    set_value(&mut h, "GPUs per node", 8.0);
    pick_combo(&mut h, "Strategy", "FSDP2");
    h.get_by_label("bf16").click();
    h.run();
    let cfg = h.state().state.config;
    use vramlab_core::plan::distributed::{FsdpMixedPrecision, Strategy};
    assert_eq!(cfg.distributed.world(), 8);
    assert_eq!(cfg.distributed.strategy, Strategy::Fsdp2);
    assert_eq!(cfg.distributed.mixed_precision, FsdpMixedPrecision::Bf16);
    let (_, _, plan) = core_plan("gpt2", &cfg);
    assert_shows(
        &h,
        &usage_text(plan.nvidia_smi_bytes, rtx4090_budget().usable()),
    );
    assert_shows(&h, "peaks are per rank");
    assert_shows(&h, &format!("= {}", cfg.global_batch()));
    let single = core_plan(
        "gpt2",
        &TrainConfig {
            distributed: Default::default(),
            ..cfg
        },
    )
    .2;
    assert!(plan.peak_allocated_bytes < single.peak_allocated_bytes);
}

/// The verdict shows the measured error band it was judged with, as the core computes it
/// (the same line as `vramlab plan`), at the smallest and at a large window.
fn band_next_to_the_verdict_at(w: f32, h_px: f32) {
    let mut h = Harness::builder()
        .with_size(egui::vec2(w, h_px))
        .with_theme(egui::Theme::Dark)
        .with_max_steps(16)
        .build_ui_state(
            |ui, app: &mut VramApp| app.ui(ui),
            VramApp::new_for_test(None),
        );
    h.run();
    let cfg = h.state().state.config;
    let (_, planner, plan) = core_plan("gpt2", &cfg);
    let verdict =
        vramlab_core::answer::Verdict::new(&planner, &plan, rtx4090_budget()).expect("verdict");
    assert!(verdict.error_band.measured);
    assert_shows(&h, &verdict.band_line());
    assert_shows(
        &h,
        &format!(
            "judged at the band's upper edge: {} nvidia-smi",
            verdict.nvidia_smi_upper_bytes
        ),
    );
    assert_shows(&h, if verdict.fits { "FITS" } else { "DOES NOT FIT" });
    h.remove_cursor();
    h.run();
    h.snapshot(format!("planner-band-{w}x{h_px}"));
}

#[test]
fn the_verdict_shows_its_measured_band_small_window() {
    band_next_to_the_verdict_at(1000.0, 650.0);
}

#[test]
fn the_verdict_shows_its_measured_band_large_window() {
    band_next_to_the_verdict_at(1920.0, 1080.0);
}
