//! Inference of mixture-of-experts decoders (issue 29): the MoE block's allocations equal
//! those of transformers' own modules traced on the CPU, and the planner plans Qwen2-MoE,
//! Qwen3-MoE and Mixtral calls, refusing what it does not model.

use serde_json::Value;
use vramlab_core::model::{Preset, hf};
use vramlab_core::plan::config::{AllocatorConfig, Attention, DType};
use vramlab_core::plan::events::Events;
use vramlab_core::plan::finetune_mode::Quant;
use vramlab_core::plan::inference::forward::{self, Cache, Call, Process};
use vramlab_core::plan::inference::moe::{self, MoeShape};
use vramlab_core::plan::inference::program::Prog;
use vramlab_core::plan::inference::quant::Int8Outliers;
use vramlab_core::plan::inference::{
    DecoderShape, Decoding, InferConfig, InferPlanner, InferStep, KvCache,
};
use vramlab_core::plan::policy::QuantStorage;

const TRACE: &str = include_str!("../../../tests/data/infer/trace_cpu.jsonl");

/// An allocation of `bytes`, or the free of the n-th allocation.
#[derive(Debug, PartialEq)]
enum Ev {
    Alloc(u64),
    Free(usize),
}

fn planned(row: &Value) -> Vec<Ev> {
    let n = |k: &str| row[k].as_u64().unwrap_or(0);
    let model_type = row["model_type"].as_str().expect("model_type");
    let d = if row["dtype"] == "float32" { 4 } else { 2 };
    let m = MoeShape {
        experts: n("experts"),
        top_k: n("k"),
        inter: n("inter"),
        shared: (model_type == "qwen2_moe").then(|| n("shared")),
        norm_topk: row["norm_topk_prob"].as_bool().expect("norm_topk_prob"),
        fp32_scores: model_type == "mixtral",
        sparse: vec![true],
        gpt_oss: model_type == "gpt_oss",
    };
    let c = Call {
        t: n("tokens"),
        keep: 1,
        padding_mask: false,
        d,
        bf16: d == 2,
        imp: Attention::Sdpa,
        batch: 1,
        quant: None,
        outliers: Int8Outliers::None,
        // traced on a CPU, where generate keeps `grouped_mm` in decode steps
        decode: false,
    };
    let mut p = Prog::default();
    let mut proc = Process {
        cublas_ready: true, // a CPU trace has no cuBLAS workspace
        ..Process::default()
    };
    let hidden = n("hidden");
    let x = p.act(c.t * hidden * d);
    let _out = moe::block(&mut p, &mut proc, &m, hidden, x, &c);
    // the block's input is not in the trace (as the block's output's free is not)
    segment(&p.finish(), 1, 1)
}

/// The events from `start` on (at `batch`), in the trace's terms: allocations in order, the
/// frees of those (a buffer allocated before `start` existed before the trace).
fn segment(ev: &Events, start: usize, batch: u64) -> Vec<Ev> {
    let mut order = vec![usize::MAX; ev.buffers.len()];
    let mut out = Vec::new();
    let mut allocs = 0;
    for (i, e) in ev.events.iter().enumerate() {
        let b = e.buffer as usize;
        if i < start {
            continue;
        }
        if e.alloc {
            order[b] = allocs;
            allocs += 1;
            let buf = &ev.buffers[b];
            out.push(Ev::Alloc(buf.per_sample * batch + buf.fixed));
        } else if order[b] != usize::MAX {
            out.push(Ev::Free(order[b]));
        }
    }
    out
}

fn traced(row: &Value) -> Vec<Ev> {
    let mut ids = std::collections::HashMap::new();
    let mut out = Vec::new();
    for e in row["events"].as_array().expect("events") {
        let id = e[1].as_u64().expect("id");
        if e[0] == "alloc" {
            ids.insert(id, ids.len());
            out.push(Ev::Alloc(e[2].as_u64().expect("bytes")));
        } else {
            out.push(Ev::Free(ids[&id]));
        }
    }
    out
}

#[test]
fn the_moe_block_allocates_what_transformers_modules_allocate() {
    let mut rows = 0;
    for line in TRACE.lines().filter(|l| !l.trim().is_empty()) {
        let row: Value = serde_json::from_str(line).expect("trace row");
        if row["module"] == "decoder_layer" {
            continue;
        }
        let (want, got) = (traced(&row), planned(&row));
        assert_eq!(
            got, want,
            "{} {} {} tokens: planned (left) vs traced (right)",
            row["model_type"], row["dtype"], row["tokens"]
        );
        rows += 1;
    }
    assert!(rows >= 30, "{rows} traced block calls");
}

/// A decoder layer's call as the planner writes it: `row` is a traced layer call
/// (a prefill, or a decode step after a prefill of `cached` tokens).
fn planned_layer(row: &Value) -> Vec<Ev> {
    let n = |k: &str| row[k].as_u64().expect(k);
    let mut config = row.clone();
    for k in [
        "events", "layer", "call", "tokens", "cached", "dtype", "module", "torch",
    ] {
        config.as_object_mut().expect("row").remove(k);
    }
    config["transformers_version"] = row["transformers"].clone();
    let preset = hf::from_config_text(&config.to_string(), "tiny").expect("config");
    let s = DecoderShape::of(&preset).expect("shape");
    let d = if row["dtype"] == "float32" { 4 } else { 2 };
    let batch = n("batch");
    let call = |t: u64| Call {
        t,
        keep: t,
        padding_mask: false,
        d,
        bf16: d == 2,
        imp: Attention::Eager,
        batch,
        quant: None,
        outliers: Int8Outliers::None,
        // traced on a CPU, where generate keeps `grouped_mm` in decode steps
        decode: false,
    };
    let mut p = Prog::default();
    let mut proc = Process {
        cublas_ready: true,
        ..Process::default()
    };
    let (kind, max_len) = if row["cache"] == "static" {
        (KvCache::Static, n("max_cache_len"))
    } else {
        (KvCache::Dynamic, 0)
    };
    let mut cache = Cache::new(kind, max_len, s.layers);
    let l = n("layer") as usize;
    let cached = n("cached");
    if cached > 0 {
        let h = p.act(cached * s.hidden * d);
        forward::layer(&mut p, &mut proc, &s, &mut cache, l, &call(cached), true);
        p.free(h);
        cache.seen = cached;
    }
    let t = n("tokens");
    let _h = p.act(t * s.hidden * d);
    // the traced call: what came before existed before the trace
    p.start_measured();
    forward::layer(&mut p, &mut proc, &s, &mut cache, l, &call(t), true);
    let ev = p.finish();
    segment(&ev, ev.measured_start, batch)
}

/// Decoder layers of gpt-oss (a sliding and a full one), Qwen3-MoE (a sparse and a dense
/// one), Qwen2-MoE and Mixtral, eager attention, bf16 and fp32, a prefill of 3 or 6 tokens
/// and a decode step after it: the planner's events equal the trace of transformers'
/// modules on the CPU, op for op.
#[test]
fn decoder_layers_allocate_what_transformers_layers_allocate() {
    let mut rows = 0;
    for line in TRACE.lines().filter(|l| !l.trim().is_empty()) {
        let row: Value = serde_json::from_str(line).expect("trace row");
        if row["module"] != "decoder_layer" {
            continue;
        }
        let (want, got) = (traced(&row), planned_layer(&row));
        let first = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            got,
            want,
            "{} {} cache layer {} {} {} of {} tokens after {}: planned (left) vs traced \
             (right), first difference at {first:?}",
            row["model_type"],
            row["cache"],
            row["layer"],
            row["dtype"],
            row["call"],
            row["tokens"],
            row["cached"]
        );
        rows += 1;
    }
    assert_eq!(rows, 264, "traced layer calls");
}

fn cfg(step: InferStep, batch: u64, prompt: u64, new_tokens: u64, dtype: DType) -> InferConfig {
    InferConfig {
        step,
        batch,
        prompt,
        new_tokens,
        kv_cache: KvCache::Dynamic,
        dtype,
        attention: Attention::Sdpa,
        allocator: AllocatorConfig::default(),
    }
}

fn load(name: &str) -> Preset {
    let path = crate::data(&format!("hf_configs/{name}.json"));
    let text = std::fs::read_to_string(&path).expect("config.json");
    hf::from_config_text(&text, name).expect(name)
}

#[test]
fn moe_decoders_are_planned() {
    for (name, params) in [
        ("Qwen1.5-MoE-A2.7B", 14_315_784_192u64),
        ("Qwen3-30B-A3B", 30_532_122_624),
        ("Mixtral-8x7B-v0.1", 46_702_792_704),
    ] {
        let preset = load(name);
        let c = cfg(InferStep::Generate, 4, 1024, 64, DType::BF16);
        let planner = InferPlanner::new(&preset, &c).expect(name);
        assert_eq!(planner.params, params, "{name}");
        let plan = planner.plan(4).expect("plan");
        // the weights in bf16 and the rotary embedding's two fp32 `inv_freq` buffers
        let head_dim = planner.shape.head_dim;
        assert_eq!(
            plan.weights_bytes.0,
            params * 2 + 2 * head_dim / 2 * 4,
            "{name}"
        );
        assert!(plan.peak_allocated_bytes.0 > plan.weights_bytes.0 + plan.kv_cache_bytes.0);
        // the routed rows grow with the batch: more sequences, a higher peak
        let bigger = planner.plan(16).expect("plan");
        assert!(
            bigger.peak_allocated_bytes.0 > plan.peak_allocated_bytes.0,
            "{name}"
        );
    }
}

#[test]
fn gpt_oss_is_planned_with_the_eager_attention_transformers_runs() {
    let preset = load("gpt-oss-20b");
    let c = cfg(InferStep::Generate, 2, 4096, 32, DType::BF16);
    let planner = InferPlanner::new(&preset, &c).expect("planner");
    assert_eq!(planner.config.attention, Attention::Eager);
    let plan = planner.plan(2).expect("plan");
    // At the prefill's end every layer holds the 4096 prompt tokens of 8 kv heads × 64: a
    // sliding layer's keys are a view of the last 127 of them, which keeps the whole
    // concatenation alive until its first decode step (`DynamicSlidingWindowLayer.update`)
    let row = 2 * 8 * 64 * 2;
    let prefill = 2 * 24 * row * 4096;
    let most = 2 * 24 * row * (4096 + 32);
    let kv = plan.kv_cache_bytes.0;
    assert!(
        (prefill..=most).contains(&kv),
        "{kv} not in {prefill}..={most}"
    );
    // eager scores of 64 heads over the whole prompt dominate the prefill
    let scores = 2 * 64 * 4096 * 4097 * 2;
    assert!(plan.peak_allocated_bytes.0 > plan.weights_bytes.0 + scores);
}

#[test]
fn a_prefill_of_qwen3_moe_holds_the_routed_rows_of_every_token() {
    let preset = load("Qwen3-30B-A3B");
    let c = cfg(InferStep::Prefill, 2, 2048, 0, DType::BF16);
    let plan = InferPlanner::new(&preset, &c)
        .expect("planner")
        .plan(2)
        .expect("plan");
    // 2 × 2048 tokens × 8 experts each: the gate_up grouped GEMM's output and its masked
    // copy (2 × moe_intermediate_size 768 wide, bf16) live together at the block's peak
    let rows = 2 * 2048 * 8;
    let gate_up = rows * 2 * 768 * 2;
    let above = plan.peak_allocated_bytes.0 - plan.weights_bytes.0;
    assert!(above > 2 * gate_up, "{above} above the weights");
}

#[test]
fn what_inference_does_not_model_for_moe_is_refused_by_name() {
    let c = cfg(InferStep::Generate, 1, 128, 8, DType::BF16);
    let err = InferPlanner::new(&load("DeepSeek-V3"), &c)
        .expect_err("DeepSeek-V3")
        .to_string();
    assert!(err.contains("multi-head latent attention"), "{err}");
    let qwen = load("Qwen3-30B-A3B");
    let nf4 = QuantStorage {
        quant: Quant::Nf4,
        double_quant: true,
    };
    let err = InferPlanner::with_quant(&qwen, &c, &Decoding::default(), Some(nf4))
        .expect_err("quant")
        .to_string();
    assert!(err.contains("quant") && err.contains("3-D"), "{err}");
}
