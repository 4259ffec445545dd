//! The estimator against every measured row in tests/data (PyTorch on an H200).
//! Thresholds are the product's accuracy targets.

use vramlab_core::validate::{compare, max_abs, median_abs, parse_lines, summary};

fn rows(files: &[&str]) -> Vec<vramlab_core::validate::Row> {
    // Rows of imported models name their config.json relative to the repository root.
    std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
    let mut measured = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(crate::data(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        measured.extend(parse_lines(&text));
    }
    compare(&measured).expect("every measured row plans")
}

/// Bounds on a set's |errors| in percent: allocated median and worst, reserved median.
pub struct Targets {
    pub alloc_median: f64,
    pub alloc_worst: f64,
    pub reserved_median: f64,
}

/// The product's general targets (the built-in presets' sets, per family).
pub const GENERAL: &Targets = &Targets {
    alloc_median: 3.0,
    alloc_worst: 10.0,
    reserved_median: 5.0,
};

/// The reach issues' targets (imports, fine-tuning, captures).
pub const ISSUE: &Targets = &Targets {
    alloc_median: 2.0,
    alloc_worst: 8.0,
    reserved_median: 4.0,
};

/// Prints `label`'s summary line and asserts its rows within `t`.
pub fn assert_within<'a>(
    label: &str,
    rows: impl Iterator<Item = &'a vramlab_core::validate::Row> + Clone,
    t: &Targets,
) {
    let n = rows.clone().count();
    let alloc_median = median_abs(rows.clone().map(|r| r.allocated_error()));
    let alloc_worst = max_abs(rows.clone().map(|r| r.allocated_error()));
    let reserved_median = median_abs(rows.map(|r| r.reserved_error()));
    println!(
        "{label}: {n} rows, allocated median {alloc_median:.2} % worst {alloc_worst:.2} %, reserved median {reserved_median:.2} %"
    );
    assert!(
        alloc_median <= t.alloc_median,
        "{label}: allocated median {alloc_median:.2} %"
    );
    assert!(
        alloc_worst <= t.alloc_worst,
        "{label}: allocated worst {alloc_worst:.2} %"
    );
    assert!(
        reserved_median <= t.reserved_median,
        "{label}: reserved median {reserved_median:.2} %"
    );
}

/// Prints each fine-tuning row with its planned trainable count and asserts the count
/// equals the measured one (peft's `get_nb_trainable_parameters()`, or PyTorch's
/// `requires_grad` sum for a partial full fine-tune).
fn print_and_check_trainable(rows: &[vramlab_core::validate::Row]) {
    for r in rows {
        println!(
            "{:<52} {:<70} alloc {:+6.2} %  reserved {:+6.2} %  trainable {}",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error(),
            r.predicted_trainable
        );
        assert_eq!(
            r.measured_trainable,
            Some(r.predicted_trainable),
            "{} {}",
            r.model,
            r.config
        );
    }
}

fn check(files: &[&str]) {
    let rows = rows(files);
    assert!(rows.len() >= 25, "too few measured rows: {}", rows.len());
    println!("{}", summary(&rows));
    for r in &rows {
        println!(
            "{:<22} {:<44} alloc {:+6.1} %  reserved {:+6.1} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    assert_within("set", rows.iter(), GENERAL);
}

#[test]
fn calibration_set_within_targets() {
    check(&["calibration.jsonl"]);
}

#[test]
fn holdout_set_within_targets() {
    check(&["holdout.jsonl"]);
}

/// Measured mid-session, after the first tuning round on the calibration set; later rule
/// changes were driven by calibration rows and this set was only reported.
#[test]
fn second_holdout_set_within_targets() {
    check(&["holdout2.jsonl"]);
}

/// Measured at the end of the session, after every rule change, and never tuned on.
#[test]
fn third_holdout_set_within_targets() {
    check(&["holdout3.jsonl"]);
}

/// Measured after the convolution-workspace rule was written from per-convolution
/// measurements (lab/device/conv_workspace.py), on an H100 (PyTorch 2.11, cuDNN 9.19); its
/// whole-model rows were never tuned on.
#[test]
fn fourth_holdout_set_within_targets() {
    check(&["holdout4.jsonl"]);
}

/// 44 configurations drawn at random (`lab/grids/make_holdout5.py`, seed 5) and measured on the
/// H200 after session 5's rule changes (residual-add gradients, weight-gradient partials, stem
/// workspaces), before any of its rows was looked at.
#[test]
fn fifth_holdout_set_within_targets() {
    check(&["holdout5.jsonl"]);
}

const ALL: [&str; 6] = [
    "calibration.jsonl",
    "holdout.jsonl",
    "holdout2.jsonl",
    "holdout3.jsonl",
    "holdout4.jsonl",
    "holdout5.jsonl",
];

/// The targets hold per model family over every measured row, not only on average.
#[test]
fn every_family_within_targets() {
    let rows = rows(&ALL);
    let families: [(&str, &[&str]); 4] = [
        (
            "CNN",
            &["resnet", "efficientnet", "mobilenet_v3", "convnext"],
        ),
        ("ViT", &["vit"]),
        ("segmentation", &["deeplabv3", "fcn", "unet"]),
        ("language models", &["gpt2", "bert", "llama"]),
    ];
    for (name, members) in families {
        let fam: Vec<_> = rows
            .iter()
            .filter(|r| members.contains(&r.family.as_str()))
            .collect();
        assert!(fam.len() >= 20, "{name}: only {} rows", fam.len());
        assert_within(name, fam.iter().copied(), GENERAL);
    }
}

/// Hugging Face models imported from their config.json (`tests/data/hf_configs_device/`:
/// public configs with fewer layers), both loop shapes, fp32 / AMP bf16 / bf16, with and
/// without checkpointing (`lab/grids/hf_import_configs.jsonl`, H200, transformers 5.17). The
/// issue's targets, per `model_type`: allocated median ≤ 2 %, worst ≤ 8 %, reserved median
/// ≤ 4 %.
#[test]
fn hf_import_within_targets_per_model_type() {
    let rows = rows(&[
        "hf_import.jsonl",
        "hf_import_probe.jsonl",
        "hf_import_neox.jsonl",
    ]);
    let mut types: Vec<&str> = rows.iter().map(|r| r.family.as_str()).collect();
    types.sort_unstable();
    types.dedup();
    let mut supported = vramlab_core::model::hf::SUPPORTED.to_vec();
    // The MoE types are measured in t5_moe.jsonl (`moe::moe_rows_within_targets_per_model_type`).
    supported.retain(|t| !["mixtral", "qwen2_moe", "qwen3_moe"].contains(t));
    // Encoder-decoders are measured in their own file (t5_moe_within_targets_per_model_type).
    supported.retain(|t| *t != "t5");
    // Issue 30's ten types are measured in their own pre-registered grids
    // (tests/data/grid30/, `grid30::grid30_fit_rows_are_within_issue_30s_targets` and
    // `grid30::grid30_new_fit_rows_are_within_issue_30s_targets`).
    supported.retain(|t| {
        ![
            "olmo2",
            "granite",
            "starcoder2",
            "smollm3",
            "falcon",
            "bart",
            "modernbert",
            "deberta-v2",
            "deepseek_v3",
            "gpt_oss",
        ]
        .contains(t)
    });
    supported.sort_unstable();
    assert_eq!(types, supported);
    for t in types {
        let fam: Vec<_> = rows.iter().filter(|r| r.family == t).collect();
        assert!(fam.len() >= 16, "{t}: only {} rows", fam.len());
        let loops = fam
            .iter()
            .filter(|r| r.config.contains("trainer-loop"))
            .count();
        assert!(loops >= 4 && loops < fam.len(), "{t}: both loop shapes");
        assert_within(t, fam.iter().copied(), ISSUE);
    }
}

/// T5 (`T5ForConditionalGeneration` from config.json, source `seq` and target `target_seq`
/// tokens; `lab/grids/t5_moe_configs.jsonl`, H200, transformers 5.17) against the issue's
/// per-family targets: allocated median ≤ 2 %, worst ≤ 8 %, reserved median ≤ 4 %.
#[test]
fn t5_within_targets() {
    // The file also holds MoE rows (another import branch): only the rows with a target.
    std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
    let text = std::fs::read_to_string(crate::data("t5_moe.jsonl")).expect("t5_moe.jsonl");
    let measured: Vec<_> = parse_lines(&text)
        .into_iter()
        .filter(|m| m.target_seq.is_some())
        .collect();
    let rows = compare(&measured).expect("every T5 row plans");
    assert!(rows.iter().all(|r| r.family == "t5"));
    assert!(rows.len() >= 8, "t5: only {} rows", rows.len());
    for r in &rows {
        println!(
            "{:<22} {:<44} alloc {:+6.1} %  reserved {:+6.1} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    assert_within("t5", rows.iter(), ISSUE);
}

/// The T5 rows the lead measures (`lab/grids/t5_moe_configs.jsonl`) plan, carrying their
/// target length into the plan.
#[test]
fn t5_device_configs_plan_with_their_target() {
    std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
    let text = std::fs::read_to_string("lab/grids/t5_moe_configs.jsonl").expect("configs");
    let lines: Vec<String> = text
        .lines()
        .filter(|l| l.contains("target_seq"))
        .map(|l| l.replacen('{', r#"{"peak_allocated": 1, "peak_reserved": 1, "#, 1))
        .collect();
    assert!(lines.len() >= 8, "{} T5 configs", lines.len());
    let measured = parse_lines(&lines.join("\n"));
    assert_eq!(measured.len(), lines.len());
    let rows = compare(&measured).expect("every T5 config plans");
    assert!(
        rows.iter()
            .all(|r| r.family == "t5" && r.predicted_allocated > 0)
    );
    let longer = parse_lines(&lines[0].replace(r#""target_seq": 128"#, r#""target_seq": 512"#));
    let longer = compare(&longer).expect("plans");
    assert!(longer[0].predicted_allocated > rows[0].predicted_allocated);
}

/// The trainer loop shape (output released before backward) on presets measured before
/// only with the plain loop.
#[test]
fn trainer_loop_presets_within_targets() {
    let rows = rows(&["loop_presets.jsonl"]);
    assert_eq!(rows.len(), 8);
    for r in &rows {
        assert!(r.config.contains("trainer-loop"), "{}", r.config);
        assert!(r.allocated_error().abs() <= 2.0, "{} {}", r.model, r.config);
    }
}

/// peft 0.21 LoRA on GPT-2 and a Llama-style config (`lab/grids/lora_configs.jsonl`, H200):
/// ranks 8–64, attention-only / all-linear / named targets, fp32 / AMP bf16 / bf16 base,
/// with and without checkpointing, both loop shapes. Trainable parameter counts equal
/// peft's `get_nb_trainable_parameters()` (what `print_trainable_parameters` prints); the
/// issue's targets: allocated median ≤ 2 %, worst ≤ 8 %, reserved median ≤ 4 %.
#[test]
fn lora_within_targets_and_trainable_counts_exact() {
    let rows = rows(&["lora.jsonl"]);
    assert!(rows.len() >= 12, "only {} LoRA rows", rows.len());
    print_and_check_trainable(&rows);
    for r in &rows {
        assert!(r.config.contains(" lora "), "{}", r.config);
    }
    assert_within("LoRA", rows.iter(), ISSUE);
}

/// The evaluation step after two training steps (`lab/grids/eval_configs.jsonl`, H200): one
/// validation forward + loss in `model.eval()`, under `torch.no_grad()` ("eval") and without it
/// ("eval-grad": the seed articles' validation OOM), on GPT-2, BERT, ViT, ResNet, ConvNeXt,
/// EfficientNet and imported Qwen2.5, Llama 3.2 and Gemma 2 configs, fp32 / AMP / bf16.
/// Two no-grad vision rows under-predict by 5–8 % (ViT-B/16 −8.3 %, ConvNeXt-T −5.4 %,
/// untraced); the bounds are the product's general targets. What the doctor reports — how
/// much `no_grad` saves — must match the measured difference within 10 %.
#[test]
fn eval_step_within_targets_and_no_grad_saving_measured() {
    let rows = rows(&["eval_step.jsonl"]);
    assert!(rows.len() >= 20, "only {} evaluation rows", rows.len());
    for r in &rows {
        assert!(r.config.contains("eval"), "{}", r.config);
        println!(
            "{:<52} {:<56} alloc {:+6.1} %  reserved {:+6.1} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    assert_within(
        "eval",
        rows.iter(),
        &Targets {
            alloc_median: 2.0,
            alloc_worst: 10.0,
            reserved_median: 4.0,
        },
    );
    let mut pairs = 0;
    for g in rows.iter().filter(|r| r.config.ends_with("eval-grad-step")) {
        let base = g.config.replace("eval-grad-step", "eval-step");
        let Some(n) = rows.iter().find(|r| r.model == g.model && r.config == base) else {
            continue;
        };
        let measured = g.measured_allocated as f64 - n.measured_allocated as f64;
        let predicted = g.predicted_allocated as f64 - n.predicted_allocated as f64;
        let err = 100.0 * (predicted - measured) / measured;
        println!(
            "{} {}: no_grad saves {measured:.0} B measured, {predicted:.0} B planned ({err:+.1} %)",
            g.model, base
        );
        assert!(
            measured > 0.0 && err.abs() <= 10.0,
            "{} {base}: {err:+.1} %",
            g.model
        );
        pairs += 1;
    }
    assert!(pairs >= 8, "only {pairs} eval / eval-grad pairs");
}

/// More than one GPU, per rank (`crates/device/runners/dist_runner.py`, H200, PyTorch 2.11): FSDP2
/// (`fully_shard` per block + root) as rank 0 of a world of 2, 4 and 8 under the fake
/// process group, GPT-2 and Llama-style configs, with and without checkpointing,
/// `MixedPrecisionPolicy` and `reshard_after_forward` on and off, both loop shapes; DDP at
/// world size 1 with NCCL. The issue's targets: allocated median ≤ 3 %, worst ≤ 10 %,
/// reserved median ≤ 5 %.
#[test]
fn distributed_per_rank_within_targets() {
    let rows = rows(&["distributed.jsonl"]);
    assert!(rows.len() >= 40, "only {} distributed rows", rows.len());
    for r in &rows {
        println!(
            "{:<52} {:<56} alloc {:+6.1} %  reserved {:+6.1} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    for (what, needle) in [
        ("world 2", "fsdp2×2"),
        ("world 4", "fsdp2×4"),
        ("world 8", "fsdp2×8"),
        ("checkpointing", " ckpt "),
        ("DDP", "ddp×1"),
        ("DDP gradient_as_bucket_view", "bucket-view"),
        ("trainer loop", "trainer-loop"),
        ("MixedPrecisionPolicy bf16", "mp-bf16"),
        ("MixedPrecisionPolicy fp16", "mp-fp16"),
        ("reshard_after_forward=False", "no-reshard"),
    ] {
        assert!(
            rows.iter().any(|r| r.config.contains(needle)),
            "no {what} row"
        );
    }
    assert!(rows.iter().any(|r| r.model.contains("gpt2")));
    assert!(rows.iter().any(|r| r.model.contains("Llama")));
    assert_within("distributed", rows.iter(), GENERAL);
}

/// QLoRA (bitsandbytes 0.50.2 NF4 / FP4 with and without double quantization, LLM.int8)
/// under peft 0.21, and the bitsandbytes optimizers (AdamW8bit, PagedAdamW8bit,
/// PagedAdamW32bit) on LoRA and QLoRA (`lab/grids/qlora_configs.jsonl`, H200): GPT-2, BERT,
/// Llama-style and imported Qwen2 configs, ranks 8–64, attention-only / all-linear, with
/// and without checkpointing, both loop shapes. Trainable counts exact; together with
/// `lora.jsonl` and `lora_dropout.jsonl` (`lora_dropout=0.05` on GPT-2, BERT, Llama-style and
/// Qwen2 configs, LoRA and QLoRA, `lab/grids/lora_dropout_configs.jsonl`) the issue's targets
/// over all LoRA + QLoRA rows.
#[test]
fn qlora_and_bnb_optimizers_within_targets() {
    let d = rows(&["lora_dropout.jsonl"]);
    assert!(d.len() >= 8, "only {} LoRA dropout rows", d.len());
    print_and_check_trainable(&d);
    for r in &d {
        assert!(r.config.contains(" dropout 0.05"), "{}", r.config);
    }
    let q = rows(&["qlora.jsonl"]);
    assert!(q.len() >= 16, "only {} QLoRA / bnb rows", q.len());
    print_and_check_trainable(&q);
    let loops = q
        .iter()
        .filter(|r| r.config.contains("trainer-loop"))
        .count();
    assert!(loops >= 4 && loops < q.len(), "both loop shapes");
    let all = rows(&["lora.jsonl", "qlora.jsonl", "lora_dropout.jsonl"]);
    assert!(all.len() >= 40, "{} LoRA + QLoRA rows", all.len());
    for (name, set) in [
        ("LoRA dropout", &d),
        ("QLoRA/bnb", &q),
        ("LoRA + QLoRA", &all),
    ] {
        assert_within(name, set.iter(), ISSUE);
    }
}

/// Partial full fine-tuning (`lab/grids/freeze_configs.jsonl`, H200, session 9): every
/// `nn.Embedding` and/or the first N blocks `requires_grad_(False)` on GPT-2, BERT, a
/// Llama-style and the imported Qwen2.5 config, AMP / bf16 / fp32, with and without
/// checkpointing, both loops. The issue's targets, and trainable counts equal to PyTorch's.
#[test]
fn partial_fine_tuning_within_targets_and_trainable_counts_exact() {
    let f = rows(&["freeze.jsonl"]);
    assert!(f.len() >= 12, "{} rows", f.len());
    print_and_check_trainable(&f);
    for r in &f {
        assert!(r.config.contains("freeze"), "{}", r.config);
    }
    assert!(f.iter().any(|r| r.config.contains("trainer-loop")));
    assert_within("partial fine-tuning", f.iter(), ISSUE);
}

/// PyTorch's ZeRO-1 (DDP + `ZeroRedundancyOptimizer`) as rank 0 of a world of 2, 4, 8 under
/// the fake process group (`lab/grids/dist_zero_configs.jsonl`, H200, session 9): allocated within
/// issue 17's targets; reserved over-predicted on the fp32 rows (+7 … +13 %: the allocator
/// model keeps DDP's rebuilt buckets apart from the optimizer-state blocks more than PyTorch
/// does) — bounded here, and the whole per-rank set (FSDP2, DDP, ZeRO-1) held to the targets.
#[test]
fn torch_zero1_per_rank_within_targets() {
    let z = rows(&["distributed_zero1.jsonl"]);
    assert!(z.len() >= 12, "only {} rows", z.len());
    for r in &z {
        println!(
            "{:<52} {:<64} alloc {:+6.2} %  reserved {:+6.2} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
        assert!(r.config.contains("torch-zero1"), "{}", r.config);
    }
    let alloc_worst = max_abs(z.iter().map(|r| r.allocated_error()));
    let reserved_worst = max_abs(z.iter().map(|r| r.reserved_error()));
    assert!(alloc_worst <= 1.0, "allocated worst {alloc_worst:.2} %");
    assert!(
        reserved_worst <= 15.0,
        "reserved worst {reserved_worst:.2} %"
    );
    let all = rows(&["distributed.jsonl", "distributed_zero1.jsonl"]);
    assert_within("per rank, all strategies", all.iter(), GENERAL);
}

/// Reentrant checkpointing (`use_reentrant=True`, `enable_input_require_grads` for LoRA;
/// `lab/grids/reentrant_configs.jsonl`, H200, session 9; the QLoRA rows did not run: the
/// bitsandbytes wheel did not fit in that call's upload; measured in session 10: allocated
/// within 1 %, reserved −2 … −16 % as for the other QLoRA rows): GPT-2, Llama-style and
/// Qwen2.5, LoRA attn / all-linear, QLoRA and full, both loops — the issue's targets.
#[test]
fn reentrant_checkpointing_within_targets() {
    let r = rows(&["reentrant.jsonl"]);
    assert!(r.len() >= 8, "{} rows", r.len());
    assert!(r.iter().all(|x| x.config.contains("reentrant")));
    assert!(r.iter().any(|x| x.config.contains("trainer-loop")));
    assert_within("reentrant checkpointing", r.iter(), ISSUE);
}

/// Merged adapters (`merge_and_unload`) in evaluation steps against the same adapters
/// unmerged (`lab/grids/merged_configs.jsonl`, H200, session 9; its two QLoRA rows in session 10):
/// LoRA allocated within 0.5 %, QLoRA within 1.1 %. With autograd on, a merged model records
/// no graph (nothing requires grad): planned as such since this run showed it (first plan:
/// +104 %). Reserved of the LoRA evaluation steps is over-predicted (+10 … +13 %, as for the
/// older eval rows) — bounded here.
#[test]
fn merged_adapters_in_evaluation_within_targets() {
    let m = rows(&["merged.jsonl"]);
    assert!(m.len() >= 4, "{} rows", m.len());
    assert!(m.iter().any(|x| x.config.contains("merged")));
    assert!(m.iter().any(|x| !x.config.contains("merged")));
    assert!(m.iter().any(|x| x.config.contains("qlora")));
    assert!(max_abs(m.iter().map(|x| x.allocated_error())) <= 1.5);
    assert!(max_abs(m.iter().map(|x| x.reserved_error())) <= 15.0);
}

/// The runners measure the third step of a process (two warm-up steps, `WARMUP = 2` in
/// `crates/device/runners/torch_runner.py`); the events hold the warm-up step and the
/// measured one, and where the measured step still reserved a segment the plan replays it
/// until the cache repeats (`eval::later_steps`). TinyLlama-1.1B, b8, seq 2048, AMP bf16
/// (`calibration.jsonl`): the two steps of the events reserve 68.25 GB at most, the third
/// one more segment (70.34 GB planned); 69.63 GB was measured (−2.0 % → +1.0 %).
#[test]
fn the_steps_after_the_measured_one_are_planned() {
    use vramlab_core::plan::Planner;
    use vramlab_core::plan::allocator::CachingAllocator;
    use vramlab_core::plan::config::AllocatorConfig;
    let text = std::fs::read_to_string(crate::data("calibration.jsonl")).expect("calibration");
    let m = parse_lines(&text)
        .into_iter()
        .find(|m| {
            m.model == "TinyLlama-1.1B" && m.batch == 8 && m.seq == Some(2048) && m.accum == 1
        })
        .expect("the TinyLlama b8 row");
    let preset = vramlab_core::model::preset::find_builtin(&m.model).expect("preset");
    let planner = Planner::new(&preset, &m.config().expect("config")).expect("plan");
    let ev = &planner.events;
    let mut a = CachingAllocator::new(AllocatorConfig::default());
    assert_eq!(crate::replay_events(ev, 8, &mut a), None);
    let two_steps = a.peak_reserved;
    let planned = planner.peaks(8).expect("peaks").reserved.0;
    let measured = m.peak_reserved.expect("reserved");
    println!("two steps {two_steps}, planned {planned}, measured {measured}");
    assert!(planned > two_steps, "the later steps reserve more");
    assert!(planned.abs_diff(measured) < two_steps.abs_diff(measured));
}
