//! Fine-tuning flags: LoRA (rank, targets, dropout, merged), freezing, reentrant
//! checkpointing, and the peft exports.

use super::{fails_with, vramlab, vramlab_code};

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
