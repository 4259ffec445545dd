//! Bad input: unknown names (with the closest valid one), batch 0, absurd sizes, malformed
//! preset files — a non-zero exit, a message naming the field, never a panic.

use super::{fails_with, vramlab, vramlab_code};

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

/// Every subcommand's `--help` states each default once: clap appends `[default: …]` for a
/// `default_value`, and a doc comment that also says it printed it twice (capture's
/// `--precision`).
#[test]
fn help_states_each_default_once() {
    let (ok, top, err) = vramlab(&["--help"]);
    assert!(ok, "{err}");
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() >= 10, "{commands:?}");
    for c in &commands {
        let (ok, help, err) = vramlab(&[c.as_str(), "--help"]);
        assert!(ok, "{c} --help: {err}");
        for line in help.lines() {
            assert!(
                line.matches("[default:").count() <= 1,
                "vramlab {c} --help: {line}"
            );
        }
    }
}
