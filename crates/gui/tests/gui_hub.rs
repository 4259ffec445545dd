//! A Hub id or a model folder typed in the model picker's search field loads through
//! `vramlab_hub::source::load`, as `--model` does: from a Hugging Face cache offline, with
//! the errors shown; a preset name with a slash stays the preset.

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use vramlab_gui::app::VramApp;
use vramlab_hub::{HubEnv, HubId};

const QWEN: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/data/hub/Qwen2.5-1.5B.json"
);
const COMMIT: &str = "8faed761d45a263340a0528343f099c05c9a4323";

fn harness(app: VramApp) -> Harness<'static, VramApp> {
    Harness::builder()
        .with_size(egui::vec2(1400.0, 900.0))
        .with_max_steps(16)
        .build_ui_state(|ui, app: &mut VramApp| app.ui(ui), app)
}

fn message(h: &Harness<'_, VramApp>) -> String {
    h.state()
        .message()
        .map(|m| m.text.clone())
        .unwrap_or_default()
}

/// A temporary folder, removed when dropped.
struct Temp(std::path::PathBuf);

impl Temp {
    fn new(tag: &str) -> Temp {
        let p = std::env::temp_dir().join(format!("vramlab-gui-hub-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("temp");
        Temp(p)
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An offline app whose Hugging Face cache is `cache`, with `typed` in the search field.
fn typed(cache: &std::path::Path, typed: &str) -> Harness<'static, VramApp> {
    let mut app = VramApp::new_for_test(None);
    app.set_hub_env(HubEnv::from_lookup(|k| match k {
        "HF_HUB_CACHE" => Some(cache.display().to_string()),
        "HF_HUB_OFFLINE" => Some("1".into()),
        // Never the network, even if offline were ignored.
        "HF_ENDPOINT" => Some("http://127.0.0.1:9".into()),
        _ => None,
    }));
    app.state.search = typed.to_string();
    let mut h = harness(app);
    h.run();
    h
}

fn qwen_params() -> serde_json::Value {
    let text = std::fs::read_to_string(QWEN).expect("config");
    let p = vramlab_core::model::hf::from_config_text(&text, "Qwen2.5-1.5B").expect("import");
    serde_json::to_value(&p).expect("json")["params"].clone()
}

#[test]
fn a_hub_id_typed_in_the_picker_loads_from_the_cache() {
    let cache = Temp::new("cache");
    let bytes = std::fs::read(QWEN).expect("config");
    let id = HubId::parse("Qwen/Qwen2.5-1.5B").expect("id");
    vramlab_hub::cache::store(&cache.0, &id, COMMIT, "abc123", &bytes).expect("store");
    let mut h = typed(&cache.0, "Qwen/Qwen2.5-1.5B");
    h.get_by_label("Load Qwen/Qwen2.5-1.5B from the Hugging Face Hub")
        .click();
    h.run();
    let m = message(&h);
    assert!(
        m.starts_with("Loaded Qwen/Qwen2.5-1.5B.") && m.contains("from the Hugging Face cache"),
        "{m}"
    );
    let custom = h.state().state.custom.clone().expect("a custom model");
    assert_eq!(custom["params"], qwen_params(), "the config.json's model");
    assert!(
        custom["reference"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("Qwen/Qwen2.5-1.5B at main, commit {COMMIT}"))),
        "{custom}"
    );
    assert!(h.state().derived().planner().is_some(), "it plans");
}

#[test]
fn errors_show_and_presets_with_a_slash_stay_presets() {
    let cache = Temp::new("empty");
    let mut h = typed(&cache.0, "Qwen/Qwen2.5-0.5B");
    h.get_by_label("Load Qwen/Qwen2.5-0.5B from the Hugging Face Hub")
        .click();
    h.run();
    let m = message(&h);
    assert!(
        m.starts_with("Could not load Qwen/Qwen2.5-0.5B:")
            && m.contains(
                "HF_HUB_OFFLINE is set and its config.json is not in the Hugging Face cache"
            ),
        "{m}"
    );
    assert!(h.state().message().is_some_and(|m| m.is_error));
    assert!(h.state().state.custom.is_none());

    let h = typed(&cache.0, "ViT-B/16");
    assert!(
        h.query_all_by_label_contains("from the Hugging Face Hub")
            .next()
            .is_none(),
        "a preset name is not a Hub id"
    );
    let h = typed(&cache.0, "llama");
    assert!(
        h.query_all_by_label_contains("from the Hugging Face Hub")
            .next()
            .is_none()
    );
}

#[test]
fn a_model_folder_typed_in_the_picker_opens() {
    let dir = Temp::new("folder");
    let folder = dir.0.join("Qwen2.5-1.5B");
    std::fs::create_dir_all(&folder).expect("folder");
    std::fs::copy(QWEN, folder.join("config.json")).expect("copy");
    let name = folder.display().to_string();
    let mut h = typed(&dir.0, &name);
    h.get_by_label(&format!("Open model folder {name}")).click();
    h.run();
    let m = message(&h);
    assert!(
        m.contains("no model.safetensors(.index.json): stored dtypes unknown"),
        "{m}"
    );
    let custom = h.state().state.custom.clone().expect("a custom model");
    assert_eq!(custom["params"], qwen_params());
    assert_eq!(
        h.state().state.config.finetune.mode,
        vramlab_core::plan::finetune_mode::FineTuneMode::Full
    );
    // A bitsandbytes 4-bit checkpoint plans as stored: QLoRA on its nf4 base.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(QWEN).expect("config")).expect("json");
    v["quantization_config"] = serde_json::json!({
        "quant_method": "bitsandbytes", "load_in_4bit": true,
        "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": false
    });
    std::fs::write(folder.join("config.json"), v.to_string()).expect("config");
    let name = folder.display().to_string();
    let mut h = typed(&dir.0, &name);
    h.get_by_label(&format!("Open model folder {name}")).click();
    h.run();
    let m = message(&h);
    assert!(
        m.contains("planned as stored, QLoRA adapters on the nf4 base"),
        "{m}"
    );
    let ft = h.state().state.config.finetune;
    assert_eq!(
        (ft.mode, ft.quant, ft.double_quant),
        (
            vramlab_core::plan::finetune_mode::FineTuneMode::Qlora,
            vramlab_core::plan::finetune_mode::Quant::Nf4,
            false
        )
    );
    assert!(h.state().derived().planner().is_some(), "it plans");
    // A folder without a config.json says so.
    let empty = dir.0.join("empty");
    std::fs::create_dir_all(&empty).expect("empty");
    let name = empty.display().to_string();
    let mut h = typed(&dir.0, &name);
    h.get_by_label(&format!("Open model folder {name}")).click();
    h.run();
    let m = message(&h);
    assert!(m.contains("a directory without a config.json"), "{m}");
}
