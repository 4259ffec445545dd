//! The `--json` answers about inference — `plan --step generate|prefill`, `max-batch --step …`
//! and `max-context` — assembled here once from the core's answers; the CLI prints them. Each
//! is a JSON object (keys in serde_json's sorted order), the shape scripts rely on (issue 29's
//! contract: `peak_allocated_bytes`, `peak_reserved_bytes`, `nvidia_smi_bytes`,
//! `kv_cache_bytes`, `weights_bytes`, and with a device map `device_map`).

use serde_json::{Map, Value, json};

use super::max_context::MaxContext;
use crate::plan::Gpu;
use crate::plan::inference::{Decoding, InferPlan, InferPlanner, InferStep};
use crate::plan::policy::QuantStorage;
use crate::plan::search::Budget;

/// `plan --step … --json`: the plan (its breakdown as `{category: bytes}`), the step, the GPU
/// and its usable bytes, the verdict (`fits`, and `fits_only_by_freeing_cache` when true) and
/// the settings assumed because they were not given (`{"batch": "1", …}`, flag names without
/// their dashes).
pub fn plan(
    plan: &InferPlan,
    gpu: &Gpu,
    budget: Budget,
    fits: bool,
    fits_only_by_freeing_cache: bool,
    assumed: &[(&str, &str)],
) -> Result<Value, serde_json::Error> {
    let mut v = serde_json::to_value(plan)?;
    if let Some(o) = v.as_object_mut() {
        let breakdown: Map<String, Value> = plan
            .breakdown
            .iter()
            .map(|s| (s.category.clone(), json!(s.bytes.0)))
            .collect();
        o.insert("breakdown".into(), breakdown.into());
        o.insert("step".into(), json!(plan.config.step.as_str()));
        o.insert("gpu".into(), json!(gpu.id));
        o.insert("gpu_memory_bytes".into(), json!(gpu.memory().0));
        o.insert("usable_bytes".into(), json!(budget.usable().0));
        o.insert("fits".into(), json!(fits));
        if fits_only_by_freeing_cache {
            o.insert("fits_only_by_freeing_cache".into(), json!(true));
        }
        let assumed: Map<String, Value> = assumed
            .iter()
            .map(|(f, v)| (f.trim_start_matches('-').to_string(), json!(v)))
            .collect();
        o.insert("assumed".into(), assumed.into());
    }
    Ok(v)
}

/// What every largest-something answer adds to its own fields: the call's settings that are
/// not greedy decoding's (`decoding`) and the quantized weights (`quant`).
fn decoding_and_quant(
    o: &mut Map<String, Value>,
    dec: &Decoding,
    quant: Option<QuantStorage>,
) -> Result<(), serde_json::Error> {
    if !dec.is_greedy() {
        o.insert("decoding".into(), serde_json::to_value(dec)?);
    }
    if let Some(q) = quant {
        o.insert("quant".into(), serde_json::to_value(q)?);
    }
    Ok(())
}

/// `max-batch --step … --json`: the largest batch (`null` when batch 1 does not fit) and the
/// plan's figures at it; with a device map the placement, with quantized weights their bytes.
#[allow(clippy::too_many_arguments)]
pub fn max_batch(
    model: &str,
    step: InferStep,
    gpu: &Gpu,
    budget: Budget,
    planner: &InferPlanner,
    max: Option<u64>,
    at: Option<&InferPlan>,
    dec: &Decoding,
    quant: Option<QuantStorage>,
) -> Result<Value, serde_json::Error> {
    let mut v = json!({
        "model": model,
        "step": step.as_str(),
        "gpu": gpu.id,
        "usable_bytes": budget.usable().0,
        "max_batch": max,
        "nvidia_smi_bytes": at.map(|p| p.nvidia_smi_bytes.0),
        "peak_allocated_bytes": at.map(|p| p.peak_allocated_bytes.0),
        "kv_cache_bytes": at.map(|p| p.kv_cache_bytes.0),
    });
    if let Some(o) = v.as_object_mut() {
        if let Some(pl) = &planner.placement {
            o.insert("device_map".into(), serde_json::to_value(&pl.device_map)?);
            o.insert("offload".into(), serde_json::to_value(pl.offload)?);
        }
        decoding_and_quant(o, dec, quant)?;
        if quant.is_some() {
            o.insert("weights_bytes".into(), json!(planner.weights.0));
        }
    }
    Ok(v)
}

/// `max-context --json`: the search's answer, the step, batch, GPU and usable bytes, and the
/// figures of the plan at the longest length (`null` when nothing fits).
pub fn max_context(
    m: &MaxContext,
    step: InferStep,
    batch: u64,
    gpu: &Gpu,
    budget: Budget,
    dec: &Decoding,
    quant: Option<QuantStorage>,
) -> Result<Value, serde_json::Error> {
    let mut v = serde_json::to_value(m)?;
    if let Some(o) = v.as_object_mut() {
        let plan = m.plan.as_ref();
        o.insert("step".into(), json!(step.as_str()));
        o.insert("batch".into(), json!(batch));
        o.insert("gpu".into(), json!(gpu.id));
        o.insert("usable_bytes".into(), json!(budget.usable().0));
        o.insert(
            "nvidia_smi_bytes".into(),
            json!(plan.map(|p| p.nvidia_smi_bytes.0)),
        );
        o.insert(
            "peak_allocated_bytes".into(),
            json!(plan.map(|p| p.peak_allocated_bytes.0)),
        );
        o.insert(
            "kv_cache_bytes".into(),
            json!(plan.map(|p| p.kv_cache_bytes.0)),
        );
        decoding_and_quant(o, dec, quant)?;
    }
    Ok(v)
}
