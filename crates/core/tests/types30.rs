//! The decoders of issue 30 imported from config.json (olmo2, granite, starcoder2, smollm3,
//! falcon):
//! exact parameter counts against transformers 5.17, the ops each one's forward runs that
//! the Llama decoder does not, key errors, and the refusal of what is not modelled.

use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::hf;
use vramlab_core::model::ir::{Graph, Op, Pointwise};
use vramlab_core::model::{ModelSpec, Preset};
use vramlab_core::plan::{Planner, Precision, TrainConfig};

const TYPES: [&str; 5] = ["olmo2", "granite", "starcoder2", "smollm3", "falcon"];

fn import(name: &str) -> Preset {
    let text = std::fs::read_to_string(crate::data(&format!("hf_configs/{name}.json")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    hf::from_config_text(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn graph(name: &str) -> Graph {
    import(name)
        .build(64, AttnImpl::Sdpa)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn named<'a>(g: &'a Graph, suffix: &str) -> Vec<&'a vramlab_core::model::ir::Node> {
    g.nodes
        .iter()
        .filter(|n| g.name(n).ends_with(suffix))
        .collect()
}

/// `sum(p.numel())` of `AutoModelForCausalLM.from_config` on the meta device
/// (`lab/cpu/hf_param_counts.py`, transformers 5.17), two or more configs per type.
#[test]
fn parameter_counts_equal_transformers() {
    let text = std::fs::read_to_string(crate::data("hf_param_counts.jsonl")).expect("counts");
    let mut per_type = std::collections::BTreeMap::<String, usize>::new();
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("json line");
        let mt = r["model_type"].as_str().expect("model_type");
        if !TYPES.contains(&mt) {
            continue;
        }
        let name = r["config"]
            .as_str()
            .expect("config")
            .trim_end_matches(".json");
        let preset = import(name);
        assert_eq!(hf::family_label(&preset), mt);
        assert_eq!(
            graph(name).param_count(),
            r["params"].as_u64().expect("params"),
            "{name}"
        );
        *per_type.entry(mt.to_string()).or_default() += 1;
    }
    for t in TYPES {
        assert!(
            per_type.get(t).copied().unwrap_or(0) >= 2,
            "{t}: {per_type:?}"
        );
    }
}

/// OLMo 2: no pre-norms, norms on the attention and MLP outputs, q/k norms over the whole
/// projection, the norm's product in fp32 (the Gemma-style norm op).
#[test]
fn olmo2_norms_follow_the_sub_layers() {
    let g = graph("OLMo-2-0425-1B");
    assert!(named(&g, "input_layernorm").is_empty());
    assert!(named(&g, "pre_feedforward_layernorm").is_empty());
    let layers = 16;
    for norm in [
        "post_attention_layernorm",
        "post_feedforward_layernorm",
        "q_norm",
        "k_norm",
    ] {
        let nodes = named(&g, norm);
        assert_eq!(nodes.len(), layers, "{norm}");
        assert!(
            nodes
                .iter()
                .all(|n| matches!(n.op, Op::RmsNormOffset { .. })),
            "{norm}"
        );
    }
    // q_norm's weight has heads × head_dim = 2048 elements (Qwen3's would have 128).
    let q = named(&g, "q_norm")[0];
    assert_eq!(g.params[q.params[0]].elems, 2048);
    // post_attention_layernorm reads o_proj's output, not the residual stream.
    let post = named(&g, "layers.0.post_attention_layernorm")[0];
    let o = named(&g, "layers.0.self_attn.o_proj")[0];
    assert_eq!(post.inputs[0], o.output);
}

/// Granite: the embeddings, both residual branches and the logits are scaled (new tensors);
/// the logits' copy is a second vocabulary-sized tensor, so the plain loop's peak grows.
#[test]
fn granite_multipliers_are_ops() {
    let p = import("granite-3.1-2b-instruct");
    let ModelSpec::Llama(lp) = &p.spec else {
        panic!("decoder")
    };
    let m = lp.multipliers.expect("multipliers");
    assert_eq!(
        (
            m.embedding_multiplier,
            m.residual_multiplier,
            m.logits_scaling
        ),
        (12.0, 0.22, 8.0)
    );
    assert_eq!(m.attention_multiplier, 0.015625);
    let g = p.build(64, AttnImpl::Sdpa).expect("build");
    let scaled = |suffix: &str| {
        named(&g, suffix)
            .iter()
            .filter(|n| {
                matches!(
                    n.op,
                    Op::Pointwise {
                        f: Pointwise::Scale,
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(scaled("embedding_multiplier"), 1);
    assert_eq!(scaled("residual_multiplier_1"), 40);
    assert_eq!(scaled("residual_multiplier_2"), 40);
    assert_eq!(scaled("logits_scaling"), 1);
    // `logits / logits_scaling` writes a second vocabulary-sized tensor while lm_head's
    // output is alive (freed after the division: a scalar division saves nothing).
    let div = named(&g, "logits_scaling")[0];
    assert_eq!(g.tensors[div.output].per_sample, 64 * 49_155);
    assert_eq!(div.inputs[0], named(&g, "lm_head")[0].output);
    // The loss's fp32 copies outweigh that transient: the planned peak does not rise, and it
    // never falls below the same model without the multipliers.
    let mut p = p.clone();
    if let ModelSpec::Llama(lp) = &mut p.spec {
        lp.num_hidden_layers = 2;
    }
    let mut plain = p.clone();
    if let ModelSpec::Llama(lp) = &mut plain.spec {
        lp.multipliers = None;
    }
    let cfg = TrainConfig {
        batch: 8,
        size: Some(1024),
        precision: Precision::AmpBf16,
        ..TrainConfig::default()
    };
    let with = Planner::new(&p, &cfg)
        .expect("plan")
        .peaks(8)
        .expect("peaks");
    let without = Planner::new(&plain, &cfg)
        .expect("plan")
        .peaks(8)
        .expect("peaks");
    assert!(
        with.allocated.0 >= without.allocated.0,
        "{with:?} {without:?}"
    );
}

/// StarCoder2: LayerNorm with bias, the non-gated c_fc / c_proj MLP with biases, dropout
/// after the embeddings, o_proj and the MLP (0.1 in the public configs).
#[test]
fn starcoder2_layer_norms_biases_and_dropouts() {
    let g = graph("starcoder2-3b");
    assert!(
        g.nodes
            .iter()
            .filter(|n| matches!(n.op, Op::LayerNorm { .. }))
            .count()
            == 2 * 30 + 1
    );
    assert!(!g.nodes.iter().any(|n| matches!(n.op, Op::RmsNorm { .. })));
    assert_eq!(named(&g, "mlp.c_fc").len(), 30);
    assert!(named(&g, "mlp.gate_proj").is_empty());
    for n in named(&g, "mlp.c_fc")
        .into_iter()
        .chain(named(&g, "self_attn.o_proj"))
    {
        assert_eq!(n.params.len(), 2, "{} has a bias", g.name(n));
    }
    let drops = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Dropout { .. }))
        .count();
    assert_eq!(drops, 1 + 2 * 30);
    let ModelSpec::Llama(p) = &import("starcoder2-3b").spec else {
        panic!("decoder")
    };
    assert_eq!(p.sliding_window, Some(4096));
    assert_eq!(p.layer_window(0), Some(4096));
}

/// SmolLM3: every fourth layer skips RoPE (`no_rope_layers`); with `use_sliding_window`
/// exactly those layers slide.
#[test]
fn smollm3_layers_without_rope() {
    let g = graph("SmolLM3-3B");
    assert_eq!(named(&g, "rope_q").len(), 36 - 9);
    assert!(named(&g, "layers.3.rope_q").is_empty());
    assert_eq!(named(&g, "layers.4.rope_q").len(), 1);
    let ModelSpec::Llama(p) = &import("SmolLM3-3B").spec else {
        panic!("decoder")
    };
    assert_eq!(p.sliding_window, None);
    let ModelSpec::Llama(p) = &import("SmolLM3-small-sliding").spec else {
        panic!("decoder")
    };
    assert_eq!(p.nope_layers, vec![2, 5, 8, 11]);
    assert_eq!(p.layer_window(2), Some(1024));
    assert_eq!(p.layer_window(3), None);
}

#[test]
fn smollm3_keys_are_named() {
    let text = std::fs::read_to_string(crate::data("hf_configs/SmolLM3-3B.json")).expect("cfg");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v["no_rope_layers"] = serde_json::json!([1, 1, 0]);
    let err = hf::from_config(&v, "x").expect_err("short").to_string();
    assert!(err.contains("no_rope_layers"), "{err}");
    v["no_rope_layers"] = serde_json::Value::Null;
    v["use_sliding_window"] = serde_json::json!(true);
    v["sliding_window"] = serde_json::json!(512);
    v["layer_types"] = serde_json::json!(["sliding_attention"]);
    let err = hf::from_config(&v, "x").expect_err("short").to_string();
    assert!(err.contains("layer_types"), "{err}");
}

/// Falcon-7B: multi-query (one key/value head copied out of the fused projection), one
/// LayerNorm shared by the parallel attention and MLP; under SDPA PyTorch's math path. Falcon-40B: the new architecture's two LayerNorms, k and v broadcast to
/// every head and copied, the float mask kept by the fused kernel.
#[test]
fn falcon_layouts() {
    let p = import("falcon-7b");
    let g = p.build(64, AttnImpl::Sdpa).expect("sdpa");
    let math = named(&g, "h.0.self_attention")[0];
    assert!(
        matches!(
            math.op,
            Op::SdpaBias {
                bias_grad: true,
                heads: 71,
                ..
            }
        ),
        "{:?}",
        math.op
    );
    assert_eq!(named(&g, "h.0.self_attention.merge_heads").len(), 1);
    let g = p.build(64, AttnImpl::Eager).expect("eager");
    assert_eq!(named(&g, "input_layernorm").len(), 32);
    assert!(named(&g, "ln_mlp").is_empty());
    let k = named(&g, "h.0.self_attention.key_index")[0];
    assert_eq!(g.tensors[k.output].per_sample, 64 * 64);
    assert_eq!(named(&g, "h.0.self_attention.repeat_k").len(), 1);
    let g = graph("falcon-40b");
    assert_eq!(named(&g, "ln_attn").len(), 60);
    assert_eq!(named(&g, "ln_mlp").len(), 60);
    let k = named(&g, "h.0.self_attention.key_broadcast")[0];
    assert_eq!(g.tensors[k.output].per_sample, 64 * 8192);
    let mask = named(&g, "h.0.self_attention.float_mask")[0];
    assert_eq!(g.tensors[mask.output].per_sample, 64 * 64);
    let sdpa = g
        .nodes
        .iter()
        .find(|n| matches!(n.op, Op::SdpaBias { .. }))
        .expect("sdpa with the mask");
    assert_eq!(sdpa.inputs[3], mask.output);
    let err = hf::from_config_text(
        r#"{"model_type": "falcon", "alibi": true, "hidden_size": 64, "num_attention_heads": 4}"#,
        "x",
    )
    .expect_err("alibi")
    .to_string();
    assert!(err.contains("alibi"), "{err}");
}

/// Inference mirrors the Llama lineage's forward only: the new decoders are refused, naming
/// the type, not planned as a Llama.
#[test]
fn inference_of_the_new_decoders_is_refused() {
    use vramlab_core::plan::inference::shape::DecoderShape;
    for name in [
        "OLMo-2-0425-1B",
        "granite-3.1-2b-instruct",
        "starcoder2-3b",
        "SmolLM3-3B",
        "falcon-7b",
    ] {
        let p = import(name);
        let err = DecoderShape::of(&p).expect_err(name).to_string();
        assert!(err.contains("not modelled"), "{name}: {err}");
    }
}

/// The unknown-type error lists the new types and points at the closest.
#[test]
fn unknown_types_point_at_the_new_ones() {
    for (t, want) in [
        ("olmo", "olmo2"),
        ("olmo3", "olmo2"),
        ("granitemoe", "granite"),
        ("starcoder", "starcoder2"),
        ("smollm", "smollm3"),
        ("falcon_mamba", "falcon"),
    ] {
        let err = hf::from_config_text(&format!(r#"{{"model_type": "{t}"}}"#), "x")
            .expect_err(t)
            .to_string();
        assert!(err.contains(&format!("closest is {want}")), "{t}: {err}");
        for new in TYPES {
            assert!(err.contains(new), "{t}: {err}");
        }
    }
}

/// Issue 30's pre-registered device grid (`lab/grids/make_grid30.py`; not measured yet): every
/// row of both thirds plans, on one H200, with each type at two sizes, each precision, both
/// checkpointing settings and both loop shapes.
#[test]
fn grid30_rows_plan() {
    use vramlab_core::validate::{model_file, parse_lines};
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut seen = std::collections::BTreeSet::new();
    let mut n = 0;
    for file in ["grid30_configs.jsonl", "grid30_untouched_configs.jsonl"] {
        let text = std::fs::read_to_string(format!("{root}/lab/grids/{file}")).expect(file);
        let rows = parse_lines(&text);
        assert_eq!(rows.len(), text.lines().count(), "{file}");
        for m in rows {
            let preset = model_file(&format!("{root}/{}", m.model)).expect("model");
            let cfg = m.config().expect("config");
            let peaks = Planner::new(&preset, &cfg)
                .and_then(|p| p.peaks(m.batch))
                .unwrap_or_else(|e| panic!("{}: {e}", m.model));
            assert!(peaks.reserved.0 < 141 << 30, "{}: {peaks:?}", m.model);
            let mt = hf::family_label(&preset);
            seen.insert((mt.clone(), "model", m.model.clone()));
            seen.insert((mt.clone(), "precision", m.precision.clone()));
            seen.insert((mt.clone(), "ckpt", m.checkpointing.to_string()));
            seen.insert((mt, "loop", format!("{:?}", m.loop_shape)));
            n += 1;
        }
    }
    assert_eq!(n, 60);
    for t in TYPES {
        let count = |axis: &str| seen.iter().filter(|(m, a, _)| m == t && *a == axis).count();
        assert_eq!(
            (
                count("model"),
                count("precision"),
                count("ckpt"),
                count("loop")
            ),
            (2, 3, 2, 2),
            "{t}"
        );
    }
}

/// A sliding window not longer than the sequence makes transformers materialise the mask (and
/// SDPA repeat k/v): not modelled, and the plan says so, naming the key; not below it.
#[test]
fn a_window_shorter_than_the_sequence_is_said() {
    let p = import("SmolLM3-small-sliding");
    let plan = |seq, attention| {
        let cfg = TrainConfig {
            batch: 1,
            size: Some(seq),
            attention,
            ..TrainConfig::default()
        };
        Planner::new(&p, &cfg).expect("plan").unmodelled
    };
    use vramlab_core::plan::Attention;
    let notes = plan(2048, Attention::Sdpa);
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("sliding_window 1024") && notes[0].contains("repeat_kv"),
        "{notes:?}"
    );
    assert_eq!(plan(1024, Attention::Sdpa).len(), 1);
    assert!(plan(1023, Attention::Sdpa).is_empty());
    assert!(plan(2048, Attention::Eager).is_empty());
    let starcoder = import("starcoder2-3b");
    let cfg = TrainConfig {
        batch: 1,
        size: Some(512),
        ..TrainConfig::default()
    };
    assert!(
        Planner::new(&starcoder, &cfg)
            .expect("plan")
            .unmodelled
            .is_empty()
    );
}
