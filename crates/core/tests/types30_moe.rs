//! The MoE decoders of issue 30 imported from config.json (deepseek_v3, gpt_oss): exact
//! parameter counts against transformers 5.17, the ops each one's forward runs that the
//! other MoE decoders do not, key errors, and what the plan says it does not model.

use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::hf;
use vramlab_core::model::ir::{Graph, Node, Op, Pointwise};
use vramlab_core::model::{ModelSpec, Preset};
use vramlab_core::plan::{Planner, Precision, TrainConfig};

const TYPES: [&str; 2] = ["deepseek_v3", "gpt_oss"];

fn import(name: &str) -> Preset {
    let text = std::fs::read_to_string(crate::data(&format!("hf_configs/{name}.json")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    hf::from_config_text(&text, name).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn graph_with(name: &str, imp: AttnImpl) -> Graph {
    import(name)
        .build(64, imp)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn graph(name: &str) -> Graph {
    graph_with(name, AttnImpl::Sdpa)
}

fn named<'a>(g: &'a Graph, suffix: &str) -> Vec<&'a Node> {
    g.nodes
        .iter()
        .filter(|n| g.name(n).ends_with(suffix))
        .collect()
}

fn edit(name: &str, f: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> String {
    let text =
        std::fs::read_to_string(crate::data(&format!("hf_configs/{name}.json"))).expect("config");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    f(v.as_object_mut().expect("object"));
    v.to_string()
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

/// DeepSeek-V3: low-rank q (q_a_proj → norm → q_b_proj), the kv latent and its norm, the
/// cached latent and rotary key, q and k built by concatenation, SDPA with q/k heads of
/// 192 and v heads of 128; the first 3 layers dense, the others sparse with shared experts.
#[test]
fn deepseek_v3_latent_attention_and_dense_first_layers() {
    let g = graph("DeepSeek-V3");
    let layers = 61;
    for op in [
        "self_attn.q_a_proj",
        "self_attn.q_a_layernorm",
        "self_attn.q_b_proj",
        "self_attn.kv_a_layernorm",
        "self_attn.kv_b_proj",
        "self_attn.cache_latent",
        "self_attn.expand_kv",
    ] {
        assert_eq!(named(&g, op).len(), layers, "{op}");
    }
    assert!(named(&g, "self_attn.q_proj").is_empty());
    let sdpa = named(&g, ".self_attn");
    assert_eq!(sdpa.len(), layers);
    let s = sdpa[0];
    assert!(matches!(s.op, Op::Sdpa { head_dim: 192, .. }), "{:?}", s.op);
    assert_eq!(g.tensors[s.output].per_sample, 64 * 128 * 128);
    // The cached latent is 512 wide per token: compressed.
    let cache = named(&g, "self_attn.cache_latent")[0];
    assert_eq!(g.tensors[cache.output].per_sample, 64 * 512);
    assert_eq!(named(&g, "mlp.gate_proj").len(), 3, "the dense MLPs");
    assert_eq!(named(&g, "mlp.shared_experts.gate_proj").len(), 58);
    assert_eq!(named(&g, "mlp.experts.gate_up_proj").len(), 58);
    assert_eq!(named(&g, "mlp.gate.sigmoid").len(), 58);
    assert!(named(&g, "mlp.shared_expert_gate").is_empty());
    // Moonlight: no q_lora_rank → one q_proj.
    let m = graph("Moonlight-16B-A3B");
    assert_eq!(named(&m, "self_attn.q_proj").len(), 27);
    assert!(named(&m, "self_attn.q_a_proj").is_empty());
    // Eager: the fp32 softmax over s×s scores per head.
    let e = graph_with("Moonlight-16B-A3B", AttnImpl::Eager);
    assert_eq!(named(&e, "self_attn.softmax").len(), 27);
}

/// gpt-oss: eager attention whatever is asked (transformers 5.17 refuses SDPA), a sink
/// column joined to the scores, the router with bias, the experts' loop with biases and the
/// clamped SwiGLU, every layer sparse.
#[test]
fn gpt_oss_sinks_eager_and_clamped_swiglu() {
    let g = graph("gpt-oss-20b");
    let layers = 24;
    assert!(g.nodes.iter().all(|n| !matches!(n.op, Op::Sdpa { .. })));
    let cat = named(&g, "self_attn.cat_sinks");
    assert_eq!(cat.len(), layers);
    assert_eq!(g.tensors[cat[0].output].per_sample, 64 * 64 * 65);
    assert_eq!(named(&g, "self_attn.repeat_k").len(), layers);
    assert_eq!(named(&g, "mlp.router").len(), layers);
    let clamps = g
        .nodes
        .iter()
        .filter(|n| {
            matches!(
                n.op,
                Op::Pointwise {
                    f: Pointwise::Clamp,
                    ..
                }
            )
        })
        .count();
    assert_eq!(clamps, 2 * layers);
    let gu = named(&g, "mlp.experts.gate_up_proj");
    assert_eq!(gu.len(), layers);
    assert!(matches!(gu[0].op, Op::Linear { .. }));
    assert_eq!(g.tensors[gu[0].output].per_sample, 64 * 4 * 2 * 2880);
    assert!(named(&g, "mlp.gate_proj").is_empty());
}

/// The plan of each type runs and says what it leaves out: the quantized weights on the Hub.
#[test]
fn plans_run_and_name_the_quantization() {
    for (name, q) in [("Moonlight-16B-A3B", None), ("gpt-oss-20b", Some("mxfp4"))] {
        let preset = import(name);
        let ModelSpec::Llama(p) = &preset.spec else {
            panic!("{name}: not a decoder");
        };
        let notes = p.unmodelled(64, true);
        match q {
            Some(q) => {
                assert!(
                    notes
                        .iter()
                        .any(|n| n.contains("quantization_config") && n.contains(q)),
                    "{notes:?}"
                );
                assert!(notes.iter().any(|n| n.contains("eager")), "{notes:?}");
            }
            None => assert!(notes.is_empty(), "{notes:?}"),
        }
        let cfg = TrainConfig {
            batch: 1,
            size: Some(64),
            precision: Precision::Bf16,
            ..TrainConfig::default()
        };
        let peaks = Planner::new(&preset, &cfg)
            .and_then(|p| p.peaks(1))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(peaks.allocated.0 > 0);
    }
}

/// Keys that change the layout are read; wrong ones are errors naming the key.
#[test]
fn keys_are_read_and_named() {
    let text = edit("Moonlight-16B-A3B", |o| {
        o.insert("n_group".into(), 3.into());
    });
    let err = hf::from_config_text(&text, "x")
        .expect_err("3 ∤ 64")
        .to_string();
    assert!(err.contains("n_group"), "{err}");
    let text = edit("Moonlight-16B-A3B", |o| {
        o.insert("first_k_dense_replace".into(), 5.into());
    });
    let p = hf::from_config_text(&text, "x").expect("import");
    let g = p.build(16, AttnImpl::Sdpa).expect("build");
    assert_eq!(named(&g, "mlp.shared_experts.gate_proj").len(), 22);
    let text = edit("gpt-oss-20b", |o| {
        o.insert(
            "layer_types".into(),
            serde_json::json!(["sliding_attention"]),
        );
    });
    let err = hf::from_config_text(&text, "x")
        .expect_err("one entry")
        .to_string();
    assert!(err.contains("layer_types"), "{err}");
    let text = edit("gpt-oss-20b", |o| {
        o.remove("num_local_experts");
    });
    let err = hf::from_config_text(&text, "x")
        .expect_err("missing")
        .to_string();
    assert!(err.contains("num_local_experts"), "{err}");
}

/// The pre-registered device grid (`lab/grids/make_grid30_moe.py`): every row parses and plans,
/// each type covers both configs, the three precisions, both checkpointing settings and both
/// loops; gpt_oss rows ask for eager attention (transformers 5.17 refuses SDPA for it).
/// Prints each row's planned peak (not compared: nothing is measured yet).
#[test]
fn grid30_moe_rows_plan() {
    use vramlab_core::validate::{model_file, parse_lines};
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let mut seen = std::collections::BTreeSet::new();
    let mut n = 0;
    for file in [
        "grid30_moe_configs.jsonl",
        "grid30_moe_untouched_configs.jsonl",
    ] {
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
            if mt == "gpt_oss" {
                assert_eq!(format!("{:?}", cfg.attention), "Eager", "{}", m.model);
            }
            println!(
                "{} b={} {} allocated {:.1} GiB",
                m.model,
                m.batch,
                m.precision,
                peaks.allocated.0 as f64 / f64::from(1u32 << 30)
            );
            seen.insert((mt.clone(), "model", m.model.clone()));
            seen.insert((mt.clone(), "precision", m.precision.clone()));
            seen.insert((mt.clone(), "ckpt", m.checkpointing.to_string()));
            seen.insert((mt, "loop", format!("{:?}", m.loop_shape)));
            n += 1;
        }
    }
    assert_eq!(n, 24);
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

/// The planner's activation bytes per sample alive at the end of forward (saved tensors,
/// the outputs, the input) in the measured step.
fn activations_after_forward(preset: &Preset, cfg: &TrainConfig) -> i64 {
    use vramlab_core::plan::{Category, Phase};
    let planner = Planner::new(preset, cfg).expect("plan");
    let ev = &planner.events;
    let mut live = 0i64;
    for e in &ev.events[ev.measured_start..] {
        if matches!(e.phase, Phase::Backward | Phase::Optimizer) {
            break;
        }
        let b = ev.buffers[e.buffer as usize];
        if b.category == Category::Activations {
            let n = i64::try_from(b.per_sample).expect("bytes");
            live += if e.alloc { n } else { -n };
        }
    }
    live
}

/// Strong check: the bytes autograd saves in a forward of tiny deepseek_v3 / gpt_oss configs
/// on CPU (transformers 5.17, eager attention, fp32 and bf16; `lab/cpu/saved_bytes_moe.py`:
/// the saved storages deduplicated, plus the logits, the cache and the ids), per sample,
/// against the planner's activations alive at the end of forward. deepseek_v3's SDPA is not
/// compared here: on CPU PyTorch runs the math path for q/k heads wider than v heads, on CUDA
/// the memory-efficient kernel that is planned (the device grid measures it).
#[test]
fn saved_bytes_match_torch() {
    use vramlab_core::plan::Attention;
    let text = std::fs::read_to_string(crate::data("types30_moe_saved.jsonl")).expect("fixture");
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("json line");
        let preset = hf::from_config(&r["config"], "tiny").expect("import");
        let precision = match r["precision"].as_str() {
            Some("bf16") => Precision::Bf16,
            _ => Precision::Fp32,
        };
        let cfg = TrainConfig {
            batch: 1,
            size: r["seq"].as_u64(),
            precision,
            attention: Attention::Eager,
            ..TrainConfig::default()
        };
        let planned = activations_after_forward(&preset, &cfg);
        let torch = r["per_sample"].as_i64().expect("per_sample");
        let err = (planned - torch) as f64 / torch as f64;
        println!(
            "{} {}: planned {planned} B/sample, torch {torch} ({:+.1} %)",
            r["config"]["model_type"],
            r["precision"],
            100.0 * err
        );
        assert!(err.abs() < 0.05, "{line}: planned {planned}");
    }
}

/// The grid's cut configs count as transformers 5.17 counts them (meta device, the
/// counting step of `GRID=grid30_moe lab/run grid30`, run on CPU).
#[test]
fn grid30_moe_configs_count_as_transformers() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    for (name, params) in [
        ("DeepSeek-V3-L1-E16", 2_789_284_864),
        ("Moonlight-16B-A3B-L2", 1_338_911_744),
        ("gpt-oss-120b-L2-E8", 1_609_697_104),
        ("gpt-oss-20b-L1", 1_981_456_736),
    ] {
        let path = format!("{root}/tests/data/hf_configs_device/{name}.json");
        let text = std::fs::read_to_string(&path).expect("config");
        let preset = hf::from_config_text(&text, name).expect("import");
        let g = preset.build(64, AttnImpl::Sdpa).expect("build");
        assert_eq!(g.param_count(), params, "{name}");
    }
}
