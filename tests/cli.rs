//! The command line: JSON output fields and every error path (non-zero exit, a message
//! naming the problem, no panic).

use std::process::Command;

fn vramlab(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(args)
        .output()
        .expect("run vramlab");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn fails_with(args: &[&str], needle: &str) {
    let (ok, _out, err) = vramlab(args);
    assert!(!ok, "{args:?} should fail");
    assert!(
        err.contains(needle),
        "{args:?}: stderr {err:?} lacks {needle:?}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

#[test]
fn plan_json_has_the_documented_fields() {
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        "resnet50",
        "--batch",
        "64",
        "--precision",
        "amp-bf16",
        "--optimizer",
        "adamw",
        "--gpu",
        "h200",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    for key in [
        "peak_allocated_bytes",
        "peak_reserved_bytes",
        "nvidia_smi_bytes",
        "peak_phase",
        "breakdown",
        "params",
        "max_batch",
        "fits",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["params"], 25_557_032);
    let b = v["breakdown"].as_object().expect("breakdown object");
    for key in [
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "transient",
        "allocator_overhead",
        "cuda_context",
    ] {
        assert!(b.contains_key(key), "breakdown lacks {key}");
    }
    assert!(v["peak_reserved_bytes"].as_u64() >= v["peak_allocated_bytes"].as_u64());
}

#[test]
fn max_batch_json_and_accumulation() {
    let (ok, out, err) = vramlab(&[
        "max-batch",
        "--model",
        "gpt2",
        "--seq",
        "1024",
        "--precision",
        "amp-bf16",
        "--gpu",
        "rtx-4090",
        "--target-batch",
        "64",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    let m = v["max_batch"].as_u64().expect("max_batch");
    assert!(m >= 1);
    assert_eq!(v["accumulation_steps"].as_u64(), Some(64u64.div_ceil(m)));
}

/// At the largest batch the uncapped cache can exceed the card (ResNet-50 on an H200: the
/// cache would grow to ~174 GiB); what the GPU shows is the capped figure, within the limit.
#[test]
fn max_batch_reports_what_the_gpu_really_holds() {
    let (ok, out, err) = vramlab(&[
        "max-batch",
        "--model",
        "resnet50",
        "--precision",
        "amp-bf16",
        "--gpu",
        "h200",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    let usable = v["usable_bytes"].as_u64().expect("usable");
    let on_gpu = v["nvidia_smi_on_gpu_bytes"].as_u64().expect("on gpu");
    let uncapped = v["nvidia_smi_bytes"].as_u64().expect("uncapped");
    assert!(on_gpu <= usable, "{on_gpu} > {usable}");
    assert!(uncapped > usable, "the case this test is about");
    let alloc = v["peak_allocated_bytes"].as_u64().expect("allocated");
    assert!(v["peak_reserved_on_gpu_bytes"].as_u64().expect("reserved") >= alloc);
}

#[test]
fn human_output_is_a_table_with_iec_units() {
    let (ok, out, _) = vramlab(&["plan", "--model", "gpt2", "--batch", "4"]);
    assert!(ok);
    assert!(out.contains("peak allocated") && out.contains("GiB"));
    assert!(out.contains("What-if remedies"));
}

#[test]
fn presets_lists_models_and_gpus() {
    let (ok, out, _) = vramlab(&["presets", "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert!(v["models"].as_array().expect("models").len() >= 36);
    assert!(
        v["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .any(|g| g["id"] == "h200")
    );
}

#[test]
fn unknown_model() {
    fails_with(
        &["plan", "--model", "resnet9000", "--batch", "1"],
        "unknown model `resnet9000`",
    );
}

#[test]
fn batch_zero() {
    fails_with(
        &["plan", "--model", "resnet50", "--batch", "0"],
        "batch: must be at least 1",
    );
}

#[test]
fn absurd_sizes() {
    fails_with(
        &["plan", "--model", "resnet50", "--batch", "99999999999"],
        "batch",
    );
    fails_with(
        &["plan", "--model", "gpt2", "--batch", "1", "--seq", "100000"],
        "seq_len",
    );
    fails_with(
        &[
            "plan", "--model", "resnet50", "--batch", "1", "--image", "0",
        ],
        "size",
    );
    fails_with(
        &[
            "plan", "--model", "resnet50", "--batch", "1", "--accum", "0",
        ],
        "accum",
    );
}

#[test]
fn wrong_kind_of_size() {
    fails_with(
        &[
            "plan", "--model", "resnet50", "--batch", "1", "--seq", "128",
        ],
        "--seq",
    );
    fails_with(
        &["plan", "--model", "gpt2", "--batch", "1", "--image", "224"],
        "--image",
    );
}

#[test]
fn unknown_names() {
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "1",
            "--precision",
            "fp8",
        ],
        "unknown precision `fp8`",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "1",
            "--optimizer",
            "lion",
        ],
        "unknown optimizer `lion`",
    );
    fails_with(
        &[
            "plan", "--model", "gpt2", "--batch", "1", "--gpu", "voodoo5",
        ],
        "unknown gpu `voodoo5`",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "1",
            "--attention",
            "fast",
        ],
        "unknown attention",
    );
    fails_with(
        &["plan", "--model", "gpt2", "--batch", "1", "--margin", "1.5"],
        "--margin",
    );
}

#[test]
fn malformed_preset_files() {
    let dir = std::env::temp_dir().join(format!("vramlab-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let cases = [
        ("broken.json", "{ not json", "not valid JSON"),
        (
            "unknown_field.json",
            r#"{"id":"x","family":"resnet","input":{"kind":"image","image_size":64,"channels":3},"params":{"block":"basic","layers":[1,1,1,1],"num_classes":10,"groups":1,"width_per_group":64,"depth":3}}"#,
            "unknown field `depth`",
        ),
        (
            "wrong_type.json",
            r#"{"id":"x","family":"resnet","input":{"kind":"image","image_size":64,"channels":3},"params":{"block":"basic","layers":"four","num_classes":10,"groups":1,"width_per_group":64}}"#,
            "params",
        ),
        (
            "zero.json",
            r#"{"id":"x","family":"gpt2","input":{"kind":"tokens","seq_len":64},"params":{"vocab_size":0,"n_positions":64,"n_embd":64,"n_layer":1,"n_head":1,"n_inner":null,"activation_function":"gelu_new","resid_pdrop":0.1,"embd_pdrop":0.1,"attn_pdrop":0.1,"tie_word_embeddings":true}}"#,
            "params.vocab_size",
        ),
        (
            "huge.json",
            r#"{"id":"x","family":"gpt2","input":{"kind":"tokens","seq_len":64},"params":{"vocab_size":1e30,"n_positions":64,"n_embd":64,"n_layer":1,"n_head":1,"n_inner":null,"activation_function":"gelu_new","resid_pdrop":0.1,"embd_pdrop":0.1,"attn_pdrop":0.1,"tie_word_embeddings":true}}"#,
            "params",
        ),
        (
            "family.json",
            r#"{"id":"x","family":"transformer-xl","input":{"kind":"tokens","seq_len":64},"params":{}}"#,
            "unknown model family `transformer-xl`",
        ),
    ];
    for (name, text, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        let p = path.to_string_lossy().into_owned();
        fails_with(&["plan", "--model", &p, "--batch", "1"], needle);
    }
    fails_with(
        &[
            "plan",
            "--model",
            &dir.join("missing.json").to_string_lossy(),
            "--batch",
            "1",
        ],
        "reading preset file",
    );
}

#[test]
fn custom_preset_file_plans() {
    let dir = std::env::temp_dir().join(format!("vramlab-cli-ok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let path = dir.join("tiny.json");
    std::fs::write(
        &path,
        r#"{"id":"tiny-gpt","family":"gpt2","input":{"kind":"tokens","seq_len":128},"params":{"vocab_size":1000,"n_positions":128,"n_embd":64,"n_layer":2,"n_head":4,"n_inner":null,"activation_function":"gelu_new","resid_pdrop":0.1,"embd_pdrop":0.1,"attn_pdrop":0.1,"tie_word_embeddings":true}}"#,
    )
    .expect("write");
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        &path.to_string_lossy(),
        "--batch",
        "2",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    // 1000·64 + 128·64 + 2·(12·64² + 13·64) + 2·64
    assert_eq!(
        v["params"],
        1000 * 64 + 128 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64
    );
}

#[test]
fn export_and_plan_from_config_round_trip() {
    let dir = std::env::temp_dir().join(format!("vramlab-cli-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let path = dir.join("gpt2.vramlab.json");
    let p = path.to_string_lossy().into_owned();
    let settings = [
        "--model",
        "gpt2",
        "--batch",
        "6",
        "--accum",
        "4",
        "--precision",
        "amp-fp16",
        "--gpu",
        "a100-80gb",
    ];
    let with = |head: &[&str], tail: &[&str]| -> Vec<String> {
        head.iter()
            .chain(&settings)
            .chain(tail)
            .map(|s| s.to_string())
            .collect()
    };
    let export = with(&["export", "--format", "vramlab"], &["-o", &p]);
    let (ok, _, err) = vramlab(&export.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{err}");
    let plan = with(&["plan"], &["--json"]);
    let (ok, direct, _) = vramlab(&plan.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok);
    let (ok, from_file, err) = vramlab(&["plan", "--config", &p, "--json"]);
    assert!(ok, "{err}");
    assert_eq!(direct, from_file, "a saved config plans identically");
    let (ok, ds, _) = vramlab(&["export", "--format", "deepspeed", "--config", &p]);
    assert!(ok);
    let ds: serde_json::Value = serde_json::from_str(&ds).expect("deepspeed json");
    assert_eq!(ds["train_micro_batch_size_per_gpu"], 6);
    assert_eq!(ds["gradient_accumulation_steps"], 4);
    assert_eq!(ds["fp16"]["enabled"], true);
    fails_with(
        &[
            "export", "--format", "xml", "--model", "gpt2", "--batch", "1",
        ],
        "unknown format `xml`",
    );
    std::fs::write(dir.join("bad.vramlab.json"), b"{\"schema_version\": 99}").expect("write");
    fails_with(
        &[
            "plan",
            "--config",
            &dir.join("bad.vramlab.json").to_string_lossy(),
        ],
        "newer than this vramlab",
    );
}
