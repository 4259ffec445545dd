//! Hugging Face `config.json` import: parameter counts equal transformers' exactly
//! (`tests/data/hf_param_counts.jsonl`, from `lab/cpu/hf_param_counts.py`), and the CLI takes
//! a config file wherever it takes a model.

use std::process::Command;

use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::hf;
use vramlab_core::plan::config::LoopShape;
use vramlab_core::plan::{Planner, TrainConfig};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/hf_configs");

fn counts() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/hf_param_counts.jsonl"
    ))
    .expect("counts");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

#[test]
fn parameter_counts_equal_transformers_for_every_config() {
    let rows = counts();
    let files = std::fs::read_dir(DIR).expect("dir").count();
    assert_eq!(rows.len(), files, "one count per config file");
    let mut types = std::collections::BTreeMap::<String, usize>::new();
    for r in &rows {
        let name = r["config"].as_str().expect("config");
        let text = std::fs::read_to_string(format!("{DIR}/{name}")).expect("config file");
        let preset = hf::from_config_text(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let g = preset
            .build(128, AttnImpl::Sdpa)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            g.param_count(),
            r["params"].as_u64().expect("params"),
            "{name} ({})",
            r["class"]
        );
        *types.entry(hf::family_label(&preset)).or_default() += 1;
    }
    for t in hf::SUPPORTED {
        assert!(types.get(*t).copied().unwrap_or(0) >= 2, "{t}: {types:?}");
    }
}

/// A trainer loop frees the logits before backward: the peak drops by at least one
/// logits tensor when the peak is in backward, and never rises.
#[test]
fn trainer_loop_releases_the_logits() {
    let text = std::fs::read_to_string(format!("{DIR}/Qwen2.5-0.5B.json")).expect("config");
    let preset = hf::from_config_text(&text, "Qwen2.5-0.5B").expect("import");
    let plain = TrainConfig {
        batch: 4,
        size: Some(1024),
        ..TrainConfig::default()
    };
    let trainer = TrainConfig {
        loop_shape: LoopShape::Trainer,
        ..plain
    };
    let a = Planner::new(&preset, &plain)
        .expect("plan")
        .peaks(4)
        .expect("peaks");
    let b = Planner::new(&preset, &trainer)
        .expect("plan")
        .peaks(4)
        .expect("peaks");
    // bf16 logits under AMP: 4 × 1024 × 151936 × 2 bytes.
    let logits = 4 * 1024 * 151_936 * 2;
    assert!(a.allocated.0 >= b.allocated.0 + logits, "{a:?} vs {b:?}");
}

fn vramlab(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(args)
        .output()
        .expect("run vramlab");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

#[test]
fn cli_plans_a_config_json_with_either_loop() {
    let path = format!("{DIR}/Qwen3-0.6B.json");
    let (ok, out, err) = vramlab(&[
        "plan", "--model", &path, "--batch", "2", "--seq", "512", "--loop", "trainer",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("Qwen3-0.6B"), "{out}");
    assert!(out.contains("training loop: trainer"), "{out}");
    let (ok, out, err) = vramlab(&["plan", "--model", &path, "--batch", "2", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["config"]["loop"], "plain");
    assert_eq!(v["params"], 596_049_920u64);
    let (ok, out, err) = vramlab(&["max-batch", "--model", &path, "--gpu", "h200", "--json"]);
    assert!(ok, "{err}");
    assert!(out.contains("\"loop\":\"plain\""), "{out}");
    let (ok, _, err) = vramlab(&["plan", "--model", &path, "--batch", "2", "--loop", "keep"]);
    assert!(
        !ok && err.contains("loop") && err.contains("plain, trainer"),
        "{err}"
    );
}

#[test]
fn cli_errors_name_the_key_or_the_model_type() {
    let dir = std::env::temp_dir().join(format!("vramlab-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    for (body, needle) in [
        (r#"{"model_type": "mixtral2"}"#, "closest is"),
        (
            r#"{"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}"#,
            "intermediate_size",
        ),
        (
            r#"{"model_type": "llama", "vocab_size": 100, "hidden_size": 64, "intermediate_size": "x", "num_hidden_layers": 2, "num_attention_heads": 4}"#,
            "intermediate_size",
        ),
        (r#"{"model_type": 5}"#, "model_type"),
    ] {
        let path = dir.join("config.json");
        std::fs::write(&path, body).expect("write");
        let p = path.to_str().expect("utf-8 path");
        let (ok, _, err) = vramlab(&["plan", "--model", p, "--batch", "1"]);
        assert!(!ok, "{body}");
        assert!(err.contains(needle), "{body}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `.vramlab.json` files written before the loop setting have no `loop` key: they were
/// planned with the output kept alive, and still are.
#[test]
fn old_vramlab_files_mean_the_plain_loop() {
    use vramlab_core::export::VramlabConfig;
    let preset = vramlab_core::model::preset::find_builtin("gpt2").expect("gpt2");
    let trainer = TrainConfig {
        loop_shape: LoopShape::Trainer,
        ..TrainConfig::default()
    };
    let doc = VramlabConfig::new(&preset, false, trainer, "h200", 0.05, None).to_json();
    assert!(doc.contains("\"loop\": \"trainer\""), "{doc}");
    let back = VramlabConfig::from_bytes(doc.as_bytes()).expect("parse");
    assert_eq!(back.training.loop_shape, LoopShape::Trainer);
    let old = doc.replace(",\n    \"loop\": \"trainer\"", "");
    assert!(!old.contains("loop"), "{old}");
    let back = VramlabConfig::from_bytes(old.as_bytes()).expect("parse old");
    assert_eq!(back.training.loop_shape, LoopShape::Plain);
    let bad = doc.replace("\"loop\": \"trainer\"", "\"loop\": \"keras\"");
    let err = VramlabConfig::from_bytes(bad.as_bytes())
        .expect_err("bad loop")
        .to_string();
    assert!(err.contains("keras"), "{err}");
}

#[test]
fn framework_exports_release_the_output() {
    let path = format!("{DIR}/Qwen2.5-0.5B.json");
    let (ok, py, err) = vramlab(&[
        "export", "--format", "pytorch", "--model", &path, "--batch", "2", "--seq", "256",
    ]);
    assert!(ok, "{err}");
    assert!(py.contains("loss = criterion(model("), "{py}");
    let (ok, doc, err) = vramlab(&[
        "export", "--format", "vramlab", "--model", &path, "--batch", "2", "--seq", "256",
    ]);
    assert!(ok, "{err}");
    // The imported model travels as a custom preset and plans again from the file.
    assert!(doc.contains("\"model_type\": \"qwen2\""), "{doc}");
    assert!(doc.contains("\"loop\": \"plain\""), "{doc}");
}

/// `vramlab bench --engine torch` hands the runner the loop shape and the imported model
/// (its `model_type` travels in the preset; the runner rebuilds the config.json from it).
#[test]
fn torch_engine_config_line_carries_the_loop_and_model_type() {
    let text = std::fs::read_to_string(format!("{DIR}/Qwen3-0.6B.json")).expect("config");
    let preset = hf::from_config_text(&text, "Qwen3-0.6B").expect("import");
    let cfg = TrainConfig {
        loop_shape: LoopShape::Trainer,
        ..TrainConfig::default()
    };
    let line = vramlab_device::bench::torch::config_line(&preset, &cfg, 256, 2).expect("line");
    let v: serde_json::Value = serde_json::from_str(&line).expect("json");
    assert_eq!(v["loop"], "trainer");
    assert_eq!(v["model"]["params"]["model_type"], "qwen3");
    assert_eq!(v["seq"], 256);
}

/// The fine-tuning mode travels too: a benchmark of a QLoRA plan runs QLoRA (peft +
/// bitsandbytes in the runner), with the plan's rank, targets, dropout and quantization; a
/// full-training line carries none of it.
#[test]
fn torch_engine_config_line_carries_the_finetune_mode() {
    use vramlab_core::plan::finetune::{FineTune, FineTuneMode, LoraTargets, Quant};
    let text = std::fs::read_to_string(format!("{DIR}/Qwen3-0.6B.json")).expect("config");
    let preset = hf::from_config_text(&text, "Qwen3-0.6B").expect("import");
    let line = |cfg: &TrainConfig| {
        let l = vramlab_device::bench::torch::config_line(&preset, cfg, 256, 2).expect("line");
        serde_json::from_str::<serde_json::Value>(&l).expect("json")
    };
    let full = line(&TrainConfig::default());
    assert!(full.get("finetune").is_none() && full.get("quant").is_none());
    let cfg = TrainConfig {
        precision: vramlab_core::plan::Precision::AmpBf16,
        finetune: FineTune {
            mode: FineTuneMode::Qlora,
            lora_rank: 16,
            lora_targets: LoraTargets::AllLinear,
            quant: Quant::Fp4,
            double_quant: false,
            lora_dropout: vramlab_words::parse("0.05").expect("dropout"),
            ..FineTune::default()
        },
        ..TrainConfig::default()
    };
    let v = line(&cfg);
    assert_eq!(v["finetune"], "qlora");
    assert_eq!(v["lora_rank"], 16);
    assert_eq!(v["lora_targets"], "all-linear");
    assert_eq!(v["quant"], "fp4");
    assert_eq!(v["double_quant"], false);
    assert!((v["lora_dropout"].as_f64().expect("p") - 0.05).abs() < 1e-9);
}

/// `--moe-imbalance F`: more memory for a MoE config, refused below 1 and for dense
/// models (the error names the setting), carried in the saved config.
#[test]
fn cli_moe_imbalance_flag() {
    let moe = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/hf_configs_device/Qwen3-30B-A3B-L2.json"
    );
    let peak = |f: &str| {
        let (ok, out, err) = vramlab(&[
            "plan",
            "--model",
            moe,
            "--batch",
            "16",
            "--seq",
            "1024",
            "--moe-imbalance",
            f,
            "--json",
        ]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        v["peak_allocated_bytes"].as_u64().expect("peak")
    };
    assert!(peak("2") > peak("1"));
    let (ok, _, err) = vramlab(&[
        "plan",
        "--model",
        moe,
        "--batch",
        "1",
        "--moe-imbalance",
        "0.5",
    ]);
    assert!(!ok && err.contains("moe_imbalance"), "{err}");
    let dense = format!("{DIR}/Qwen3-0.6B.json");
    let (ok, _, err) = vramlab(&[
        "plan",
        "--model",
        &dense,
        "--batch",
        "1",
        "--moe-imbalance",
        "2",
    ]);
    assert!(!ok && err.contains("moe_imbalance"), "{err}");
    let (ok, doc, err) = vramlab(&[
        "export",
        "--format",
        "vramlab",
        "--model",
        moe,
        "--batch",
        "2",
        "--moe-imbalance",
        "1.5",
    ]);
    assert!(ok, "{err}");
    assert!(doc.contains("\"moe_imbalance\": 1.5"), "{doc}");
    assert!(doc.contains("\"num_experts\": 128"), "{doc}");
}

/// An encoder-decoder: `--seq` is the source, `--target-seq` the target (default 128, said
/// in the output); the flag is refused for other models and kept in a saved config.
#[test]
fn cli_plans_t5_with_a_target_length() {
    let path = format!("{DIR}/t5-small.json");
    let (ok, out, err) = vramlab(&["plan", "--model", &path, "--batch", "2", "--seq", "256"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("source 256 tokens") && out.contains("target 128 tokens (default"),
        "{out}"
    );
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        &path,
        "--batch",
        "2",
        "--seq",
        "256",
        "--target-seq",
        "64",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["target_seq"], 64);
    assert_eq!(v["config"]["target_seq"], 64);
    assert_eq!(v["params"], 60_506_624u64);
    let (ok, out, err) = vramlab(&[
        "max-batch",
        "--model",
        &path,
        "--seq",
        "256",
        "--target-seq",
        "64",
        "--gpu",
        "h200",
        "--json",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("\"target_seq\":64"), "{out}");
    let (ok, _, err) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "2",
        "--target-seq",
        "64",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--target-seq") && err.contains("not an encoder-decoder"),
        "{err}"
    );
    let (ok, _, err) = vramlab(&[
        "plan",
        "--model",
        &path,
        "--batch",
        "2",
        "--target-seq",
        "0",
    ]);
    assert!(!ok);
    assert!(err.contains("target_seq"), "{err}");
    // Saved and loaded again.
    let dir = std::env::temp_dir().join(format!("vramlab-t5-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let saved = dir.join("t5.vramlab.json");
    let saved_s = saved.to_string_lossy().into_owned();
    let (ok, _, err) = vramlab(&[
        "export",
        "--model",
        &path,
        "--batch",
        "2",
        "--seq",
        "256",
        "--target-seq",
        "64",
        "--format",
        "vramlab",
        "--output",
        &saved_s,
    ]);
    if ok {
        let text = std::fs::read_to_string(&saved).expect("saved");
        assert!(text.contains("\"target_seq\": 64"), "{text}");
        let (ok, out, err) = vramlab(&["plan", "--config", &saved_s, "--json"]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["target_seq"], 64);
    } else {
        panic!("export: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
