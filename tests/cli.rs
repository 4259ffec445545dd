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
    assert_eq!(
        v["needs_cache_flush"], true,
        "it runs only by flushing the cache"
    );
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
        "'--batch <BATCH>': must be at least 1",
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
        // Given, so that neither plan reports an assumed default.
        "--optimizer",
        "adamw",
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

/// Runs vramlab and returns the exit code with stdout and stderr.
fn vramlab_code(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_vramlab"))
        .args(args)
        .output()
        .expect("run vramlab");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn names_suggest_the_closest_and_accept_aliases() {
    // Typos get the closest known names.
    fails_with(
        &["plan", "--model", "gtp2", "--batch", "1"],
        "did you mean `gpt2`?",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "1",
            "--optimizer",
            "adamm",
        ],
        "did you mean one of `adam`, `adamw`?",
    );
    fails_with(
        &["plan", "--model", "gpt2", "--batch", "1", "--gpu", "h2000"],
        "did you mean `h200`?",
    );
    fails_with(
        &[
            "export",
            "--model",
            "gpt2",
            "--batch",
            "1",
            "--format",
            "deepspeeed",
        ],
        "--format: unknown format `deepspeeed`; did you mean `deepspeed`?",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "1",
            "--attention",
            "eagre",
        ],
        "did you mean `eager`?",
    );
    // Ambiguous parts are refused with every candidate, not silently picked.
    fails_with(
        &["plan", "--model", "gpt2", "--batch", "1", "--gpu", "a100"],
        "gpu `a100` is ambiguous: it could be a100-40gb, a100-80gb",
    );
    fails_with(
        &["plan", "--model", "gpt2", "--batch", "1", "--gpu", "rtx"],
        "rtx-3060, rtx-3090, rtx-4080, rtx-4090",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "1",
            "--precision",
            "amp",
        ],
        "precision `amp` is ambiguous: it could be amp-fp16, amp-bf16",
    );
    // Aliases plan, and say what they were read as.
    for (flag, value, canonical, meaning) in [
        ("--precision", "fp16", "amp-fp16", "AMP FP16"),
        ("--precision", "bfloat16", "bf16", "Pure BF16"),
        ("--precision", "bf16-amp", "amp-bf16", "AMP BF16"),
        ("--optimizer", "sgdm", "sgd-momentum", "SGD + momentum"),
    ] {
        let (ok, out, err) = vramlab(&["plan", "--model", "gpt2", "--batch", "1", flag, value]);
        assert!(ok, "{value}: {err}");
        assert!(
            err.contains(&format!("`{value}` read as `{canonical}`")),
            "{err}"
        );
        assert!(
            out.lines().next().is_some_and(|l| l.contains(meaning)),
            "{out}"
        );
    }
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        "llama-3-8b",
        "--batch",
        "1",
        "--gpu",
        "NVIDIA H200",
    ]);
    assert!(ok, "{err}");
    assert!(out.starts_with("Meta-Llama-3-8B"), "{out}");
    assert!(
        err.contains("model `llama-3-8b` read as `Meta-Llama-3-8B`"),
        "{err}"
    );
    // A unique part of a GPU id still works, and says which card it means.
    let (ok, out, err) = vramlab(&["plan", "--model", "gpt2", "--batch", "1", "--gpu", "4090"]);
    assert!(ok, "{err}");
    assert!(out.contains("NVIDIA GeForce RTX 4090"), "{out}");
    assert!(err.contains("read as `rtx-4090`"), "{err}");
}

#[test]
fn plan_says_what_it_assumed_and_warns_about_bf16() {
    let (ok, out, err) = vramlab(&["plan", "--model", "gpt2", "--batch", "1"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "assumed (not given): --gpu rtx-4090, --precision amp-bf16, --optimizer adamw"
        ),
        "{out}"
    );
    let (ok, out, _) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "1",
        "--gpu",
        "a10",
        "--precision",
        "fp32",
        "--optimizer",
        "sgd",
    ]);
    assert!(ok);
    assert!(!out.contains("assumed"), "{out}");
    for (gpu, precision) in [("t4", "amp-bf16"), ("v100-32gb", "bf16")] {
        let (ok, out, err) = vramlab(&[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "1",
            "--gpu",
            gpu,
            "--precision",
            precision,
        ]);
        assert!(ok, "{err}");
        assert!(
            out.contains("warning:") && out.contains("no bf16 tensor cores"),
            "{out}"
        );
    }
    let (_, out, _) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "1",
        "--gpu",
        "t4",
        "--precision",
        "amp-fp16",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["warnings"], serde_json::json!([]));
    assert_eq!(v["assumed"]["optimizer"], "adamw");
    let (_, out, _) = vramlab(&[
        "plan", "--model", "gpt2", "--batch", "1", "--gpu", "t4", "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["warnings"].as_array().map(Vec::len), Some(1));
}

#[test]
fn a_closed_pipe_ends_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    for args in [
        &["presets"][..],
        &["presets", "--json"],
        &["plan", "--model", "gpt2", "--batch", "1"],
    ] {
        for _ in 0..5 {
            let mut child = Command::new(env!("CARGO_BIN_EXE_vramlab"))
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn");
            // Read one byte, then close the pipe, as `| head -c1` does.
            let mut stdout = child.stdout.take().expect("stdout");
            let mut one = [0u8; 1];
            stdout.read_exact(&mut one).expect("first byte");
            drop(stdout);
            let mut err = String::new();
            child
                .stderr
                .take()
                .expect("stderr")
                .read_to_string(&mut err)
                .expect("stderr");
            let status = child.wait().expect("wait");
            assert!(status.success(), "{args:?}: {status:?} {err}");
            assert!(err.is_empty() || !err.contains("error"), "{args:?}: {err}");
        }
    }
}

#[test]
fn batch_below_one_says_what_a_batch_is() {
    for b in ["-1", "0", "two"] {
        let (code, _, err) = vramlab_code(&["plan", "--model", "gpt2", "--batch", b]);
        assert_ne!(code, Some(0), "{b}");
        assert!(
            err.contains("number of samples in one forward/backward pass"),
            "{b}: {err}"
        );
        assert!(!err.contains("unexpected argument"), "{b}: {err}");
    }
}

#[test]
fn max_batch_when_nothing_fits_exits_3_with_the_shortfall() {
    let (code, out, err) = vramlab_code(&[
        "max-batch",
        "--model",
        "Llama-2-13b-hf",
        "--seq",
        "2048",
        "--precision",
        "fp32",
        "--gpu",
        "t4",
    ]);
    assert_eq!(code, Some(3), "{out} {err}");
    assert!(out.contains("even at batch 1: batch 1 needs"), "{out}");
    assert!(out.contains("short"), "{out}");
    assert!(err.contains("nothing fits"), "{err}");
    let (code, out, _) = vramlab_code(&[
        "max-batch",
        "--model",
        "Llama-2-13b-hf",
        "--seq",
        "2048",
        "--precision",
        "fp32",
        "--gpu",
        "t4",
        "--json",
    ]);
    assert_eq!(code, Some(3));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert!(v["max_batch"].is_null());
    let need = v["batch1_nvidia_smi_bytes"].as_u64().expect("need");
    let usable = v["usable_bytes"].as_u64().expect("usable");
    assert_eq!(v["shortfall_bytes"].as_u64(), Some(need - usable));
}

/// A plan saved by the GUI against a detected GPU plans the same through the CLI: the file
/// carries the concrete card, and `plan --config` uses it (here, on a machine without it).
#[test]
fn a_plan_saved_from_the_gui_with_the_detected_gpu_plans_the_same_in_the_cli() {
    use vramlab_core::units::Bytes;
    use vramlab_device::gpu::DetectedGpu;
    use vramlab_gui::app::VramApp;
    use vramlab_gui::ui::GpuChoice;
    use vramlab_gui::ui::export_panel::vramlab_config;

    for (name, mib, catalog_id) in [
        ("NVIDIA H200", 143_771u64, "h200"),
        ("NVIDIA RTX PRO 6000", 97_887, "detected"),
    ] {
        let detected = DetectedGpu {
            index: 0,
            name: name.into(),
            total: Bytes(mib << 20),
            free: Bytes((mib - 1000) << 20),
        };
        let mut app = VramApp::new_for_test(Some(detected));
        let state = app.state.clone();
        app.derived_mut().refresh(&state);
        let d = app.derived();
        let doc = vramlab_config(&app.state, d, None).expect("the GUI's document");
        assert_eq!(doc.gpu, catalog_id);
        let card = doc
            .gpu_detected
            .clone()
            .expect("the detected card is stored");
        assert_eq!((card.name.as_str(), card.memory_mib), (name, mib));
        let dir =
            std::env::temp_dir().join(format!("vramlab-roundtrip-{}-{mib}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("gui.vramlab.json");
        std::fs::write(&path, doc.to_json()).expect("write");
        let p = path.to_str().expect("utf-8 path");
        let (ok, out, err) = vramlab(&["plan", "--config", p, "--json"]);
        assert!(ok, "{err}");
        assert!(
            err.contains(&format!("saved for the detected {name}")),
            "{err}"
        );
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
        assert_eq!(
            v["usable_bytes"].as_u64(),
            Some(d.target().budget.usable().0),
            "{name}"
        );
        let (ok, _, err) = vramlab(&["export", "--config", p, "--format", "hf"]);
        assert!(ok, "{err}");
        // The GUI reopens it on the same card: detected where it is, else the catalog card.
        let bytes = doc.to_json().into_bytes();
        let mut same = VramApp::new_for_test(Some(DetectedGpu {
            index: 0,
            name: name.into(),
            total: Bytes(mib << 20),
            free: Bytes(mib << 20),
        }));
        assert!(same.load_plan(p, &bytes));
        assert_eq!(same.state.gpu, GpuChoice::Detected);
        let mut elsewhere = VramApp::new_for_test(None);
        assert!(elsewhere.load_plan(p, &bytes));
        let expected = if catalog_id == "detected" {
            GpuChoice::Detected
        } else {
            GpuChoice::Catalog(catalog_id.into())
        };
        assert_eq!(elsewhere.state.gpu, expected);
        std::fs::remove_dir_all(&dir).ok();
    }
    // Without a GPU the GUI plans against its fallback card and saves that card.
    let mut app = VramApp::new_for_test(None);
    let state = app.state.clone();
    app.derived_mut().refresh(&state);
    let doc = vramlab_config(&app.state, app.derived(), None).expect("doc");
    assert_eq!((doc.gpu.as_str(), doc.gpu_detected), ("rtx-4090", None));
}

#[test]
fn gpu_detected_uses_nvml_or_says_which_card_it_fell_back_to() {
    let (ok, out, err) = vramlab(&[
        "plan", "--model", "gpt2", "--batch", "1", "--gpu", "detected",
    ]);
    assert!(ok, "{err}");
    if err.contains("no GPU found through NVML") {
        assert!(
            err.contains("planning for the catalog card rtx-4090"),
            "{err}"
        );
        assert!(out.contains("NVIDIA GeForce RTX 4090"), "{out}");
    }
    // An old file that says only "detected" plans too.
    let dir = std::env::temp_dir().join(format!("vramlab-detected-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("old.vramlab.json");
    let (ok, _, err) = vramlab(&[
        "export",
        "--model",
        "gpt2",
        "--batch",
        "2",
        "--gpu",
        "h200",
        "--format",
        "vramlab",
        "-o",
        path.to_str().expect("path"),
    ]);
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&path)
        .expect("read")
        .replace("\"h200\"", "\"detected\"");
    std::fs::write(&path, text).expect("write");
    let (ok, _, err) = vramlab(&["plan", "--config", path.to_str().expect("path")]);
    assert!(ok, "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A remedy that frees allocated memory the cache keeps reserved says so, and a remedy
/// that does not fit at the batch says which batch it allows.
#[test]
fn remedies_show_allocated_savings_and_the_batch_they_allow() {
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "16",
        "--seq",
        "1024",
        "--precision",
        "amp-bf16",
        "--optimizer",
        "adamw",
        "--gpu",
        "rtx-4090",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["fits"], false);
    let remedies = v["remedies"].as_array().expect("remedies");
    let adam8 = remedies
        .iter()
        .find(|r| r["name"] == "8-bit Adam")
        .expect("8-bit Adam");
    let alloc = adam8["allocated_saving"]
        .as_i64()
        .expect("allocated saving");
    let smi = adam8["saving"].as_i64().expect("saving");
    assert!(alloc > 0 && smi < alloc / 2, "{adam8}");
    assert!(
        adam8["note"]
            .as_str()
            .is_some_and(|n| n.contains("caching allocator"))
    );
    for r in remedies {
        if r["fits"] == false
            && let Some(b) = r["fits_up_to"].as_u64()
        {
            assert!(b < r["config"]["batch"].as_u64().expect("batch"), "{r}");
            // The batch it allows really fits.
            let c = &r["config"];
            let (b, accum) = (b.to_string(), c["accum"].to_string());
            let mut args = vec![
                "plan", "--model", "gpt2", "--batch", &b, "--seq", "1024", "--gpu", "rtx-4090",
                "--json", "--accum", &accum,
            ];
            args.extend(["--precision", c["precision"].as_str().expect("precision")]);
            args.extend(["--optimizer", c["optimizer"].as_str().expect("optimizer")]);
            args.extend(["--loop", c["loop"].as_str().expect("loop")]);
            if c["checkpointing"] == true {
                args.push("--checkpointing");
            }
            if c["allocator"]["expandable_segments"] == true {
                args.push("--expandable-segments");
            }
            let (ok, out, err) = vramlab(&args);
            assert!(ok, "{err}");
            let p: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
            assert_eq!(p["fits"], true, "{} at {b}", r["name"]);
        }
    }
    let (ok, out, _) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "16",
        "--seq",
        "1024",
        "--optimizer",
        "adamw",
        "--precision",
        "amp-bf16",
        "--gpu",
        "rtx-4090",
    ]);
    assert!(ok);
    assert!(out.contains("fits at micro-batch up to 12"), "{out}");
    assert!(out.contains("so nvidia-smi moves by"), "{out}");
}

/// `--finetune lora`: the plan JSON carries the trainable count (peft's, from the measured
/// rows in tests/data/lora.jsonl) and the config's `finetune` object; full plans carry
/// neither; LoRA options without `--finetune lora` and unknown modules are refused.
#[test]
fn lora_flags_plan_adapters_and_report_trainable_params() {
    let rows = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/lora.jsonl"),
    )
    .expect("lora.jsonl");
    let row: serde_json::Value = rows
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["model"] == "presets/models/gpt2.json" && r["lora_targets"] == "all-linear")
        .expect("a GPT-2 all-linear row");
    let rank = row["lora_rank"].to_string();
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--seq",
        "512",
        "--batch",
        "8",
        "--finetune",
        "lora",
        "--lora-rank",
        &rank,
        "--lora-targets",
        "all-linear",
        "--json",
    ]);
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(plan["trainable_params"], row["trainable_params"]);
    assert_eq!(plan["params"], row["all_params"]);
    assert_eq!(plan["config"]["finetune"]["mode"], "lora");
    let (ok, out, err) = vramlab(&["plan", "--model", "gpt2", "--batch", "8", "--json"]);
    assert!(ok, "{err}");
    assert!(!out.contains("trainable_params") && !out.contains("finetune"));
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "8",
            "--lora-rank",
            "8",
        ],
        "--finetune lora",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "8",
            "--finetune",
            "lora",
            "--lora-targets",
            "qkv",
        ],
        "lora_targets: unknown module `qkv`",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "8",
            "--finetune",
            "qdora",
        ],
        "unknown finetune `qdora` (known: full, lora, qlora)",
    );
    fails_with(
        &["plan", "--model", "gpt2", "--batch", "8", "--quant", "nf4"],
        "--quant / --no-double-quant: need --finetune qlora",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "8",
            "--finetune",
            "qlora",
            "--quant",
            "nf3",
        ],
        "unknown quant `nf3` (known: nf4, fp4, int8)",
    );
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "8",
        "--finetune",
        "qlora",
        "--quant",
        "int8",
        "--optimizer",
        "paged_adamw_8bit",
        "--json",
    ]);
    assert!(ok, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(plan["config"]["finetune"]["mode"], "qlora");
    assert_eq!(plan["config"]["finetune"]["quant"], "int8");
    assert_eq!(plan["config"]["optimizer"], "paged-adamw-8bit");
    assert!(plan["weights_split"]["frozen_bytes"].as_u64().unwrap_or(0) > 0);
}

/// `--lora-dropout`: one `nn.Dropout` per adapted module; the plan grows (masks and the
/// dropout outputs the adapters keep), the config and the printed line carry it, the peft
/// export writes it, and bad values name the field.
#[test]
fn lora_dropout_flag_plans_dropout_and_is_checked() {
    let args = |dropout: Option<&str>, json: bool| {
        let mut a = vec![
            "plan",
            "--model",
            "gpt2",
            "--seq",
            "512",
            "--batch",
            "8",
            "--finetune",
            "lora",
            "--lora-rank",
            "16",
            "--lora-targets",
            "all-linear",
        ];
        if let Some(p) = dropout {
            a.extend(["--lora-dropout", p]);
        }
        if json {
            a.push("--json");
        }
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let peak = |dropout: Option<&str>| {
        let a = args(dropout, true);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        let (ok, out, err) = vramlab(&refs);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        (v["peak_allocated_bytes"].as_u64().expect("peak"), v)
    };
    let (without, v0) = peak(None);
    let (with, v) = peak(Some("0.05"));
    assert!(v0["config"]["finetune"].get("lora_dropout").is_none());
    assert_eq!(v["config"]["finetune"]["lora_dropout"], 0.05);
    // GPT-2 AMP all-linear, b8 × 512: the masks and dropout outputs add about 250 MiB.
    assert!(with > without + (200 << 20), "{with} vs {without}");
    let a = args(Some("0.1"), false);
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let (ok, out, err) = vramlab(&refs);
    assert!(ok, "{err}");
    assert!(
        out.contains("fine-tuning: LoRA r16 on all-linear, dropout 0.1 (peft 0.21"),
        "{out}"
    );
    let (ok, out, err) = vramlab(&[
        "export",
        "--format",
        "peft",
        "--model",
        "gpt2",
        "--batch",
        "8",
        "--finetune",
        "lora",
        "--lora-dropout",
        "0.05",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("lora_dropout=0.05,"), "{out}");
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "8",
            "--finetune",
            "lora",
            "--lora-dropout",
            "1.5",
        ],
        "lora_dropout: 1.5 is not a probability in [0, 1)",
    );
    fails_with(
        &[
            "plan",
            "--model",
            "gpt2",
            "--batch",
            "8",
            "--lora-dropout",
            "0.1",
        ],
        "--lora-dropout: need --finetune lora or qlora",
    );
}

#[test]
fn plan_step_eval_and_bad_step_names() {
    let peak = |step: &str| {
        let (ok, out, err) = vramlab(&[
            "plan", "--model", "gpt2", "--batch", "4", "--seq", "512", "--step", step, "--json",
        ]);
        assert!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["config"]["step"].as_str().unwrap_or("train"), step);
        v["peak_allocated_bytes"].as_u64().expect("peak")
    };
    let (train, eval, eval_grad) = (peak("train"), peak("eval"), peak("eval-grad"));
    // Gradients and optimizer state stay resident through validation; without no_grad the
    // forward also keeps every activation (here more than training holds at its peak).
    assert!(
        eval < eval_grad && eval < train,
        "{eval} {eval_grad} {train}"
    );
    let (ok, out, _) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "4",
        "--step",
        "eval-grad",
    ]);
    assert!(ok && out.contains("WITHOUT torch.no_grad()"), "{out}");
    fails_with(
        &["plan", "--model", "gpt2", "--batch", "2", "--step", "evl"],
        "unknown step `evl` (known: train, eval, eval-grad)",
    );
}

#[test]
fn max_batch_when_nothing_fits_points_to_vramlab_fit() {
    let args = [
        "max-batch",
        "--model",
        "Meta-Llama-3-8B",
        "--seq",
        "2048",
        "--gpu",
        "rtx-4090",
    ];
    let (code, out, _) = vramlab_code(&args);
    assert_eq!(code, Some(3), "{out}");
    let want = "vramlab fit --model Meta-Llama-3-8B --seq 2048 --gpu rtx-4090";
    assert!(out.contains(want), "{out}");
    let (_, json, _) = vramlab_code(&[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    assert_eq!(v["fit_command"], want);
    // The command it prints runs and answers.
    let fit_args: Vec<&str> = want.split(' ').skip(1).collect();
    let (code, out, err) = vramlab_code(&fit_args);
    assert_eq!(code, Some(0), "{out} {err}");
    assert!(out.contains("LoRA"), "{out}");
}

#[test]
fn fit_answers_llama3_8b_on_a_4090_in_text_and_json() {
    let base = [
        "fit",
        "--model",
        "Meta-Llama-3-8B",
        "--seq",
        "2048",
        "--batch",
        "4",
        "--accum",
        "4",
        "--gpu",
        "rtx-4090",
    ];
    let (code, out, err) = vramlab_code(&base);
    assert_eq!(code, Some(0), "{out} {err}");
    assert!(out.contains("effective batch 16"), "{out}");
    assert!(out.contains("ms/sample"), "{out}");
    // At the upper edge of llama/lora/none's reserved band LoRA in bf16 no longer fits 24 GB;
    // QLoRA does.
    assert!(
        out.contains("full fine-tuning → QLoRA nf4 r8 on attn"),
        "{out}"
    );
    let (code, json, err) = vramlab_code(&[&base[..], &["--json", "--top", "3"]].concat());
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    let list = v["candidates"].as_array().expect("candidates");
    assert!(!list.is_empty() && list.len() <= 3);
    let usable = v["usable_bytes"].as_u64().expect("usable");
    let mut last = 0.0;
    for c in list {
        let cfg = &c["config"];
        assert_eq!(
            cfg["batch"].as_u64().expect("batch") * cfg["accum"].as_u64().expect("accum"),
            16
        );
        assert!(c["nvidia_smi"].as_u64().expect("smi") <= usable);
        let mode = cfg["finetune"]["mode"].as_str().expect("mode");
        assert!(mode == "lora" || mode == "qlora", "{mode}");
        let t = c["time"]["ms_per_sample"].as_f64().expect("time");
        assert!(t >= last);
        last = t;
        assert!(!c["changes"].as_array().expect("changes").is_empty());
    }
    assert!(v["reason"].is_null());
}

#[test]
fn fit_keeps_the_users_config_first_and_refuses_bad_flags() {
    let (code, out, err) = vramlab_code(&[
        "fit", "--model", "gpt2", "--seq", "512", "--batch", "4", "--gpu", "rtx-4090", "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["candidates"][0]["is_user_config"], true);
    assert_eq!(v["candidates"][0]["config"]["batch"], 4);
    fails_with(
        &["fit", "--model", "gpt2", "--gpu", "rtx-4090", "--top", "0"],
        "--top",
    );
    fails_with(
        &["fit", "--model", "gpt2", "--effective-batch", "0"],
        "at least 1",
    );
    fails_with(&["fit", "--model", "gpt-9"], "gpt");
}

#[test]
fn fit_when_nothing_fits_exits_3_with_a_reason() {
    let (code, out, err) = vramlab_code(&[
        "fit",
        "--model",
        "Llama-2-13b-hf",
        "--seq",
        "2048",
        "--gpu",
        "rtx-4090",
        "--margin",
        "0.85",
    ]);
    assert_eq!(code, Some(3), "{out} {err}");
    assert!(out.contains("nothing fits"), "{out}");
    assert!(err.contains("nothing fits"), "{err}");
}

/// More than one GPU: per-rank JSON fields, `--gpus auto`, the DeepSpeed export's
/// `zero_optimization`, and every misuse named.
#[test]
fn multi_gpu_flags_plan_per_rank_and_errors_name_the_flag() {
    let base = [
        "--model",
        "gpt2",
        "--batch",
        "4",
        "--seq",
        "512",
        "--gpu",
        "a100-80gb",
        "--json",
    ];
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["plan"];
        args.extend(base);
        args.extend(extra);
        let (ok, out, err) = vramlab(&args);
        assert!(ok, "{args:?}: {err}");
        serde_json::from_str(&out).expect("json")
    };
    let single = json(&[]);
    assert!(single.get("world").is_none(), "one GPU adds no fields");
    let fsdp = json(&["--gpus", "4", "--strategy", "fsdp2", "--accum", "2"]);
    assert_eq!(fsdp["world"], 4);
    assert_eq!(fsdp["strategy"], "fsdp2");
    assert_eq!(fsdp["global_batch"], 32);
    assert!(fsdp["breakdown"]["unsharded"].as_u64().is_some());
    assert!(
        fsdp["peak_allocated_bytes"].as_u64() < single["peak_allocated_bytes"].as_u64(),
        "sharding lowers the rank's peak"
    );
    let off = json(&[
        "--gpus",
        "8",
        "--strategy",
        "zero3",
        "--offload",
        "optimizer",
    ]);
    assert!(off["host_ram_per_rank_bytes"].as_u64().unwrap_or(0) > 0);
    let nodes = json(&["--gpus", "8", "--nodes", "2", "--strategy", "ddp"]);
    assert_eq!(nodes["world"], 16);

    // `--gpus auto`: Llama-2-7B full training does not fit one 80 GB card.
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        "Llama-2-7b-hf",
        "--batch",
        "1",
        "--seq",
        "2048",
        "--checkpointing",
        "--gpu",
        "a100-80gb",
        "--gpus",
        "auto",
        "--strategy",
        "fsdp2",
        "--json",
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("--gpus auto"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(v["world"].as_u64().is_some_and(|w| w >= 2), "{v}");
    assert_eq!(v["fits"], true);

    let (ok, out, err) = vramlab(&[
        "export",
        "--model",
        "gpt2",
        "--batch",
        "4",
        "--format",
        "deepspeed",
        "--gpus",
        "8",
        "--strategy",
        "zero2",
    ]);
    assert!(ok, "{err}");
    let ds: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(ds["zero_optimization"]["stage"], 2);
    assert_eq!(ds["train_batch_size"], 32);
    let (ok, out, _) = vramlab(&[
        "export",
        "--model",
        "gpt2",
        "--batch",
        "4",
        "--format",
        "torchrun",
        "--gpus",
        "4",
        "--strategy",
        "fsdp2",
    ]);
    assert!(ok && out.contains("--nproc-per-node=4"), "{out}");

    let plan = |extra: &[&str]| {
        let mut a = vec!["plan", "--model", "gpt2", "--batch", "4"];
        a.extend(extra);
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let check = |extra: &[&str], needle: &str| {
        let args = plan(extra);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&refs, needle);
    };
    check(
        &["--gpus", "4", "--strategy", "zer03"],
        "did you mean `zero3`",
    );
    check(&["--gpus", "0"], "--gpus");
    check(
        &["--gpus", "4", "--strategy", "ddp", "--offload", "optimizer"],
        "offload",
    );
    check(
        &["--gpus", "4", "--strategy", "zero2", "--offload", "params"],
        "zero3",
    );
    check(
        &[
            "--gpus",
            "4",
            "--strategy",
            "ddp",
            "--no-reshard-after-forward",
        ],
        "fsdp2",
    );
    check(
        &[
            "--gpus",
            "4",
            "--strategy",
            "fsdp2",
            "--fsdp-mixed-precision",
            "bf61",
        ],
        "bf16",
    );
    check(
        &[
            "--gpus",
            "4",
            "--strategy",
            "fsdp2",
            "--offload",
            "optimzer",
        ],
        "optimizer",
    );
}

/// `vramlab capture` without a usable Python, and captured graphs on `--model`: a plan,
/// the re-capture message for other settings, a field-naming error for a broken file.
#[test]
fn capture_errors_and_captured_models() {
    fails_with(
        &[
            "capture",
            "--timm",
            "resnet18",
            "--python",
            "/nonexistent/python3",
            "-o",
            "/tmp/never.vramlab-graph.json",
        ],
        "--python",
    );
    fails_with(
        &["capture", "-o", "/tmp/never.vramlab-graph.json"],
        "--timm",
    );
    let graph = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/captured/oddnet.vramlab-graph.json"
    );
    let (ok, out, err) = vramlab(&[
        "plan", "--model", graph, "--batch", "16", "--gpu", "h200", "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert!(
        v["peak_allocated_bytes"].as_u64().unwrap_or(0) > 100 << 20,
        "{v}"
    );
    assert_eq!(v["fits"], serde_json::json!(true));
    let (ok, out, err) = vramlab(&["max-batch", "--model", graph, "--gpu", "rtx-4090"]);
    assert!(ok && !out.is_empty(), "{err}");
    fails_with(
        &[
            "plan",
            "--model",
            graph,
            "--batch",
            "16",
            "--precision",
            "fp32",
        ],
        "re-capture",
    );
    fails_with(
        &["plan", "--model", graph, "--batch", "16", "--image", "320"],
        "--image 320",
    );
    let dir = std::env::temp_dir().join(format!("vramlab-cli-captured-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let bad = dir.join("bad.vramlab-graph.json");
    let text = std::fs::read_to_string(graph).expect("graph");
    std::fs::write(&bad, text.replacen("\"version\":1", "\"version\":9", 1)).expect("write");
    fails_with(
        &[
            "plan",
            "--model",
            bad.to_str().unwrap_or(""),
            "--batch",
            "4",
        ],
        "version",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Partial full fine-tuning: `--freeze-embeddings` / `--freeze-blocks N` print the trainable
/// count and save less; out-of-range or combined with LoRA they are refused naming the flag.
#[test]
fn freeze_flags_plan_partial_fine_tuning_and_are_checked() {
    let base = [
        "plan", "--model", "gpt2", "--batch", "4", "--seq", "512", "--json",
    ];
    let peak = |extra: &[&str]| {
        let (code, out, err) = vramlab_code(&[&base[..], extra].concat());
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
        (
            v["peak_allocated_bytes"].as_u64().expect("peak"),
            v["trainable_params"].as_u64(),
        )
    };
    let (full, none) = peak(&[]);
    assert_eq!(none, None);
    let (frozen, trainable) = peak(&["--freeze-embeddings", "--freeze-blocks", "6"]);
    assert!(frozen < full, "{frozen} >= {full}");
    assert!(trainable.expect("trainable") < 124_439_808 / 2);
    let (code, _, err) = vramlab_code(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "2",
        "--freeze-blocks",
        "40",
    ]);
    assert_ne!(code, Some(0));
    assert!(
        err.contains("freeze_blocks") && err.contains("12 blocks"),
        "{err}"
    );
    let (code, _, err) = vramlab_code(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "2",
        "--finetune",
        "lora",
        "--freeze-embeddings",
    ]);
    assert_ne!(code, Some(0));
    assert!(err.contains("--freeze-embeddings"), "{err}");
    let (code, out, err) = vramlab_code(&[
        "export",
        "--format",
        "pytorch",
        "--model",
        "gpt2",
        "--batch",
        "2",
        "--freeze-blocks",
        "3",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("blocks[:3]") && out.contains("requires_grad_(False)"),
        "{out}"
    );
}

/// DeepSpeed's ZeRO knob flags and PyTorch's ZeRO-1: errors name the flag, values reach the
/// plan and the DeepSpeed export.
#[test]
fn deepspeed_knobs_and_torch_zero1_flags() {
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "plan", "--model", "gpt2", "--batch", "4", "--seq", "512", "--json",
        ];
        args.extend(extra);
        let (ok, out, err) = vramlab(&args);
        assert!(ok, "{args:?}: {err}");
        serde_json::from_str(&out).expect("json")
    };
    let check = |extra: &[&str], needle: &str| {
        let mut args = vec!["plan", "--model", "gpt2", "--batch", "4"];
        args.extend(extra);
        fails_with(&args, needle);
    };
    // DeepSpeed's knobs need a DeepSpeed strategy; stage-3 knobs stage 3; torch-zero1 no
    // offload.
    check(
        &[
            "--gpus",
            "4",
            "--strategy",
            "fsdp2",
            "--overlap-comm",
            "true",
        ],
        "--overlap-comm",
    );
    check(
        &[
            "--gpus",
            "4",
            "--strategy",
            "zero2",
            "--stage3-param-persistence-threshold",
            "0",
        ],
        "--stage3-",
    );
    check(
        &[
            "--gpus",
            "4",
            "--strategy",
            "torch-zero1",
            "--offload",
            "optimizer",
        ],
        "ZeroRedundancyOptimizer",
    );
    check(
        &[
            "--gpus",
            "4",
            "--strategy",
            "zero2",
            "--reduce-bucket-size",
            "0",
        ],
        "reduce_bucket_size",
    );
    // The knobs reach the plan (one more 5e8-element IPG buffer with overlap_comm) and
    // the DeepSpeed export; torch-zero1 plans and saves its name.
    let z2 = json(&["--gpus", "4", "--strategy", "zero2"]);
    let z2o = json(&[
        "--gpus",
        "4",
        "--strategy",
        "zero2",
        "--overlap-comm",
        "true",
    ]);
    assert!(
        z2o["peak_allocated_bytes"].as_u64() > z2["peak_allocated_bytes"].as_u64(),
        "overlap_comm adds a buffer"
    );
    let tz = json(&["--gpus", "4", "--strategy", "torch-zero1"]);
    assert_eq!(tz["strategy"], "torch-zero1");
    let (ok, out, err) = vramlab(&[
        "export",
        "--model",
        "gpt2",
        "--batch",
        "4",
        "--format",
        "deepspeed",
        "--gpus",
        "8",
        "--strategy",
        "zero3",
        "--overlap-comm",
        "false",
        "--stage3-param-persistence-threshold",
        "0",
    ]);
    assert!(ok, "{err}");
    let ds: serde_json::Value = serde_json::from_str(&out).expect("json");
    assert_eq!(ds["zero_optimization"]["overlap_comm"], false);
    assert_eq!(
        ds["zero_optimization"]["stage3_param_persistence_threshold"],
        0
    );
}

/// `--checkpointing-reentrant`: plans at least as much as non-reentrant for LoRA (held block
/// outputs; transformers hooks the embedding gradient under both, so on GPT-2 the peaks are
/// equal), needs `--checkpointing` (the error names the field), is saved in `.vramlab.json`
/// and exported as `use_reentrant: True`.
#[test]
fn reentrant_checkpointing_flag_plans_saves_and_is_checked() {
    let base = [
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "4",
        "--seq",
        "256",
        "--finetune",
        "lora",
        "--checkpointing",
        "--json",
    ];
    let peak = |extra: &[&str]| {
        let (code, out, err) = vramlab_code(&[&base[..], extra].concat());
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
        v["peak_allocated_bytes"].as_u64().expect("peak")
    };
    let plain = peak(&[]);
    let reentrant = peak(&["--checkpointing-reentrant"]);
    assert!(reentrant >= plain, "{reentrant} < {plain}");
    let (code, _, err) = vramlab_code(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "2",
        "--checkpointing-reentrant",
    ]);
    assert_ne!(code, Some(0));
    assert!(err.contains("checkpoint_reentrant"), "{err}");
    let (code, out, err) = vramlab_code(&[
        "export",
        "--format",
        "hf",
        "--model",
        "gpt2",
        "--batch",
        "2",
        "--checkpointing",
        "--checkpointing-reentrant",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"use_reentrant\": true"), "{out}");
    let dir = std::env::temp_dir().join(format!("vramlab-reentrant-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("r.vramlab.json");
    let f = file.to_str().expect("utf-8 path");
    let (code, _, err) = vramlab_code(&[
        "export",
        "--format",
        "vramlab",
        "--model",
        "gpt2",
        "--batch",
        "2",
        "--checkpointing",
        "--checkpointing-reentrant",
        "--output",
        f,
    ]);
    assert_eq!(code, Some(0), "{err}");
    let saved = std::fs::read_to_string(&file).expect("saved");
    assert!(saved.contains("\"checkpoint_reentrant\": true"), "{saved}");
    let (code, out, err) = vramlab_code(&["plan", "--config", f, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("peak_allocated_bytes"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--lora-merged`: an evaluation step with the adapters merged plans no more than the
/// unmerged one (less with autograd on), and a training step or full fine-tuning refuses it
/// naming the field.
#[test]
fn lora_merged_flag_is_for_adapter_evaluation_steps() {
    let base = [
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "4",
        "--seq",
        "256",
        "--finetune",
        "lora",
        "--lora-targets",
        "all-linear",
        "--step",
        "eval-grad",
        "--json",
    ];
    let peak = |extra: &[&str]| {
        let (code, out, err) = vramlab_code(&[&base[..], extra].concat());
        assert_eq!(code, Some(0), "{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
        v["peak_allocated_bytes"].as_u64().expect("peak")
    };
    let unmerged = peak(&[]);
    let merged = peak(&["--lora-merged"]);
    assert!(merged < unmerged, "{merged} >= {unmerged}");
    for bad in [&["--finetune", "lora"][..], &["--step", "eval"][..]] {
        let (code, _, err) = vramlab_code(
            &[
                &["plan", "--model", "gpt2", "--batch", "2", "--lora-merged"][..],
                bad,
            ]
            .concat(),
        );
        assert_ne!(code, Some(0), "{bad:?}");
        assert!(err.contains("lora_merged"), "{bad:?}: {err}");
    }
}

/// A multi-GPU bench the engines cannot run is refused before anything starts (no GPU
/// needed), saying what to do instead.
#[test]
fn bench_refuses_worlds_it_cannot_run() {
    let base = ["bench", "--model", "gpt2", "--batch", "4"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra.iter()).copied().collect()
    };
    fails_with(
        &with(&["--gpus", "4", "--strategy", "fsdp2", "--engine", "native"]),
        "the native engine runs one GPU; use --engine torch",
    );
    let multi = with(&[
        "--gpus",
        "4",
        "--nodes",
        "2",
        "--strategy",
        "ddp",
        "--engine",
        "torch",
    ]);
    fails_with(
        &multi,
        "python -m torch.distributed.run --nnodes 2 --nproc_per_node 4",
    );
    fails_with(&multi, "\"strategy\":\"ddp\"");
    fails_with(
        &with(&["--gpus", "2", "--strategy", "zero3", "--engine", "torch"]),
        "DeepSpeed",
    );
    fails_with(
        &with(&[
            "--gpus",
            "2",
            "--strategy",
            "fsdp2",
            "--offload",
            "optimizer",
            "--engine",
            "torch",
        ]),
        "--offload optimizer",
    );
}

/// DeepSpeed's stages go to the DeepSpeed runner: a Python without DeepSpeed is refused
/// before anything starts, saying how to install it; offload is no longer refused under
/// DeepSpeed; its own limits are (no GPU needed: a fake Python answers).
#[cfg(unix)]
#[test]
fn bench_deepspeed_needs_deepspeed_in_the_python() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("vramlab-cli-ds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let python = dir.join("python");
    std::fs::write(
        &python,
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'deepspeed'\" >&2\nexit 1\n",
    )
    .expect("fake python");
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let py = python.display().to_string();
    let base = [
        "bench", "--model", "gpt2", "--batch", "4", "--engine", "torch",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter()
            .chain(extra.iter())
            .map(|s| s.to_string())
            .chain(["--python".to_string(), py.clone()])
            .collect()
    };
    let run = |args: Vec<String>, needle: &str| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&refs, needle);
    };
    for s in ["zero1", "zero2", "zero3"] {
        run(
            with(&["--gpus", "2", "--strategy", s]),
            "DeepSpeed is not importable in",
        );
    }
    run(
        with(&["--gpus", "2", "--strategy", "zero2"]),
        "-m pip install deepspeed",
    );
    run(
        with(&[
            "--gpus",
            "4",
            "--strategy",
            "zero3",
            "--offload",
            "optimizer",
        ]),
        "No module named 'deepspeed'",
    );
    run(
        with(&["--gpus", "2", "--strategy", "zero2", "--optimizer", "sgd"]),
        "--optimizer sgd",
    );
    // FSDP2 still refuses offload, and does not ask for DeepSpeed.
    let (ok, _, err) = vramlab(
        &with(&[
            "--gpus",
            "2",
            "--strategy",
            "fsdp2",
            "--offload",
            "optimizer",
        ])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert!(
        !ok && err.contains("DeepSpeed only") && !err.contains("not importable"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A DDP plan that does not fit is offered the same GPUs under a sharded strategy, in text
/// (the change and its communication cost) and in JSON (the config's strategy and world).
#[test]
fn fit_offers_a_sharded_strategy_to_a_ddp_plan_that_does_not_fit() {
    let base = [
        "fit",
        "--model",
        "gpt2-xl",
        "--gpus",
        "4",
        "--strategy",
        "ddp",
        "--gpu",
        "rtx-4090",
        "--batch",
        "8",
    ];
    let (code, out, err) = vramlab_code(&base);
    assert_eq!(code, Some(0), "{out} {err}");
    assert!(
        out.contains("strategy ddp → zero3 (DeepSpeed ZeRO-3)"),
        "{out}"
    );
    // FSDP2 is no longer offered within the plan budget: LoRA under FSDP2 has no measured row
    // (its band is widened), and full FSDP2 is planned after the budget runs out.
    assert!(out.contains("about 1.5× DDP's traffic"), "{out}");
    let (code, json, err) = vramlab_code(&[&base[..], &["--json"]].concat());
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    let list = v["candidates"].as_array().expect("candidates");
    assert_ne!(list[0]["is_user_config"], true);
    let sharded: Vec<&serde_json::Value> = list
        .iter()
        .filter(|c| {
            c["changes"]
                .as_array()
                .expect("changes")
                .iter()
                .any(|w| w.as_str().is_some_and(|w| w.starts_with("strategy ddp → ")))
        })
        .collect();
    assert!(!sharded.is_empty(), "{json}");
    for c in sharded {
        let d = &c["config"]["distributed"];
        assert_ne!(d["strategy"], "ddp");
        assert_eq!(d["gpus_per_node"], 4);
    }
    // The user's strategy keeps its own candidates.
    assert!(
        list.iter()
            .any(|c| c["config"]["distributed"]["strategy"] == "ddp")
    );
}

/// Every plan shows the measured error band of its mode (a line in the text, `error_band` in
/// the JSON), and the verdict is judged at the upper edge of the reserved band; a mode with
/// no measured row says so and gets a wider band.
#[test]
fn plan_shows_the_measured_error_band_of_its_mode() {
    let (ok, out, err) = vramlab(&["plan", "--model", "gpt2", "--batch", "8"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("measured error band (gpt2/full/none, "),
        "{out}"
    );
    assert!(
        out.contains("judged at the upper edge of the measured band: "),
        "{out}"
    );
    let (ok, json, err) = vramlab(&["plan", "--model", "gpt2", "--batch", "8", "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    let b = &v["error_band"];
    assert_eq!(b["mode"], "gpt2/full/none");
    assert_eq!(b["measured"], true);
    assert_eq!(b["widened"], false);
    assert!(b["rows"].as_u64().expect("rows") >= 3);
    for (peak, planned) in [
        ("allocated", v["peak_allocated_bytes"].as_u64().expect("a")),
        ("reserved", v["peak_reserved_bytes"].as_u64().expect("r")),
    ] {
        let e = &b[peak];
        assert_eq!(e["planned_bytes"].as_u64(), Some(planned));
        let lo = e["lower_bytes"].as_u64().expect("lower");
        let hi = e["upper_bytes"].as_u64().expect("upper");
        assert!(
            lo <= planned && planned <= hi,
            "{peak}: {lo} {planned} {hi}"
        );
        assert!(
            e["min_error_pct"].as_f64().expect("min") <= e["max_error_pct"].as_f64().expect("max")
        );
    }
    let upper = b["reserved"]["upper_bytes"].as_u64().expect("upper");
    let context = v["cuda_context_bytes"].as_u64().expect("context");
    assert_eq!(v["nvidia_smi_upper_bytes"].as_u64(), Some(upper + context));
    // Nobody measured LoRA under FSDP2.
    let args = [
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "4",
        "--finetune",
        "lora",
        "--gpus",
        "2",
        "--strategy",
        "fsdp2",
    ];
    let (ok, out, err) = vramlab(&args);
    assert!(ok, "{err}");
    assert!(
        out.contains("no measurements for this mode (gpt2/lora/fsdp2)"),
        "{out}"
    );
    let (ok, json, err) = vramlab(&[&args[..], &["--json"]].concat());
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    assert_eq!(v["error_band"]["measured"], false);
    assert_eq!(v["error_band"]["widened"], true);
    assert!(
        v["error_band"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("no measurements for this mode"))
    );
}

/// Nothing fits and no single remedy does: `plan` prints the fit search's best answer in
/// one line, the `vramlab fit` command with the same arguments, and LoRA / QLoRA.
#[test]
fn plan_points_to_fit_when_no_remedy_fits() {
    let args = [
        "plan",
        "--model",
        "Meta-Llama-3-8B",
        "--seq",
        "2048",
        "--batch",
        "4",
        "--gpu",
        "rtx-4090",
    ];
    let (ok, out, err) = vramlab(&args);
    assert!(ok, "{err}");
    assert!(out.contains("DOES NOT FIT"), "{out}");
    assert!(out.contains("Next step: no single remedy fits."), "{out}");
    assert!(out.contains("  best combination: "), "{out}");
    assert!(
        out.contains("vramlab fit --model Meta-Llama-3-8B --seq 2048 --batch 4 --gpu rtx-4090"),
        "{out}"
    );
    // Remedies that add memory come after the rest, as costs.
    if let Some(at) = out.find("adds memory here (costs, not remedies):") {
        let costs = &out[at..out.find("Next step").unwrap_or(out.len())];
        assert!(!costs.contains(" fits"), "{costs}");
    }
    let (ok, out, err) = vramlab(&[&args[..], &["--json"]].concat());
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert!(
        v["fit_command"]
            .as_str()
            .is_some_and(|c| c.starts_with("vramlab fit --model Meta-Llama-3-8B")),
        "{v}"
    );
}

/// `export --help` names peft, `plan --help` every fine-tuning mode; a LoRA plan's HF
/// arguments are refused naming the formats that carry the adapters; known ids are filled.
#[test]
fn exports_name_peft_and_carry_or_refuse_adapters() {
    let (ok, out, _) = vramlab(&["export", "--help"]);
    assert!(ok && out.contains("peft"), "{out}");
    let (ok, out, _) = vramlab(&["plan", "--help"]);
    assert!(ok && out.contains("full|lora|qlora"), "{out}");
    let lora = [
        "export",
        "--model",
        "Meta-Llama-3-8B",
        "--batch",
        "1",
        "--finetune",
        "lora",
        "--format",
    ];
    fails_with(&[&lora[..], &["hf"]].concat(), "--format peft");
    fails_with(&[&lora[..], &["lightning"]].concat(), "--format peft");
    for f in ["peft", "pytorch"] {
        let (ok, out, err) = vramlab(&[&lora[..], &[f]].concat());
        assert!(ok, "{err}");
        assert!(
            out.contains("MODEL = \"meta-llama/Meta-Llama-3-8B\"")
                && out.contains("get_peft_model(model, lora_config)")
                && !out.contains("your/model-id"),
            "{out}"
        );
    }
}
