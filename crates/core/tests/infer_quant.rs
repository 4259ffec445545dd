//! Inference with bitsandbytes-quantized weights (issue 29, `plan::inference::quant`): the
//! bytes bitsandbytes 0.50.2 keeps for tiny models loaded with `quantization_config` on the
//! CPU (`tools/infer_quant_cpu.py`), exactly.

use serde_json::Value;
use vramlab_core::model::hf;
use vramlab_core::plan::config::{AllocatorConfig, Attention};
use vramlab_core::plan::finetune_mode::Quant;
use vramlab_core::plan::inference::{Decoding, InferConfig, InferPlanner, InferStep, KvCache};
use vramlab_core::plan::policy::QuantStorage;
use vramlab_core::vocabulary::parse_dtype;

fn root(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn rows(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(crate::data(file)).expect("rows");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json row"))
        .collect()
}

/// The row's quantization (`quant`, `double_quant`).
fn quant(row: &Value) -> QuantStorage {
    let quant: Quant = row["quant"]
        .as_str()
        .expect("quant")
        .parse()
        .expect("quant");
    QuantStorage {
        quant,
        double_quant: quant.is_4bit() && row["double_quant"].as_bool().unwrap_or(true),
    }
}

/// The planner of a row (a grid row's call, or a prefill of 16 tokens).
fn planner(row: &Value) -> InferPlanner {
    let model = row["model"].as_str().expect("model");
    let text = std::fs::read_to_string(root(model)).expect("config.json");
    let preset = hf::from_config_text(&text, model).expect("preset");
    let s = |k: &str| row[k].as_str().unwrap_or_default().to_string();
    let u = |k: &str| row[k].as_u64();
    let step = row["step"]
        .as_str()
        .map_or(InferStep::Prefill, |s| s.parse().expect("step"));
    let cfg = InferConfig {
        step,
        batch: u("batch").unwrap_or(1),
        prompt: u("prompt").unwrap_or(16),
        new_tokens: u("new_tokens").unwrap_or(0),
        dtype: parse_dtype(&s("precision")).expect("precision"),
        attention: if s("attention") == "eager" {
            Attention::Eager
        } else {
            Attention::Sdpa
        },
        kv_cache: s("kv_cache").parse::<KvCache>().unwrap_or_default(),
        allocator: AllocatorConfig::default(),
    };
    InferPlanner::with_quant(&preset, &cfg, &Decoding::default(), Some(quant(row)))
        .expect("planner")
}

/// Weights to the byte and the bitsandbytes modules (every linear but `lm_head`) of tiny
/// Llama and Qwen2 models, nf4 with and without double quantization and LLM.int8, bf16,
/// fp16 and fp32, tied and untied output embeddings.
#[test]
fn cpu_quantized_weights_exact() {
    let rows = rows("infer/quant_weights_cpu.jsonl");
    assert_eq!(rows.len(), 5);
    for row in &rows {
        let p = planner(row);
        let q = p.quant.as_ref().expect("quantized");
        assert_eq!(
            p.weights.0,
            row["weights_bytes"].as_u64().expect("bytes"),
            "{row}"
        );
        let modules: u64 = row["quant_modules"]
            .as_object()
            .expect("modules")
            .values()
            .filter_map(Value::as_u64)
            .sum();
        assert_eq!(q.quantized_modules() as u64, modules, "{row}");
        assert_eq!(row["lm_head"], "Linear");
    }
}
