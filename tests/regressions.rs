//! Inputs that once failed, found by the property tests (tests/invariants.rs,
//! tests/parser_props.rs) and the fuzz targets (fuzz/): each must keep working.

use std::process::Command;

use vramlab_core::export::VramlabConfig;
use vramlab_core::model::Preset;
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::search::Budget;
use vramlab_core::plan::{Planner, TrainConfig};
use vramlab_core::units::Bytes;

fn vramlab(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(args)
        .output()
        .expect("run vramlab");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    (out.status.success(), err)
}

/// The "half micro-batch + 2× accumulation" remedy asked for 131072 steps, over the limit,
/// and that error failed the whole plan.
#[test]
fn plan_at_the_accumulation_limit() {
    let preset = find_builtin("resnet18").expect("preset");
    let cfg = TrainConfig {
        batch: 2,
        accum: vramlab_core::plan::config::MAX_ACCUM,
        ..TrainConfig::default()
    };
    let budget = Budget {
        capacity: Bytes::gib(24),
        margin: 0.05,
    };
    let fixes = vramlab_core::plan::remedies::remedies(&preset, &cfg, budget).expect("remedies");
    assert!(fixes.iter().all(|r| r.config.validate().is_ok()));
    let (ok, err) = vramlab(&[
        "plan", "--model", "resnet18", "--batch", "2", "--accum", "65536",
    ]);
    assert!(ok, "{err}");
}

fn gpt2_doc() -> String {
    let preset = find_builtin("gpt2").expect("gpt2");
    VramlabConfig::new(&preset, true, TrainConfig::default(), "h200", 0.05, None).to_json()
}

/// A misspelt training field was ignored: the file planned the default batch.
#[test]
fn unknown_training_fields_are_refused() {
    let doc = gpt2_doc().replace("\"batch\": 8", "\"bacth\": 8");
    let err = VramlabConfig::from_bytes(doc.as_bytes())
        .expect_err("unknown field")
        .to_string();
    assert!(err.contains("bacth"), "{err}");
}

/// Errors inside a custom model named only `params` or `input`, not the field.
#[test]
fn custom_model_errors_name_the_field() {
    let doc = gpt2_doc();
    for (from, to, needle) in [
        (
            "\"n_layer\": 12",
            "\"n_layer\": \"x\"",
            "model.custom: malformed preset: params.n_layer",
        ),
        ("\"seq_len\": 1024", "\"seq_len\": -1", "input.seq_len"),
        ("\"kind\": \"tokens\"", "\"kind\": \"video\"", "input.kind"),
        (
            "\"display_name\": \"GPT-2 (124M)\"",
            "\"display_name\": 5",
            "display_name",
        ),
    ] {
        assert!(doc.contains(from), "{from}");
        let bad = doc.replace(from, to);
        let err = VramlabConfig::from_bytes(bad.as_bytes())
            .expect_err(to)
            .to_string();
        assert!(err.contains(needle), "{to}: {err}");
    }
    let preset = Preset::from_json(
        r#"{"id": "x", "family": "gpt2", "input": {"kind": "tokens", "seq_len": 8}, "params": {}}"#,
    )
    .expect_err("no params");
    assert!(preset.to_string().contains("vocab_size"), "{preset}");
    assert!(
        Planner::new(
            &find_builtin("gpt2").expect("gpt2"),
            &TrainConfig::default()
        )
        .is_ok()
    );
}

/// Bad-input CLI cases that were accepted with a meaningless answer.
#[test]
fn meaningless_cli_inputs_are_refused() {
    for (args, needle) in [
        // PyTorch refuses max_split_size_mb ≤ 20; 0 planned an allocator that caches nothing.
        (
            &[
                "plan",
                "--model",
                "gpt2",
                "--batch",
                "1",
                "--max-split-size-mb",
                "0",
            ][..],
            "max_split_size_mb",
        ),
        // An empty id matched the first catalog GPU by substring.
        (
            &["plan", "--model", "gpt2", "--batch", "1", "--gpu", ""][..],
            "gpu",
        ),
        // Effective batch 0 printed "micro-batch 12 × 1 accumulation steps".
        (
            &["max-batch", "--model", "gpt2", "--target-batch", "0"][..],
            "--target-batch",
        ),
        // 1.5e18 accumulation steps were printed as an answer.
        (
            &[
                "max-batch",
                "--model",
                "gpt2",
                "--target-batch",
                "18446744073709551615",
            ][..],
            "limit",
        ),
    ] {
        let (ok, err) = vramlab(args);
        assert!(!ok, "{args:?} should fail");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Hostile but parseable custom models: a grouped ResNet of 2^43 channels overflowed the
/// shape arithmetic (`attempt to multiply with overflow` in the graph builder; wrapped
/// silently in release); a ViT with 2^61-element attention matrices went past what byte
/// counts can hold. Both are now errors that name what is too large.
#[test]
fn absurd_custom_models_are_errors() {
    let big = 1u64 << 20;
    let mut resnet: serde_json::Value =
        serde_json::from_str(include_str!("../presets/models/resnet50.json")).expect("json");
    resnet["params"]["width_per_group"] = big.into();
    resnet["params"]["groups"] = big.into();
    resnet["input"]["image_size"] = big.into();
    let err = Preset::from_value(&resnet)
        .expect_err("too wide")
        .to_string();
    assert!(err.contains("params.width_per_group"), "{err}");

    let mut vit: serde_json::Value =
        serde_json::from_str(include_str!("../presets/models/vit_b_16.json")).expect("json");
    for (k, v) in [
        ("patch_size", 1),
        ("hidden_dim", big),
        ("num_heads", big),
        ("mlp_dim", big),
    ] {
        vit["params"][k] = v.into();
    }
    vit["input"]["image_size"] = big.into();
    let preset = Preset::from_value(&vit).expect("parses");
    let err = Planner::new(&preset, &TrainConfig::default())
        .expect_err("too large")
        .to_string();
    assert!(err.contains("too large"), "{err}");
    for file in [
        "regression-resnet-wide-groups.json",
        "regression-vit-huge.json",
    ] {
        let path = format!("tests/data/regressions/{file}");
        let (ok, err) = vramlab(&["plan", "--model", &path, "--batch", "1"]);
        assert!(
            !ok && (err.contains("too large") || err.contains("exceeds")),
            "{err}"
        );
    }
}
