//! Property tests of the `.vramlab.json` parser (issue 5): valid documents mutated at random
//! (wrong types, huge numbers, removed and unknown fields), deeply nested JSON and bytes that
//! are not UTF-8. The parser never panics, and every error names the field it is about.

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};

use vramlab_core::export::VramlabConfig;
use vramlab_core::model::preset::{BUILTIN, find_builtin};
use vramlab_core::plan::TrainConfig;

/// One step from a value to a child.
#[derive(Debug, Clone)]
enum Seg {
    Key(String),
    Index(usize),
}

/// Every path in `v`, parents before children.
fn paths(v: &Value, prefix: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    out.push(prefix.clone());
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(Seg::Key(k.clone()));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(Seg::Index(i));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut Value, path: &[Seg]) -> Option<&'a mut Value> {
    path.iter().try_fold(v, |v, s| match s {
        Seg::Key(k) => v.get_mut(k.as_str()),
        Seg::Index(i) => v.get_mut(*i),
    })
}

/// The name an error about `path` must mention: the innermost object key on it.
fn field_name(path: &[Seg]) -> Option<&str> {
    path.iter().rev().find_map(|s| match s {
        Seg::Key(k) => Some(k.as_str()),
        Seg::Index(_) => None,
    })
}

/// A valid document for a built-in preset, by id or as a custom model.
fn document(model: usize, custom: bool, with_prediction: bool) -> Value {
    let (id, _) = BUILTIN[model % BUILTIN.len()];
    let preset = find_builtin(id).expect("built-in preset");
    let training = TrainConfig {
        batch: 4,
        size: Some(preset.default_size()),
        ..TrainConfig::default()
    };
    let plan = with_prediction.then(|| {
        vramlab_core::plan::Planner::new(&preset, &training)
            .and_then(|p| p.plan(1))
            .expect("plan")
    });
    let doc = VramlabConfig::new(&preset, custom, training, "h200", 0.05, plan.as_ref());
    serde_json::to_value(&doc).expect("serialises")
}

#[derive(Debug, Clone)]
enum Mutation {
    Replace(Value),
    Remove,
    AddUnknown,
}

fn replacement() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!("x")),
        Just(json!(true)),
        Just(Value::Null),
        Just(json!([])),
        Just(json!({})),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(1.5)),
        Just(json!(1e300)),
        Just(json!(u64::MAX)),
        Just(json!(i64::MIN)),
        Just(json!([1, [2, [3]]])),
        Just(json!({"a": {"b": 1}})),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        "[a-z_]{0,12}".prop_map(|s| json!(s)),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => replacement().prop_map(Mutation::Replace),
        2 => Just(Mutation::Remove),
        2 => Just(Mutation::AddUnknown),
    ]
}

const UNKNOWN: &str = "zz_not_a_field";

proptest! {
    #![proptest_config(Config { cases: 2000, failure_persistence: None, ..Config::default() })]

    /// One mutation anywhere in a valid document: either it still parses or the error
    /// names the field.
    #[test]
    fn mutated_documents_fail_naming_the_field(
        model in any::<usize>(),
        custom in any::<bool>(),
        with_prediction in prop::bool::weighted(0.2),
        pick in any::<prop::sample::Index>(),
        m in mutation(),
    ) {
        let mut doc = document(model, custom, with_prediction);
        let mut all = Vec::new();
        paths(&doc, &mut Vec::new(), &mut all);
        let path = pick.get(&all).clone();
        let Some(target) = at(&mut doc, &path) else {
            return Err(TestCaseError::fail("path vanished"));
        };
        let expect = match &m {
            Mutation::Replace(v) => {
                *target = v.clone();
                field_name(&path).map(str::to_string)
            }
            Mutation::AddUnknown => {
                let Some(obj) = target.as_object_mut() else { return Ok(()) };
                obj.insert(UNKNOWN.into(), json!(1));
                // An externally tagged enum (`model`) reports a second key as a bad value
                // of the enum's own field.
                match field_name(&path) {
                    Some("model") => Some("model".to_string()),
                    _ => Some(UNKNOWN.to_string()),
                }
            }
            Mutation::Remove => {
                let (Some(Seg::Key(k)), Some(parent)) =
                    (path.last(), at(&mut doc, &path[..path.len().saturating_sub(1)]))
                else {
                    return Ok(());
                };
                let k = k.clone();
                if let Some(obj) = parent.as_object_mut() {
                    obj.remove(&k);
                }
                // `model` is an externally tagged enum: without its one key it is a bad
                // `model`.
                if path.len() == 2 && field_name(&path[..1]) == Some("model") {
                    Some("model".to_string())
                } else {
                    Some(k)
                }
            }
        };
        let bytes = serde_json::to_vec(&doc).expect("serialises");
        match VramlabConfig::from_bytes(&bytes) {
            Ok(cfg) => {
                // Accepted: then planning it must not panic either.
                let preset = cfg.preset().map_err(|e| TestCaseError::fail(e.to_string()))?;
                let _ = vramlab_core::plan::Planner::new(&preset, &cfg.training)
                    .and_then(|p| p.peaks(cfg.training.batch.min(4)));
            }
            Err(e) => {
                let msg = e.to_string();
                // Map keys (prediction.breakdown) are data, not fields: a bad value there is
                // named by its map's field.
                let in_map = path.iter().any(|s| matches!(s, Seg::Key(k) if k == "breakdown"));
                match expect {
                    Some(name) if !(in_map && name != "breakdown") => prop_assert!(
                        msg.contains(&name),
                        "error for {path:?} ({m:?}) does not name `{name}`: {msg}"
                    ),
                    _ => prop_assert!(!msg.is_empty()),
                }
            }
        }
    }

    /// Bytes that are not UTF-8 are refused as such.
    #[test]
    fn non_utf8_is_refused(prefix in "[ -~]{0,40}", bad in prop::collection::vec(0x80u8..=0xff, 1..4), suffix in "[ -~]{0,40}") {
        let mut bytes = prefix.into_bytes();
        bytes.extend(&bad);
        bytes.extend(suffix.into_bytes());
        if std::str::from_utf8(&bytes).is_err() {
            let err = VramlabConfig::from_bytes(&bytes).expect_err("not UTF-8").to_string();
            prop_assert!(err.contains("UTF-8"), "{err}");
        }
    }

    /// Deep nesting hits a limit with an error, never a stack overflow.
    #[test]
    fn deep_nesting_is_an_error(depth in 1usize..200_000, open in prop::sample::select(vec!["[", "{\"a\":"]), wrap in any::<bool>()) {
        let close = if open == "[" { "]" } else { "}" };
        let inner = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let text = if wrap {
            format!("{{\"schema_version\": 1, \"gpu\": {inner}}}")
        } else {
            inner
        };
        let err = VramlabConfig::from_bytes(text.as_bytes()).expect_err("not a config").to_string();
        prop_assert!(
            err.contains("JSON") || err.contains("schema_version") || err.contains("gpu") || err.contains("larger"),
            "{err}"
        );
    }

    /// Arbitrary JSON values in place of the whole document or of one section.
    #[test]
    fn arbitrary_sections(section in prop::sample::select(vec!["training", "model", "prediction", "margin", "gpu", "schema_version"]), v in replacement()) {
        let mut doc = document(0, false, false);
        if let Some(obj) = doc.as_object_mut() {
            obj.insert(section.into(), v);
        }
        let bytes = serde_json::to_vec(&doc).expect("serialises");
        if let Err(e) = VramlabConfig::from_bytes(&bytes) {
            let msg = e.to_string();
            prop_assert!(msg.contains(section), "{section}: {msg}");
        }
    }
}

// ---- Hugging Face config.json import (issue 15) ----------------------------------------

fn hf_configs() -> Vec<(String, Value)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/hf_configs");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(dir)
        .expect("hf_configs")
        .map(|e| {
            let path = e.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("config");
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("x")
                .to_string();
            (name, serde_json::from_str(&text).expect("json"))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

static HF_CONFIGS: std::sync::LazyLock<Vec<(String, Value)>> = std::sync::LazyLock::new(hf_configs);

proptest! {
    #![proptest_config(Config { cases: 600, failure_persistence: None, ..Config::default() })]

    /// One key of a real config.json replaced by a value of another type or range, removed,
    /// or an unknown key added: the import never panics, an error names the key, and what
    /// imports also plans.
    #[test]
    fn mutated_hf_configs_fail_naming_the_key(
        pick in any::<prop::sample::Index>(),
        key_pick in any::<prop::sample::Index>(),
        m in mutation(),
    ) {
        let (name, doc) = pick.get(&HF_CONFIGS);
        let mut doc = doc.clone();
        let obj = doc.as_object_mut().expect("object");
        let keys: Vec<String> = obj.keys().cloned().collect();
        let key = key_pick.get(&keys).clone();
        match &m {
            Mutation::Replace(v) => { obj.insert(key.clone(), v.clone()); }
            Mutation::Remove => { obj.remove(&key); }
            Mutation::AddUnknown => { obj.insert(UNKNOWN.into(), json!(1)); }
        }
        let text = serde_json::to_string(&doc).expect("serialises");
        match vramlab_core::model::hf::from_config_text(&text, name) {
            Ok(preset) => {
                let cfg = TrainConfig { batch: 1, size: Some(8), ..TrainConfig::default() };
                let _ = vramlab_core::plan::Planner::new(&preset, &cfg).and_then(|p| p.peaks(1));
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(
                    !matches!(m, Mutation::AddUnknown),
                    "unknown keys are ignored, as transformers does: {msg}"
                );
                prop_assert!(msg.contains(&key), "{name}: error for `{key}` ({m:?}) does not name it: {msg}");
            }
        }
    }

    /// Arbitrary text never panics the import.
    #[test]
    fn arbitrary_text_never_panics_the_hf_import(text in ".{0,200}", model_type in "[a-z0-9_]{0,12}") {
        let _ = vramlab_core::model::hf::from_config_text(&text, "x");
        let doc = json!({"model_type": model_type, "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "n_embd": 8, "n_layer": 1, "n_head": 2});
        if let Err(e) = vramlab_core::model::hf::from_config(&doc, "x") {
            // An unknown type names `model_type`; a known one whose keys this document lacks
            // (t5: `d_model`, …) names the key.
            let m = e.to_string();
            prop_assert!(m.contains("model_type") || m.contains("missing") || m.contains('`'), "{m}");
        }
    }

    /// A known `model_type` with the generic keys only (T5 reads `d_model`, `d_kv`, …): an
    /// error naming a key, never a panic (proptest drew `t5` once in session 13).
    #[test]
    fn a_known_model_type_without_its_keys_names_a_key(model_type in "(t5|bert|gpt2|llama|mixtral|qwen2|vit|olmo2|granite|starcoder2|smollm3|falcon|modernbert|deberta-v2|deepseek_v3|gpt_oss)") {
        let doc = json!({"model_type": model_type, "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "n_embd": 8, "n_layer": 1, "n_head": 2});
        if let Err(e) = vramlab_core::model::hf::from_config(&doc, "x") {
            let m = e.to_string();
            prop_assert!(m.contains("missing") || m.contains('`') || m.contains("model_type"), "{m}");
        }
    }
}

/// Every key of every stored config.json, each replaced by every boundary value (and
/// removed): the random test above samples this space; this walks all of it, so a key whose
/// error names a derived field instead of the key fails here on every run, not on one seed.
#[test]
fn every_key_of_every_hf_config_fails_naming_it() {
    let values = [
        json!("x"),
        json!(true),
        Value::Null,
        json!([]),
        json!({}),
        json!(-1),
        json!(0),
        json!(1),
        json!(2),
        json!(3),
        json!(1.5),
        json!(1e300),
        json!(1_048_576),
        json!(1_048_577),
        json!(u64::MAX),
    ];
    let mut misses = Vec::new();
    for (name, doc) in HF_CONFIGS.iter() {
        let keys: Vec<String> = doc.as_object().expect("object").keys().cloned().collect();
        for key in &keys {
            let mutations = values
                .iter()
                .map(|v| Some(v.clone()))
                .chain(std::iter::once(None));
            for m in mutations {
                let mut doc = doc.clone();
                let obj = doc.as_object_mut().expect("object");
                match &m {
                    Some(v) => {
                        obj.insert(key.clone(), v.clone());
                    }
                    None => {
                        obj.remove(key);
                    }
                }
                let text = serde_json::to_string(&doc).expect("serialises");
                // Whether what imports also plans is the random test's part (planning every
                // one of these takes minutes in a debug build).
                if let Err(e) = vramlab_core::model::hf::from_config_text(&text, name) {
                    let msg = e.to_string();
                    if !msg.contains(key.as_str()) {
                        misses.push(format!("{name}: `{key}` = {m:?}: {msg}"));
                    }
                }
            }
        }
    }
    assert!(
        misses.is_empty(),
        "{} errors do not name their key:\n{}",
        misses.len(),
        misses.join("\n")
    );
}
