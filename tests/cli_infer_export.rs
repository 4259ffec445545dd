//! `vramlab export --format transformers|vllm` with the inference flags (issue 29): the
//! script carries `plan`'s peaks, the `vllm serve` line `vramlab vllm`'s numbers, the
//! training formats are refused for an inference step and the inference formats for a
//! training step, and `--output` writes the same text.

use crate::cli_infer::{LLAMA, vramlab};

fn ok(args: &[&str]) -> String {
    let (ok, out, err) = vramlab(args);
    assert!(ok, "{args:?}: {err}");
    out
}

fn fails_with(args: &[&str], needles: &[&str]) {
    let (ok, _out, err) = vramlab(args);
    assert!(!ok, "{args:?} should fail");
    for n in needles {
        assert!(err.contains(n), "{args:?}: stderr {err:?} lacks {n:?}");
    }
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
}

/// The planned peaks written into the script are `plan --json`'s, and the call is the
/// planned one.
#[test]
fn transformers_script_carries_the_plans_peaks() {
    let call = [
        "--model",
        LLAMA,
        "--gpu",
        "h100",
        "--step",
        "generate",
        "--seq",
        "512",
        "--new-tokens",
        "64",
        "--batch",
        "3",
        "--kv-cache",
        "static",
        "--precision",
        "fp16",
    ];
    let mut plan = vec!["plan", "--json"];
    plan.extend_from_slice(&call);
    let v: serde_json::Value = serde_json::from_str(&ok(&plan)).expect("JSON");
    let mut export = vec!["export", "--format", "transformers"];
    export.extend_from_slice(&call);
    let s = ok(&export);
    for key in ["peak_allocated_bytes", "peak_reserved_bytes"] {
        let n = v[key].as_u64().expect(key);
        let name = key.trim_end_matches("_bytes").to_ascii_uppercase();
        assert!(
            s.contains(&format!("PLANNED_{name} = {n}  # bytes")),
            "{key} {n} not in:\n{s}"
        );
    }
    assert!(s.contains("BATCH, PROMPT = 3, 512"), "{s}");
    assert!(
        s.contains("dtype=torch.float16, attn_implementation=\"sdpa\""),
        "{s}"
    );
    assert!(
        s.contains("max_new_tokens=64, min_new_tokens=64, do_sample=False, cache_implementation=\"static\", disable_compile=True"),
        "{s}"
    );
    // a config.json file: vramlab does not know where the weights are
    assert!(s.contains("MODEL = \"your/model-id\"  # SET THIS"), "{s}");
}

/// A built-in preset names its Hub id; a prefill is a forward under no_grad; --quant and
/// --device-map write their from_pretrained arguments.
#[test]
fn transformers_script_names_the_hub_id_and_the_load() {
    let s = ok(&[
        "export",
        "--format",
        "Transformers",
        "--model",
        "TinyLlama-1.1B",
        "--step",
        "prefill",
        "--seq",
        "256",
    ]);
    assert!(
        s.contains("MODEL = \"TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T\""),
        "{s}"
    );
    assert!(
        s.contains("with torch.no_grad():\n        out = model(input_ids)"),
        "{s}"
    );
    assert!(
        s.contains("BATCH, PROMPT = 1, 256"),
        "the batch defaults to 1: {s}"
    );
    let base = [
        "export",
        "--format",
        "transformers",
        "--model",
        LLAMA,
        "--step",
        "generate",
        "--seq",
        "128",
        "--new-tokens",
        "8",
    ];
    let mut q = base.to_vec();
    q.extend_from_slice(&["--quant", "nf4", "--no-double-quant"]);
    let s = ok(&q);
    assert!(
        s.contains("quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=\"nf4\", bnb_4bit_use_double_quant=False, bnb_4bit_compute_dtype=torch.bfloat16)"),
        "{s}"
    );
    let mut m = base.to_vec();
    m.extend_from_slice(&["--device-map", "auto", "--max-gpu-memory", "1.5GiB"]);
    let s = ok(&m);
    assert!(
        s.contains(
            "device_map=\"auto\", max_memory={0: \"1536MiB\", \"cpu\": psutil.virtual_memory().available}"
        ) && s.contains("import psutil"),
        "{s}"
    );
}

/// `--max-num-seqs` is the floor of `vramlab vllm`'s concurrency at that very setting, and
/// one more sequence would not fit; the blocks are `vramlab vllm`'s.
#[test]
fn vllm_command_is_vllms_capacity() {
    let s = ok(&[
        "export",
        "--format",
        "vllm",
        "--model",
        LLAMA,
        "--gpu",
        "rtx-4090",
        "--step",
        "generate",
        "--seq",
        "8000",
        "--new-tokens",
        "192",
        "--batch",
        "4",
        "--gpu-memory-utilization",
        "0.85",
    ]);
    assert!(
        s.contains("planned from vLLM's source, not measured on a GPU"),
        "{s}"
    );
    let seqs: u64 = s
        .split("--max-num-seqs ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no --max-num-seqs in {s}"));
    assert!(s.contains("--max-model-len 8192 \\"), "{s}");
    assert!(s.contains("--gpu-memory-utilization 0.85 \\"), "{s}");
    assert!(s.contains("--dtype bfloat16 \\"), "{s}");
    let capacity = |n: u64| -> serde_json::Value {
        let n = n.to_string();
        let out = ok(&[
            "vllm",
            "--model",
            LLAMA,
            "--gpu",
            "rtx-4090",
            "--max-model-len",
            "8192",
            "--gpu-memory-utilization",
            "0.85",
            "--max-num-seqs",
            &n,
            "--json",
        ]);
        serde_json::from_str(&out).expect("JSON")
    };
    let at = capacity(seqs);
    let conc = at["max_concurrency"].as_f64().expect("max_concurrency");
    assert_eq!(conc.floor() as u64, seqs, "{at}");
    let blocks = at["num_blocks"].as_u64().expect("num_blocks");
    assert!(
        s.contains(&format!("{blocks} blocks of 16 tokens")),
        "{blocks} not in {s}"
    );
    let more = capacity(seqs + 1);
    assert!(
        more["max_concurrency"].as_f64().expect("conc").floor() < (seqs + 1) as f64,
        "{} sequences would fit too: {more}",
        seqs + 1
    );
    assert!(!s.contains("--quantization"), "{s}");
}

#[test]
fn formats_of_the_other_kind_of_step_are_refused() {
    let infer = [
        "export",
        "--model",
        LLAMA,
        "--step",
        "generate",
        "--seq",
        "64",
        "--new-tokens",
        "4",
    ];
    for f in [
        "hf",
        "deepspeed",
        "lightning",
        "peft",
        "pytorch",
        "vramlab",
        "bogus",
    ] {
        let mut a = infer.to_vec();
        a.extend_from_slice(&["--format", f]);
        fails_with(&a, &[&format!("--format {f}"), "transformers, vllm"]);
    }
    for f in ["transformers", "vllm"] {
        fails_with(
            &[
                "export", "--format", f, "--model", "gpt2", "--batch", "2", "--seq", "128",
            ],
            &[
                &format!("--format {f}"),
                "--step generate|prefill",
                "deepspeed",
            ],
        );
    }
    // the training exports still work, and `transformers` no longer means hf
    let hf = ok(&[
        "export", "--format", "hf", "--model", "gpt2", "--batch", "2", "--seq", "128",
    ]);
    assert!(hf.contains("per_device_train_batch_size"), "{hf}");
    let mut a = infer.to_vec();
    a.extend_from_slice(&[
        "--format",
        "transformers",
        "--gpu-memory-utilization",
        "0.8",
    ]);
    fails_with(&a, &["--gpu-memory-utilization", "--format vllm"]);
}

#[test]
fn vllm_refuses_what_vllm_does_not_run() {
    let base = ["export", "--format", "vllm", "--model", LLAMA];
    let cases: [(&[&str], &str); 5] = [
        (&["--step", "prefill", "--seq", "64"], "--step"),
        (
            &[
                "--step",
                "generate",
                "--seq",
                "64",
                "--new-tokens",
                "4",
                "--kv-cache",
                "static",
            ],
            "--kv-cache",
        ),
        (
            &[
                "--step",
                "generate",
                "--seq",
                "64",
                "--new-tokens",
                "4",
                "--quant",
                "int8",
            ],
            "--quant",
        ),
        (
            &[
                "--step",
                "generate",
                "--seq",
                "64",
                "--new-tokens",
                "4",
                "--device-map",
                "auto",
                "--max-gpu-memory",
                "1GiB",
            ],
            "--device-map",
        ),
        (
            &[
                "--step",
                "generate",
                "--seq",
                "64",
                "--new-tokens",
                "4",
                "--do-sample",
            ],
            "--do-sample",
        ),
    ];
    for (extra, needle) in cases {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        fails_with(&a, &[needle]);
    }
    // Llama 3.1 8B's bf16 weights alone exceed a T4's 0.9 × 15 GiB: vLLM would not start
    fails_with(
        &[
            "export",
            "--format",
            "vllm",
            "--model",
            "tests/data/hf_configs/Llama-3.1-8B.json",
            "--gpu",
            "t4",
            "--step",
            "generate",
            "--seq",
            "1000",
            "--new-tokens",
            "24",
        ],
        &["--seq / --new-tokens", "vLLM would refuse to start"],
    );
}

/// `--output FILE` writes what standard output would have shown, and says so.
#[test]
fn output_file_holds_the_export() {
    let dir = std::env::temp_dir().join(format!("vramlab-infer-export-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for format in ["transformers", "vllm"] {
        let path = dir.join(format!("{format}.out"));
        let path_s = path.to_string_lossy().into_owned();
        let args = [
            "export",
            "--format",
            format,
            "--model",
            LLAMA,
            "--step",
            "generate",
            "--seq",
            "256",
            "--new-tokens",
            "16",
        ];
        let shown = ok(&args);
        let mut to_file = args.to_vec();
        to_file.extend_from_slice(&["--output", &path_s]);
        let said = ok(&to_file);
        assert_eq!(said.trim(), format!("wrote {path_s} ({format})"));
        assert_eq!(std::fs::read_to_string(&path).expect("written"), shown);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
