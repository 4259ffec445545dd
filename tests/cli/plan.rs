//! `plan` and `max-batch`: the JSON fields, the human table, presets, saved plans, the GPU
//! detected, evaluation steps, captured models and the error band.

use super::{fails_with, vramlab};
use std::process::Command;

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
