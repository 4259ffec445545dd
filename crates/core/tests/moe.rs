//! Mixture-of-experts decoders imported from config.json (mixtral, qwen2_moe, qwen3_moe):
//! exact parameter counts, the routing-imbalance setting, key errors, and the accuracy
//! targets on the measured rows (`tests/data/t5_moe.jsonl`, from `lab/grids/t5_moe_configs.jsonl`).

use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::hf;
use vramlab_core::plan::{Planner, TrainConfig};
use vramlab_core::validate::{compare, parse_lines};

const MOE: [&str; 3] = ["mixtral", "qwen2_moe", "qwen3_moe"];

fn config(name: &str) -> String {
    std::fs::read_to_string(crate::data(&format!("hf_configs/{name}")))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `sum(p.numel())` of transformers 5.17's `from_config` on the meta device
/// (`lab/cpu/hf_param_counts.py`), two configs per MoE type.
#[test]
fn moe_parameter_counts_equal_transformers() {
    let text = std::fs::read_to_string(crate::data("hf_param_counts.jsonl")).expect("counts");
    let mut per_type = std::collections::BTreeMap::<String, usize>::new();
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("json line");
        let mt = r["model_type"].as_str().expect("model_type");
        if !MOE.contains(&mt) {
            continue;
        }
        let name = r["config"].as_str().expect("config");
        let preset = hf::from_config_text(&config(name), name).expect("import");
        assert!(preset.is_moe(), "{name}");
        assert_eq!(hf::family_label(&preset), mt);
        let g = preset.build(128, AttnImpl::Sdpa).expect("build");
        assert_eq!(
            g.param_count(),
            r["params"].as_u64().expect("params"),
            "{name}"
        );
        *per_type.entry(mt.to_string()).or_default() += 1;
    }
    for t in MOE {
        assert!(
            per_type.get(t).copied().unwrap_or(0) >= 2,
            "{t}: {per_type:?}"
        );
    }
}

fn device_preset(name: &str) -> vramlab_core::model::preset::Preset {
    let path = crate::data(&format!("hf_configs_device/{name}.json"));
    let text = std::fs::read_to_string(&path).expect("device config");
    hf::from_config_text(&text, name).expect("import")
}

fn peak(preset: &vramlab_core::model::preset::Preset, cfg: &TrainConfig) -> u64 {
    Planner::new(preset, cfg)
        .expect("plan")
        .peaks(cfg.batch)
        .expect("peaks")
        .allocated
        .0
}

/// A larger routing imbalance never plans less memory, and a real one plans more.
#[test]
fn imbalance_factor_is_monotone() {
    for name in [
        "Mixtral-8x7B-v0.1-L1",
        "Qwen1.5-MoE-A2.7B-L2",
        "Qwen3-30B-A3B-L2",
    ] {
        let preset = device_preset(name);
        let mut last = 0;
        for f in [1.0, 1.25, 2.0, 4.0] {
            let cfg = TrainConfig {
                batch: 16,
                size: Some(1024),
                moe_imbalance: f,
                ..TrainConfig::default()
            };
            let p = peak(&preset, &cfg);
            assert!(p >= last, "{name}: imbalance {f} plans {p} < {last}");
            if f > 1.0 {
                assert!(p > last, "{name}: imbalance {f} plans no more memory");
            }
            last = p;
        }
    }
}

#[test]
fn imbalance_is_refused_below_one_and_for_dense_models() {
    let preset = device_preset("Qwen3-30B-A3B-L2");
    for bad in [0.5, f64::NAN, f64::INFINITY] {
        let cfg = TrainConfig {
            moe_imbalance: bad,
            ..TrainConfig::default()
        };
        let err = Planner::new(&preset, &cfg)
            .map(|_| ())
            .expect_err("refused")
            .to_string();
        assert!(err.contains("moe_imbalance"), "{err}");
    }
    let dense = hf::from_config_text(&config("Qwen3-0.6B.json"), "Qwen3-0.6B").expect("import");
    let cfg = TrainConfig {
        moe_imbalance: 2.0,
        ..TrainConfig::default()
    };
    let err = Planner::new(&dense, &cfg)
        .map(|_| ())
        .expect_err("dense refused")
        .to_string();
    assert!(err.contains("moe_imbalance"), "{err}");
    // The default plans a dense model as before.
    assert!(Planner::new(&dense, &TrainConfig::default()).is_ok());
}

/// Saved configs without the field load as uniform routing; the field round-trips.
#[test]
fn imbalance_round_trips_and_defaults_to_uniform() {
    let cfg = TrainConfig {
        moe_imbalance: 1.5,
        ..TrainConfig::default()
    };
    let text = serde_json::to_string(&cfg).expect("json");
    assert!(text.contains("\"moe_imbalance\":1.5"), "{text}");
    let back: TrainConfig = serde_json::from_str(&text).expect("parse");
    assert_eq!(back.moe_imbalance, 1.5);
    let plain = serde_json::to_string(&TrainConfig::default()).expect("json");
    assert!(!plain.contains("moe_imbalance"), "{plain}");
    let old: TrainConfig = serde_json::from_str(&plain).expect("old file");
    assert_eq!(old.moe_imbalance, 1.0);
}

#[test]
fn missing_and_wrong_typed_moe_keys_are_named() {
    let cases = [
        ("Mixtral-8x7B-v0.1.json", "num_local_experts"),
        ("Qwen1.5-MoE-A2.7B.json", "num_experts"),
        ("Qwen1.5-MoE-A2.7B.json", "shared_expert_intermediate_size"),
        ("Qwen3-30B-A3B.json", "moe_intermediate_size"),
        ("Qwen3-30B-A3B.json", "num_experts_per_tok"),
    ];
    for (file, key) in cases {
        let mut v: serde_json::Value = serde_json::from_str(&config(file)).expect("json");
        v.as_object_mut().expect("object").remove(key);
        let err = hf::from_config(&v, file).expect_err("missing").to_string();
        assert!(
            err.contains(key) && err.contains("missing"),
            "{file} {key}: {err}"
        );
        v[key] = serde_json::json!("eight");
        let err = hf::from_config(&v, file)
            .expect_err("wrong type")
            .to_string();
        assert!(err.contains(key), "{file} {key}: {err}");
    }
    let mut v: serde_json::Value =
        serde_json::from_str(&config("Qwen3-30B-A3B.json")).expect("json");
    v["mlp_only_layers"] = serde_json::json!([0, "one"]);
    let err = hf::from_config(&v, "x").expect_err("bad list").to_string();
    assert!(err.contains("mlp_only_layers"), "{err}");
    v["mlp_only_layers"] = serde_json::json!([]);
    v["num_experts_per_tok"] = serde_json::json!(200);
    let err = hf::from_config(&v, "x").expect_err("k > E").to_string();
    assert!(err.contains("num_experts_per_tok"), "{err}");
}

/// Dense layers between sparse ones (`decoder_sparse_step`, `mlp_only_layers`) take the
/// dense MLP's parameters; the shared expert and router logits change what they should.
#[test]
fn sparse_step_and_mlp_only_layers_change_the_layers() {
    let base: serde_json::Value =
        serde_json::from_str(&config("Qwen3-30B-A3B.json")).expect("json");
    let count = |v: &serde_json::Value| {
        hf::from_config(v, "x")
            .expect("import")
            .build(64, AttnImpl::Sdpa)
            .expect("build")
            .param_count()
    };
    let all_sparse = count(&base);
    let mut v = base.clone();
    v["mlp_only_layers"] = serde_json::json!([0]);
    let one_dense = count(&v);
    // One layer: experts + router replaced by the dense MLP (hidden 2048, 6144 wide).
    let experts = 128 * 3 * 2048 * 768 + 128 * 2048;
    let dense = 3 * 2048 * 6144;
    assert_eq!(one_dense + experts - dense, all_sparse);
    let mut v = base.clone();
    v["decoder_sparse_step"] = serde_json::json!(2);
    assert_eq!(count(&v) + 24 * experts - 24 * dense, all_sparse);
    // The aux loss's per-layer softmax is saved: more memory, same parameters.
    let preset = device_preset("Qwen3-30B-A3B-L2");
    let mut v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(crate::data("hf_configs_device/Qwen3-30B-A3B-L2.json"))
            .expect("config"),
    )
    .expect("json");
    v["output_router_logits"] = serde_json::json!(true);
    let aux = hf::from_config(&v, "aux").expect("import");
    let cfg = TrainConfig {
        batch: 16,
        size: Some(1024),
        ..TrainConfig::default()
    };
    assert!(peak(&aux, &cfg) > peak(&preset, &cfg));
}

/// The issue's targets per MoE `model_type` on the device rows (H200, transformers 5.17,
/// random-init routers ≈ uniform routing): allocated median ≤ 2 %, worst ≤ 8 %, reserved
/// median ≤ 4 %.
#[test]
fn moe_rows_within_targets_per_model_type() {
    std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
    let text = std::fs::read_to_string(crate::data("t5_moe.jsonl")).expect("t5_moe.jsonl");
    // The file holds the T5 rows of the same device run too: keep the MoE configs.
    let measured: Vec<_> = parse_lines(&text)
        .into_iter()
        .filter(|m| {
            std::fs::read_to_string(&m.model)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|v| MOE.iter().any(|t| v["model_type"] == *t))
        })
        .collect();
    let rows = compare(&measured).expect("every measured MoE row plans");
    for t in MOE {
        let fam: Vec<_> = rows.iter().filter(|r| r.family == t).collect();
        assert!(fam.len() >= 4, "{t}: only {} rows", fam.len());
        for r in &fam {
            println!(
                "{:<44} {:<44} alloc {:+6.1} %  reserved {:+6.1} %",
                r.model,
                r.config,
                r.allocated_error(),
                r.reserved_error()
            );
        }
        crate::accuracy::assert_within(t, fam.iter().copied(), crate::accuracy::ISSUE);
    }
}

/// MoE rows whose planned peak is in backward (`lab/grids/moe_backward_configs.jsonl`, H200,
/// session 9): the routed activations, gathered rows and grouped-GEMM inputs alive at the
/// peak. Until session 10 Mixtral's reserved was over-predicted here (+8.6 %, +10.5 %):
/// the experts' `gate, up = chunk(2)` got two whole-size gradients in the plan where
/// autograd makes two half-size ones and one `cat` (per-op trace, `Op::Chunk`); now +0.4 %,
/// +2.1 %. With the t5_moe.jsonl rows, the issue's targets hold per MoE `model_type`.
#[test]
fn moe_backward_peak_rows() {
    std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
    let text = std::fs::read_to_string(crate::data("moe_backward.jsonl")).expect("moe_backward");
    let rows = compare(&parse_lines(&text)).expect("every row plans");
    assert!(rows.len() >= 6, "only {} rows", rows.len());
    let alloc: Vec<f64> = rows.iter().map(|r| r.allocated_error()).collect();
    let reserved: Vec<f64> = rows.iter().map(|r| r.reserved_error()).collect();
    for r in &rows {
        println!(
            "{:<44} {:<44} alloc {:+6.2} %  reserved {:+6.2} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    let am = vramlab_core::validate::median_abs(alloc.iter().copied());
    let aw = vramlab_core::validate::max_abs(alloc.iter().copied());
    let rw = vramlab_core::validate::max_abs(reserved.iter().copied());
    assert!(
        am <= 2.0 && aw <= 8.0,
        "allocated median {am:.2} % worst {aw:.2} %"
    );
    assert!(rw <= 4.0, "reserved worst {rw:.2} %");
    // Per model_type over both files (the MoE rows of t5_moe.jsonl and these).
    let t5_moe = std::fs::read_to_string(crate::data("t5_moe.jsonl")).expect("t5_moe.jsonl");
    let more = compare(&parse_lines(&t5_moe)).expect("every row plans");
    for t in MOE {
        let fam: Vec<_> = rows
            .iter()
            .chain(more.iter())
            .filter(|r| r.family == t)
            .collect();
        assert!(fam.len() >= 6, "{t}: only {} rows", fam.len());
        crate::accuracy::assert_within(t, fam.iter().copied(), crate::accuracy::ISSUE);
    }
}
