//! BART (`model_type: bart`, `BartForConditionalGeneration`) imported from config.json as
//! options of the encoder-decoder builder: exact parameter counts against transformers
//! 5.17, the ops its forward runs that T5's does not, the saved tensors of a CPU training
//! forward, and the keys that are refused.

use std::collections::BTreeSet;

use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::hf;
use vramlab_core::model::ir::{Graph, Node, Op, Pointwise};
use vramlab_core::model::{ModelSpec, Preset};
use vramlab_core::plan::rules;
use vramlab_core::plan::{Attention, DType, Planner, Precision, TrainConfig};

fn import(name: &str) -> Preset {
    let text = std::fs::read_to_string(crate::data(&format!("hf_configs/{name}.json")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    hf::from_config_text(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn graph(name: &str, seq: u64, target: u64, imp: AttnImpl) -> Graph {
    import(name)
        .build_with(seq, Some(target), imp)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn named<'a>(g: &'a Graph, suffix: &str) -> Vec<&'a Node> {
    g.nodes
        .iter()
        .filter(|n| g.name(n).ends_with(suffix))
        .collect()
}

/// `sum(p.numel())` of `AutoModelForSeq2SeqLM.from_config` on the meta device
/// (`lab/cpu/hf_param_counts.py`, transformers 5.17): bart-base, bart-large and
/// bart-large-cnn (one token fewer).
#[test]
fn parameter_counts_equal_transformers() {
    let text = std::fs::read_to_string(crate::data("hf_param_counts.jsonl")).expect("counts");
    let mut n = 0;
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("json line");
        if r["model_type"] != "bart" {
            continue;
        }
        assert_eq!(r["class"], "BartForConditionalGeneration");
        let name = r["config"]
            .as_str()
            .expect("config")
            .trim_end_matches(".json");
        let preset = import(name);
        assert_eq!(hf::family_label(&preset), "bart");
        assert!(preset.is_seq2seq());
        for imp in [AttnImpl::Sdpa, AttnImpl::Eager] {
            assert_eq!(
                graph(name, 64, 32, imp).param_count(),
                r["params"].as_u64().expect("params"),
                "{name}"
            );
        }
        n += 1;
    }
    assert!(n >= 3, "{n} bart rows");
}

/// The keys that shape memory land in the builder's BART options.
#[test]
fn keys_become_options() {
    let p = import("bart-base");
    let ModelSpec::T5(t) = &p.spec else {
        panic!("encoder-decoder")
    };
    let o = t.bart.as_ref().expect("bart options");
    assert_eq!(
        (t.d_model, t.d_kv, t.d_ff, t.num_heads),
        (768, 64, 3072, 12)
    );
    assert_eq!((t.num_layers, t.num_decoder_layers), (6, 6));
    assert_eq!(t.dense_act_fn, "gelu");
    assert!(!t.is_gated_act && !t.scale_decoder_outputs);
    assert_eq!((o.attention_dropout, o.activation_dropout), (0.1, 0.1));
    assert_eq!(o.max_position_embeddings, 1024);
    let cnn = import("bart-large-cnn");
    let ModelSpec::T5(c) = &cnn.spec else {
        panic!("encoder-decoder")
    };
    let co = c.bart.as_ref().expect("bart options");
    assert_eq!((co.attention_dropout, co.activation_dropout), (0.0, 0.0));
    assert_eq!(c.vocab_size, 50264);
    // The default length is the position table's.
    assert!(matches!(
        p.input,
        vramlab_core::model::InputSpec::Tokens { seq_len: 1024 }
    ));
}

/// Post-LayerNorm: each norm reads the residual sum, with weight and bias; the embeddings
/// are normed too; no final norm after either stack.
#[test]
fn norms_follow_the_residual_adds() {
    let g = graph("bart-base", 128, 64, AttnImpl::Sdpa);
    for (norm, count) in [
        ("self_attn_layer_norm", 12),
        ("encoder_attn_layer_norm", 6),
        ("final_layer_norm", 12),
        ("layernorm_embedding", 2),
    ] {
        let nodes = named(&g, norm);
        assert_eq!(nodes.len(), count, "{norm}");
        for n in nodes {
            assert!(matches!(n.op, Op::LayerNorm { .. }), "{norm}");
            assert_eq!(n.params.len(), 2, "{norm}: weight and bias");
        }
    }
    assert!(
        !g.nodes
            .iter()
            .any(|n| matches!(n.op, Op::T5LayerNorm { .. }))
    );
    let ln = named(&g, "model.encoder.layers.0.self_attn_layer_norm")[0];
    let add = g
        .nodes
        .iter()
        .find(|n| n.output == ln.inputs[0])
        .expect("producer");
    assert!(matches!(
        add.op,
        Op::Pointwise {
            f: Pointwise::Add,
            ..
        }
    ));
    // The last op before the head is the last layer's final_layer_norm.
    let head = named(&g, "lm_head")[0];
    let last = named(&g, "model.decoder.layers.5.final_layer_norm")[0];
    assert_eq!(head.inputs[0], last.output);
}

/// Biases on every projection and on fc1/fc2; learned positions (offset 2): per sample in
/// the encoder, batch-independent in the decoder; no relative bias, no cache.
#[test]
fn biases_positions_and_no_cache() {
    let (seq, target) = (200, 48);
    let g = graph("bart-base", seq, target, AttnImpl::Sdpa);
    for proj in ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"] {
        let nodes = named(&g, proj);
        assert!(!nodes.is_empty(), "{proj}");
        assert!(nodes.iter().all(|n| n.params.len() == 2), "{proj}: bias");
    }
    let pos: Vec<_> = named(&g, "embed_positions")
        .into_iter()
        .map(|n| {
            let t = &g.tensors[n.output];
            (t.per_sample, t.fixed, g.params[n.params[0]].elems)
        })
        .collect();
    assert_eq!(
        pos,
        vec![(seq * 768, 0, 1026 * 768), (0, target * 768, 1026 * 768)]
    );
    assert!(!g.nodes.iter().any(|n| n.op == Op::CacheAppend));
    assert!(named(&g, "relative_attention_bias").is_empty());
    // BartScaledWordEmbedding multiplies by embed_scale (1.0 here) all the same.
    assert_eq!(named(&g, "embed_tokens.embed_scale").len(), 2);
}

/// SDPA: fused kernels without a mask (encoder bidirectional, decoder `is_causal`,
/// cross-attention over the source length); eager: the decoder's causal mask once, per
/// sample, and attention dropout only where `attention_dropout` > 0.
#[test]
fn attention_paths() {
    let (seq, target) = (256, 96);
    let g = graph("bart-large", seq, target, AttnImpl::Sdpa);
    let fused: Vec<_> = g
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::Sdpa { seq, dropout, .. } => Some((seq, dropout, n.inputs.len())),
            _ => None,
        })
        .collect();
    assert_eq!(fused.len(), 24);
    assert!(fused.iter().all(|&(_, p, i)| p == 0.1 && i == 3));
    assert_eq!(fused.iter().filter(|f| f.0 == seq).count(), 12);
    let cross: Vec<_> = g
        .nodes
        .iter()
        .filter_map(|n| match n.op {
            Op::SdpaBias {
                q_len,
                kv_len,
                bias_grad,
                ..
            } => Some((q_len, kv_len, bias_grad, n.inputs.len())),
            _ => None,
        })
        .collect();
    assert_eq!(cross, vec![(target, seq, false, 3); 12]);

    let e = graph("bart-large", seq, target, AttnImpl::Eager);
    let masks = named(&e, "causal_mask");
    assert_eq!(masks.len(), 1);
    assert_eq!(e.tensors[masks[0].output].per_sample, target * target);
    assert_eq!(named(&e, "add_mask").len(), 12);
    assert_eq!(named(&e, "attn_dropout").len(), 36);
    assert_eq!(named(&e, "activation_dropout").len(), 24);
    let cnn = graph("bart-large-cnn", seq, target, AttnImpl::Eager);
    assert!(named(&cnn, "attn_dropout").is_empty());
    assert!(named(&cnn, "activation_dropout").is_empty());
    assert_eq!(named(&cnn, "softmax").len(), 36);
}

/// `lm_logits + final_logits_bias`: a second vocabulary-sized tensor, fp32 under autocast
/// (the buffer is fp32), so AMP plans more than the same step without it would.
#[test]
fn final_logits_bias_is_a_second_logits_tensor() {
    let g = graph("bart-base", 128, 64, AttnImpl::Sdpa);
    let add = named(&g, "add_final_logits_bias");
    assert_eq!(add.len(), 1);
    assert_eq!(g.tensors[add[0].output].per_sample, 64 * 50265);
    let loss = g.nodes.last().expect("loss");
    assert_eq!(loss.inputs[0], add[0].output);
    assert!(matches!(
        loss.op,
        Op::CrossEntropy {
            rows: 64,
            classes: 50265,
            upcast: false
        }
    ));
}

/// Every precision, both attention paths and checkpointing plan; longer targets cost more.
#[test]
fn plans_every_precision() {
    let p = import("bart-large");
    let mut last = 0;
    for target in [64, 256] {
        for precision in [Precision::Fp32, Precision::AmpBf16, Precision::Bf16] {
            for attention in [Attention::Sdpa, Attention::Eager] {
                for checkpointing in [false, true] {
                    let cfg = TrainConfig {
                        batch: 4,
                        size: Some(512),
                        target_seq: Some(target),
                        precision,
                        attention,
                        checkpointing,
                        ..TrainConfig::default()
                    };
                    let peak = Planner::new(&p, &cfg)
                        .and_then(|pl| pl.peaks(4))
                        .unwrap_or_else(|e| panic!("{precision:?} {attention:?}: {e}"))
                        .allocated
                        .0;
                    assert!(peak > 406_291_456 * 2, "{peak}");
                    if precision == Precision::Fp32
                        && attention == Attention::Sdpa
                        && !checkpointing
                    {
                        assert!(peak > last, "target {target}");
                        last = peak;
                    }
                }
            }
        }
    }
}

/// Lengths past the position table are refused, for the source and for the target.
#[test]
fn lengths_past_the_table_are_refused() {
    let p = import("bart-base");
    let err = p
        .build_with(1025, Some(16), AttnImpl::Sdpa)
        .expect_err("source")
        .to_string();
    assert!(err.contains("max_position_embeddings"), "{err}");
    let err = p
        .build_with(16, Some(1025), AttnImpl::Sdpa)
        .expect_err("target")
        .to_string();
    assert!(
        err.contains("target_seq") && err.contains("max_position_embeddings"),
        "{err}"
    );
    assert!(p.build_with(1024, Some(1024), AttnImpl::Sdpa).is_ok());
}

/// What the builder does not model is refused naming the key.
#[test]
fn unmodelled_keys_are_refused_naming_them() {
    let base: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(crate::data("hf_configs/bart-base.json")).expect("config"),
    )
    .expect("json");
    for (key, value) in [
        ("encoder_layerdrop", serde_json::json!(0.1)),
        ("decoder_layerdrop", serde_json::json!(0.2)),
        ("decoder_ffn_dim", serde_json::json!(2048)),
        ("decoder_attention_heads", serde_json::json!(8)),
        ("tie_word_embeddings", serde_json::json!(false)),
        ("activation_function", serde_json::json!("mish")),
        ("encoder_attention_heads", serde_json::json!(7)),
        ("attention_dropout", serde_json::json!(1.5)),
        ("activation_dropout", serde_json::json!(1.0)),
        ("encoder_layers", serde_json::json!(5000)),
        ("decoder_layers", serde_json::json!(0)),
    ] {
        let mut doc = base.clone();
        doc[key] = value;
        let err = hf::from_config(&doc, "bart-mutated")
            .expect_err(key)
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
    // Legacy keys transformers ignores are ignored here too.
    let mut doc = base;
    doc["normalize_before"] = serde_json::json!(true);
    doc["add_final_layer_norm"] = serde_json::json!(true);
    assert!(hf::from_config(&doc, "bart-legacy").is_ok());
}

/// Bytes of the tensors the graph saves for backward in fp32 at `batch`, by the planner's
/// rules (saved inputs and outputs deduplicated, aliases followed, kept extras).
fn saved_bytes(g: &Graph, batch: u64) -> u64 {
    let mut dtypes = vec![DType::F32; g.tensors.len()];
    let mut root: Vec<usize> = (0..g.tensors.len()).collect();
    let mut saved = BTreeSet::new();
    let mut extras = 0;
    for node in &g.nodes {
        let ins: Vec<DType> = node.inputs.iter().map(|&t| dtypes[t]).collect();
        let r = rules::rule(g, node, &ins, Precision::Fp32, false);
        dtypes[node.output] = r.out_dtype;
        if r.alias {
            root[node.output] = root[node.inputs[0]];
        }
        saved.extend(r.saves_inputs.iter().map(|&i| root[node.inputs[i]]));
        if r.saves_output {
            saved.insert(root[node.output]);
        }
        extras += r
            .extras
            .iter()
            .filter(|e| !e.transient)
            .map(|e| (e.per_sample * batch + e.fixed) * e.dtype.size())
            .sum::<u64>();
    }
    let tensors: u64 = saved
        .iter()
        .map(|&t| {
            let x = &g.tensors[t];
            (x.per_sample * batch + x.fixed) * dtypes[t].size()
        })
        .sum();
    tensors + extras
}

/// `lab/cpu/bart_saved_bytes.py`: what autograd saved in an fp32 CPU training forward of a
/// tiny BART (eager, and SDPA without attention dropout; dropout as the GPU's fused
/// kernel), deduplicated by storage, equals what the graph saves, to the 4-byte
/// `total_weight` scalar of the loss.
#[test]
fn saved_tensors_equal_a_torch_forward() {
    let text = std::fs::read_to_string(crate::data("bart_saved_bytes.jsonl")).expect("fixture");
    let mut n = 0;
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("json line");
        let case = r["case"].as_str().expect("case");
        let preset = hf::from_config(&r["config"], case).expect("import");
        let u = |k: &str| r[k].as_u64().expect(k);
        let imp = match r["attention"].as_str() {
            Some("sdpa") => AttnImpl::Sdpa,
            _ => AttnImpl::Eager,
        };
        let g = preset
            .build_with(u("seq"), Some(u("target_seq")), imp)
            .expect("graph");
        let ours = saved_bytes(&g, u("batch"));
        let torch = u("saved_bytes");
        // nll_loss's `total_weight`, a 4-byte fp32 scalar, is not in the graph.
        assert_eq!(
            torch,
            ours + 4,
            "{case}: graph saves {ours} B, torch {torch} B"
        );
        n += 1;
    }
    assert!(n >= 5);
}

/// A row's setting read with its serde name (`"amp-bf16"`, `"sdpa"`, `"trainer"`).
fn field<T: serde::de::DeserializeOwned>(row: &serde_json::Value, key: &str) -> T {
    serde_json::from_value(row[key].clone()).unwrap_or_else(|e| panic!("{key}: {e}"))
}

/// The pre-registered device grid (`lab/grids/make_grid30_bart.py`, not measured yet) imports
/// and plans row by row: 12 rows, a third of them untouched, every precision, both
/// attentions, both loop shapes, checkpointing on and off.
#[test]
fn device_grid_rows_plan() {
    let root = crate::data("..").join("..");
    let mut rows = Vec::new();
    for (file, split) in [
        ("grid30_bart_configs.jsonl", "fit"),
        ("grid30_bart_untouched_configs.jsonl", "untouched"),
    ] {
        let text = std::fs::read_to_string(root.join("lab").join("grids").join(file)).expect(file);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let r: serde_json::Value = serde_json::from_str(line).expect("row");
            assert_eq!(r["split"], split);
            rows.push(r);
        }
    }
    assert_eq!(rows.len(), 12);
    assert_eq!(rows.iter().filter(|r| r["split"] == "untouched").count(), 4);
    let keys = |k: &str| -> BTreeSet<String> { rows.iter().map(|r| r[k].to_string()).collect() };
    assert_eq!(keys("precision").len(), 3);
    assert_eq!(keys("attention").len(), 2);
    assert_eq!(keys("loop").len(), 2);
    assert_eq!(keys("checkpointing").len(), 2);
    assert_eq!(keys("model").len(), 3);
    for r in &rows {
        let model = r["model"].as_str().expect("model");
        let text = std::fs::read_to_string(root.join(model)).expect(model);
        let preset = hf::from_config_text(&text, model).expect("import");
        assert_eq!(hf::family_label(&preset), "bart");
        let u = |k: &str| r[k].as_u64().expect(k);
        let cfg = TrainConfig {
            batch: u("batch"),
            size: Some(u("seq")),
            target_seq: Some(u("target_seq")),
            precision: field(r, "precision"),
            attention: field(r, "attention"),
            loop_shape: field(r, "loop"),
            checkpointing: r["checkpointing"].as_bool().expect("checkpointing"),
            ..TrainConfig::default()
        };
        let peak = Planner::new(&preset, &cfg)
            .and_then(|p| p.peaks(cfg.batch))
            .unwrap_or_else(|e| panic!("{}: {e}", r["grid_id"]))
            .allocated
            .0;
        let estimate = r["estimate_gb"].as_f64().expect("estimate") * 1e9;
        assert!(
            (peak as f64) < 35e9 && (peak as f64) < 2.0 * estimate,
            "{}: planned {peak} B, estimated {estimate} B",
            r["grid_id"]
        );
    }
}

/// A bart config with only the generic keys (`hidden_size`, `num_hidden_layers`, …): an
/// error naming the key it needs, never a panic.
#[test]
fn generic_keys_only_name_a_key() {
    let doc = serde_json::json!({"model_type": "bart", "vocab_size": 10, "hidden_size": 8,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2});
    let err = hf::from_config(&doc, "bart-generic")
        .expect_err("bart keys missing")
        .to_string();
    assert!(err.contains("d_model"), "{err}");
    assert!(hf::SUPPORTED.contains(&"bart"));
}

/// Inference steps are not modelled for the encoder-decoder: refused naming bart.
#[test]
fn inference_is_refused_naming_bart() {
    let p = import("bart-base");
    let err = vramlab_core::plan::inference::shape::DecoderShape::of(&p)
        .expect_err("encoder-decoder")
        .to_string();
    assert!(err.contains("bart") && err.contains("inference"), "{err}");
}
