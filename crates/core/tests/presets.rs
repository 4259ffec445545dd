//! Every preset's parameter count equals the reference implementation's
//! `sum(p.numel() for p in model.parameters())`, recorded in tests/data/param_counts.jsonl.

use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::preset::{BUILTIN, builtin_presets};

#[test]
fn parameter_counts_match_pytorch() {
    let text =
        std::fs::read_to_string(crate::data("param_counts.jsonl")).expect("param_counts.jsonl");
    let mut checked = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("valid JSON line");
        let id = v["id"].as_str().expect("id");
        let expected = v["params"].as_u64().expect("params");
        let preset = vramlab_core::model::preset::find_builtin(id).expect("preset exists");
        let graph = preset
            .build(preset.default_size(), AttnImpl::Sdpa)
            .expect("builds");
        assert_eq!(graph.param_count(), expected, "{id}");
        checked += 1;
    }
    assert_eq!(
        checked,
        BUILTIN.len(),
        "every built-in preset has a measured count"
    );
}

#[test]
fn every_builtin_preset_parses_and_round_trips() {
    for p in builtin_presets().expect("parse") {
        let again = vramlab_core::model::Preset::from_json(&p.to_json()).expect("round trip");
        assert_eq!(again, p);
    }
}
