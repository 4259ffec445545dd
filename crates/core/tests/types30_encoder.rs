//! The masked-LM encoders of issue 30 imported from config.json (modernbert, deberta-v2)
//! as options of the BERT builder: exact parameter counts against transformers 5.17, the
//! ops each one's forward runs, key errors and refusals.

use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::hf;
use vramlab_core::model::ir::{Graph, Node, Op, Pointwise};
use vramlab_core::model::{ModelSpec, Preset};
use vramlab_core::plan::events::{Category, Phase};
use vramlab_core::plan::{Attention, Planner, Precision, TrainConfig};

const TYPES: [&str; 2] = ["modernbert", "deberta-v2"];

fn import(name: &str) -> Preset {
    let text = std::fs::read_to_string(crate::data(&format!("hf_configs/{name}.json")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    hf::from_config_text(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn graph(name: &str, seq: u64, imp: AttnImpl) -> Graph {
    import(name)
        .build(seq, imp)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn named<'a>(g: &'a Graph, suffix: &str) -> Vec<&'a Node> {
    g.nodes
        .iter()
        .filter(|n| g.name(n).ends_with(suffix))
        .collect()
}

fn config(name: &str) -> serde_json::Value {
    let text =
        std::fs::read_to_string(crate::data(&format!("hf_configs/{name}.json"))).expect("cfg");
    serde_json::from_str(&text).expect("json")
}

/// `sum(p.numel())` of `AutoModelForMaskedLM.from_config` on the meta device
/// (`lab/cpu/hf_param_counts.py`, transformers 5.17), two configs per type.
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
        assert_eq!(hf::family_label(&import(name)), mt);
        for imp in [AttnImpl::Sdpa, AttnImpl::Eager] {
            assert_eq!(
                graph(name, 128, imp).param_count(),
                r["params"].as_u64().expect("params"),
                "{name}"
            );
        }
        *per_type.entry(mt.to_string()).or_default() += 1;
    }
    for t in TYPES {
        assert!(
            per_type.get(t).copied().unwrap_or(0) >= 2,
            "{t}: {per_type:?}"
        );
    }
}

/// ModernBERT: pre-norm without biases (layer 0 has no attention norm), fused `Wqkv`,
/// RoPE on q and k, GeGLU, every third layer global; the sliding layers get a window mask
/// only from `seq >= local_attention / 2`.
#[test]
fn modernbert_layers() {
    let g = graph("ModernBERT-base", 512, AttnImpl::Sdpa);
    assert_eq!(named(&g, "attn_norm").len(), 21);
    assert!(named(&g, "layers.0.attn_norm").is_empty());
    for n in g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::LayerNorm { .. }))
    {
        assert_eq!(n.params.len(), 1, "{} has no bias", g.name(n));
    }
    assert_eq!(named(&g, "rope_q").len(), 22);
    assert_eq!(named(&g, "mlp.chunk.0").len(), 22);
    // Global layers 0, 3, ..., 21: flash SDPA; the other 14 layers take the bias path.
    let plain = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Sdpa { .. }))
        .count();
    let biased = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::SdpaBias { .. }))
        .count();
    assert_eq!((plain, biased), (8, 14));
    let bias = named(&g, "layers.1.attn.attention.bool_mask_to_bias")[0];
    assert_eq!(g.tensors[bias.output].per_sample, 512 * 512);
    // Below the half window no mask is built: every layer runs flash.
    let g = graph("ModernBERT-base", 32, AttnImpl::Sdpa);
    assert!(!g.nodes.iter().any(|n| matches!(n.op, Op::SdpaBias { .. })));
    // Eager: one float mask for the forward, added in the 14 sliding layers only.
    let g = graph("ModernBERT-base", 512, AttnImpl::Eager);
    assert_eq!(named(&g, "sliding_window_mask").len(), 1);
    assert_eq!(named(&g, "add_mask").len(), 14);
    assert!(named(&g, "layers.0.attn.attention.add_mask").is_empty());
    // The head: dense without bias, gelu, norm, the decoder tied with a bias; fp32 loss.
    let dec = named(&g, "decoder")[0];
    assert_eq!(dec.params.len(), 2);
    assert_eq!(dec.params[0], 0, "tied to the word embedding");
    assert_eq!(named(&g, "head.dense")[0].params.len(), 1);
    assert!(
        g.nodes
            .iter()
            .any(|n| matches!(n.op, Op::CrossEntropy { upcast: true, .. }))
    );
}

#[test]
fn modernbert_keys() {
    let mut v = config("ModernBERT-base");
    v["sparse_prediction"] = serde_json::json!(true);
    let err = hf::from_config(&v, "x").expect_err("sparse").to_string();
    assert!(err.contains("sparse_prediction"), "{err}");
    let mut v = config("ModernBERT-base");
    v["layer_types"] = serde_json::json!(["full_attention"]);
    let err = hf::from_config(&v, "x").expect_err("short").to_string();
    assert!(err.contains("layer_types"), "{err}");
    let mut v = config("ModernBERT-base");
    v["hidden_activation"] = serde_json::json!("silu");
    let err = hf::from_config(&v, "x").expect_err("act").to_string();
    assert!(err.contains("hidden_activation"), "{err}");
    // `layer_types` replaces `global_attn_every_n_layers`; untied decoder: its own weight.
    let mut v = config("ModernBERT-base");
    let types: Vec<&str> = (0..22)
        .map(|l| {
            if l < 2 {
                "sliding_attention"
            } else {
                "full_attention"
            }
        })
        .collect();
    v["layer_types"] = serde_json::json!(types);
    v["tie_word_embeddings"] = serde_json::json!(false);
    let p = hf::from_config(&v, "x").expect("import");
    let g = p.build(512, AttnImpl::Sdpa).expect("graph");
    let biased = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::SdpaBias { .. }))
        .count();
    assert_eq!(biased, 2);
    let tied = graph("ModernBERT-base", 512, AttnImpl::Sdpa).param_count();
    assert_eq!(g.param_count(), tied + 50368 * 768);
    let back = Preset::from_json(&p.to_json()).expect("round trip");
    assert_eq!(back, p);
}

/// DeBERTa-v3: eager whatever is asked (the same graph for SDPA, with a warning), no
/// absolute positions, the shared-key c2p and p2c terms gathered from the relative
/// embeddings, several heads×s×s tensors per layer.
#[test]
fn deberta_runs_eager_disentangled_attention() {
    let p = import("deberta-v3-base");
    let sdpa = p.build(256, AttnImpl::Sdpa).expect("sdpa");
    let eager = p.build(256, AttnImpl::Eager).expect("eager");
    assert_eq!(sdpa.nodes.len(), eager.nodes.len());
    assert!(
        !sdpa
            .nodes
            .iter()
            .any(|n| matches!(n.op, Op::Sdpa { .. } | Op::SdpaBias { .. }))
    );
    let warn = p.unmodelled(256, AttnImpl::Sdpa);
    assert!(warn.len() == 1 && warn[0].contains("eager"), "{warn:?}");
    assert!(p.unmodelled(256, AttnImpl::Eager).is_empty());
    let g = sdpa;
    assert!(named(&g, "position_embeddings").is_empty());
    assert_eq!(named(&g, "c2p_gather").len(), 12);
    assert_eq!(named(&g, "p2c_gather").len(), 12);
    // share_att_key: the relative embeddings go through query_proj/key_proj.
    let qp = named(&g, "layer.0.attention.self.query_proj")[0];
    let pq = named(&g, "layer.0.attention.self.pos_query_proj")[0];
    assert_eq!(qp.params, pq.params);
    // 2 × 256 buckets of relative embeddings, repeated per sample.
    let rep = named(&g, "layer.0.attention.self.pos_key_proj.repeat")[0];
    assert_eq!(g.tensors[rep.output].per_sample, 512 * 768);
    let scores = 12 * 256 * 256;
    let layer0: Vec<&Node> = g
        .nodes
        .iter()
        .filter(|n| {
            g.name(n)
                .starts_with("deberta.encoder.layer.0.attention.self")
        })
        .filter(|n| g.tensors[n.output].per_sample == scores)
        .collect();
    // qk, c2p gather/scale/sum, p2c gather/scale/sum(in place), add, masked_fill,
    // softmax, dropout.
    assert_eq!(
        layer0.len(),
        11,
        "{:?}",
        layer0.iter().map(|n| g.name(n)).collect::<Vec<_>>()
    );
    let fill = named(&g, "layer.0.attention.self.masked_fill")[0];
    assert!(matches!(fill.op, Op::Gather { mask, .. } if mask == 256 * 256));
    let sum = named(&g, "layer.0.attention.self.p2c_sum")[0];
    assert!(matches!(
        sum.op,
        Op::Pointwise {
            f: Pointwise::Add,
            inplace: true
        }
    ));
}

/// DeBERTa-v2 xlarge: the `ConvLayer` after layer 0, outside the checkpointed blocks.
#[test]
fn deberta_xlarge_conv_layer() {
    let g = graph("deberta-v2-xlarge", 128, AttnImpl::Eager);
    let conv: Vec<&Node> = g
        .nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Conv2d { .. }))
        .collect();
    assert_eq!(conv.len(), 1);
    assert_eq!(g.name(conv[0]), "deberta.encoder.conv.conv");
    assert_eq!(conv[0].block, None);
    assert_eq!(g.params[conv[0].params[0]].elems, 1536 * 1536 * 3);
    assert_eq!(named(&g, "conv.conv_act").len(), 1);
}

#[test]
fn deberta_keys_and_refusals() {
    let mut v = config("deberta-v3-base");
    v["conv_kernel_size"] = serde_json::json!(3);
    v["conv_act"] = serde_json::json!("relu");
    let err = hf::from_config(&v, "x").expect_err("conv").to_string();
    assert!(err.contains("conv_act"), "{err}");
    let mut v = config("deberta-v3-base");
    v["embedding_size"] = serde_json::json!(128);
    let err = hf::from_config(&v, "x")
        .expect_err("embedding_size")
        .to_string();
    assert!(err.contains("embedding_size"), "{err}");
    let mut v = config("deberta-v3-base");
    v["pos_att_type"] = serde_json::json!(7);
    let err = hf::from_config(&v, "x")
        .expect_err("pos_att_type")
        .to_string();
    assert!(err.contains("pos_att_type"), "{err}");
    // DeBERTa-v2 style: own pos projections, absolute positions, a list of terms, no
    // buckets (the span is max_position_embeddings), non-legacy head.
    let mut v = config("deberta-v3-base");
    v["share_att_key"] = serde_json::json!(false);
    v["position_biased_input"] = serde_json::json!(true);
    v["pos_att_type"] = serde_json::json!(["c2p"]);
    v["position_buckets"] = serde_json::json!(-1);
    v["legacy"] = serde_json::json!(false);
    let p = hf::from_config(&v, "x").expect("import");
    let g = p.build(128, AttnImpl::Eager).expect("graph");
    assert_eq!(named(&g, "pos_key_proj").len(), 12);
    assert!(named(&g, "p2c_gather").is_empty());
    assert_eq!(named(&g, "add_bias").len(), 1);
    let ModelSpec::Bert(b) = &p.spec else {
        panic!("bert")
    };
    assert_eq!(b.deberta.as_ref().map(|d| d.att_span), Some(512));
    let err = p
        .build(513, AttnImpl::Eager)
        .expect_err("positions")
        .to_string();
    assert!(err.contains("max_position_embeddings"), "{err}");
    let back = Preset::from_json(&p.to_json()).expect("round trip");
    assert_eq!(back, p);
}

/// Per-sample bytes alive at the end of the forward besides the weights (the activations
/// of the last forward event), fp32.
fn live_per_sample(p: &Preset, seq: u64, attention: Attention) -> u64 {
    let cfg = TrainConfig {
        batch: 1,
        size: Some(seq),
        precision: Precision::Fp32,
        attention,
        ..TrainConfig::default()
    };
    let planner = Planner::new(p, &cfg).expect("plan");
    let ev = &planner.events;
    let last = ev
        .events
        .iter()
        .rposition(|e| e.phase == Phase::Forward)
        .expect("forward");
    let mut live = 0i64;
    for e in &ev.events[..=last] {
        let b = &ev.buffers[e.buffer as usize];
        if b.category != Category::Activations {
            continue;
        }
        let n = i64::try_from(b.per_sample).expect("size");
        live += if e.alloc { n } else { -n };
    }
    u64::try_from(live).expect("non-negative")
}

/// The saved tensors of tiny configs on CPU (`lab/cpu/encoder30_saved_bytes.py`: autograd's
/// saved-tensor hooks, deduplicated by storage, plus the logits; batch 3 minus batch 2)
/// against the activations the plan holds at the end of the forward, per sample, fp32.
/// Dropout is off in the DeBERTa rows: PyTorch's CPU dropout saves a float noise tensor
/// where CUDA's fused kernel saves a bool mask.
#[test]
fn saved_bytes_match_transformers_on_cpu() {
    let text =
        std::fs::read_to_string(crate::data("encoder30_saved_bytes.jsonl")).expect("fixture");
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("json");
        let name = r["name"].as_str().expect("name");
        let p = hf::from_config(&r["config"], name).expect("import");
        let seq = r["seq"].as_u64().expect("seq");
        let attention = match r["attn"].as_str() {
            Some("eager") => Attention::Eager,
            _ => Attention::Sdpa,
        };
        let want = r["per_sample"].as_u64().expect("bytes");
        let got = live_per_sample(&p, seq, attention);
        let err = (got as f64 - want as f64) / want as f64;
        eprintln!("{name}: plan {got} torch {want} ({:+.2} %)", 100.0 * err);
        assert!(err.abs() < 0.005, "{name}: plan {got} torch {want}");
    }
}

/// Every public config plans a training step in each precision, with and without
/// checkpointing; checkpointing never raises the peak (at this size the head or the
/// optimizer step may set it).
#[test]
fn public_configs_plan() {
    for name in [
        "ModernBERT-base",
        "ModernBERT-large",
        "deberta-v3-base",
        "deberta-v3-large",
        "deberta-v2-xlarge",
    ] {
        let p = import(name);
        for precision in [Precision::Fp32, Precision::AmpBf16, Precision::Bf16] {
            let peak = |checkpointing| {
                let cfg = TrainConfig {
                    batch: 2,
                    size: Some(512),
                    precision,
                    checkpointing,
                    ..TrainConfig::default()
                };
                vramlab_core::plan::plan(&p, &cfg)
                    .unwrap_or_else(|e| panic!("{name}: {e}"))
                    .peak_allocated_bytes
                    .0
            };
            let (full, ckpt) = (peak(false), peak(true));
            assert!(ckpt <= full, "{name} {precision:?}: {ckpt} > {full}");
        }
    }
}
