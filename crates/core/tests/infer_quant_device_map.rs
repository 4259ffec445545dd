//! bitsandbytes-quantized weights under `device_map="auto"` (issue 29's last open item,
//! `Placement::of_quant`, `InferPlanner::with_device_map_quant`) against what transformers 5.17
//! does, once the device session's files are in `tests/data/infer/` (session 30b,
//! `lab/device/session30b.sh`):
//! - `quant_device_maps.jsonl` (`lab/device/quant_device_maps.py`): transformers' own
//!   `_get_device_map` of quantized meta-device models — the map with
//!   `llm_int8_enable_fp32_cpu_offload=True`, `compute_module_sizes`' total with the quantizer,
//!   and the refusal without the flag;
//! - `grid30q.jsonl` / `grid30q_untouched.jsonl`: the pre-registered rows of
//!   `lab/grids/make_grid30q.py` measured on the GPU;
//! - `grid30q_refusal.json`: transformers' refusal of an offloading map without the flag;
//! - `grid30q_nvidia-smi.txt`: the card (H100 80GB HBM3, driver 580.159.04); the rows hold
//!   torch 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0, bitsandbytes 0.50.2.
//!
//! Until a file is there its test says so and passes.

use crate::device_map::{as_map, planned_map};
use serde_json::Value;
use std::collections::BTreeMap;
use vramlab_core::model::{ModelSpec, hf};
use vramlab_core::plan::PlanError;
use vramlab_core::plan::config::{AllocatorConfig, Attention};
use vramlab_core::plan::finetune_mode::Quant;
use vramlab_core::plan::inference::device_map::{
    BNB_4BIT_OFFLOAD_ERRORS, BNB_4BIT_OFFLOAD_VERSIONS, BNB_OFFLOAD_REFUSAL, MaxMemory, Placement,
};
use vramlab_core::plan::inference::quant::Int8Outliers;
use vramlab_core::plan::inference::{Decoding, InferConfig, InferPlanner, InferStep, KvCache};
use vramlab_core::plan::policy::QuantStorage;
use vramlab_words::{max_memory_bytes, parse_dtype};

/// The rows of `tests/data/infer/FILE`, `None` while the file is absent.
fn rows(file: &str) -> Option<Vec<Value>> {
    let text = std::fs::read_to_string(crate::data(&format!("infer/{file}"))).ok()?;
    Some(
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("json row"))
            .collect(),
    )
}

fn preset(row: &Value) -> vramlab_core::model::Preset {
    let path = row["model"].as_str().expect("model");
    let text = std::fs::read_to_string(crate::data("").join("../..").join(path)).expect("config");
    hf::from_config_text(&text, path).expect("preset")
}

fn quant(row: &Value) -> QuantStorage {
    let quant: Quant = vramlab_words::parse(row["quant"].as_str().expect("quant")).expect("quant");
    QuantStorage {
        quant,
        double_quant: quant.is_4bit() && row["double_quant"].as_bool().unwrap_or(true),
    }
}

fn budget(row: &Value) -> MaxMemory {
    let size = |k: &str| {
        row[k]
            .as_str()
            .map(|s| max_memory_bytes(s).expect("size"))
            .or_else(|| row[k].as_u64())
    };
    MaxMemory {
        gpu: size("max_gpu_memory").expect("max_gpu_memory"),
        cpu: size("max_cpu_memory"),
    }
}

fn placement(row: &Value, flag: bool) -> Result<Placement, PlanError> {
    let p = preset(row);
    let ModelSpec::Llama(lp) = &p.spec else {
        panic!("{}: not a Llama-lineage decoder", p.id)
    };
    let d = parse_dtype(row["precision"].as_str().expect("precision")).expect("dtype");
    Placement::of_quant(lp, d.size(), budget(row), Some(quant(row)), flag)
}

/// transformers' `_get_device_map` with the bitsandbytes quantizer, module for module; its
/// `compute_module_sizes` total; its refusal without `llm_int8_enable_fp32_cpu_offload`.
#[test]
fn quant_device_maps_equal_transformers() {
    let Some(rows) = rows("quant_device_maps.jsonl") else {
        println!("tests/data/infer/quant_device_maps.jsonl absent: session 30b not added yet");
        return;
    };
    let mut checked = 0;
    for row in &rows {
        let what = format!(
            "{} {} {} dq={} gpu {}",
            row["model"],
            row["precision"],
            row["quant"],
            row["double_quant"],
            row["max_gpu_memory"]
        );
        if let Some(e) = row.get("error") {
            println!("{what}: transformers raised {e}");
            continue;
        }
        let p = placement(row, true).unwrap_or_else(|e| panic!("{what}: {e}"));
        let o = &p.offload;
        assert_eq!(
            o.gpu_bytes + o.cpu_bytes + o.disk_bytes,
            // quant_device_maps.py wrote some totals as floats (1012011264.0)
            row["weights_bytes"].as_f64().expect("weights_bytes") as u64,
            "{what}: compute_module_sizes total"
        );
        let want = as_map(&row["device_map"]);
        let got = planned_map(&p);
        assert_eq!(got, want, "{what}");
        let refused = placement(row, false).err();
        match (row["refused_without_flag"].as_str(), refused) {
            (None, None) => {}
            (Some(msg), Some(PlanError::Field { field, reason })) => {
                assert_eq!(field, "llm_int8_enable_fp32_cpu_offload");
                assert!(msg.contains(BNB_OFFLOAD_REFUSAL), "{what}: {msg}");
                assert!(reason.contains(BNB_OFFLOAD_REFUSAL), "{what}");
            }
            (want, got) => panic!("{what}: transformers refused {want:?}, planned {got:?}"),
        }
        checked += 1;
    }
    println!("quant_device_maps: {checked} of {} maps equal", rows.len());
    // session 30b: all 120 rows (10 configs × nf4 bf16 / nf4 fp16 / int8 bf16 × 4 budgets),
    // transformers raised on none
    assert_eq!(checked, rows.len(), "maps checked");
    assert_eq!(rows.len(), 120);
}

/// The inference settings of a grid row.
fn infer_config(row: &Value) -> InferConfig {
    let s = |k: &str| row[k].as_str().unwrap_or_default().to_string();
    let u = |k: &str| row[k].as_u64();
    InferConfig {
        step: vramlab_words::parse::<InferStep>(&s("step")).expect("step"),
        batch: u("batch").expect("batch"),
        prompt: u("prompt").expect("prompt"),
        new_tokens: u("new_tokens").unwrap_or(0),
        dtype: parse_dtype(&s("precision")).expect("precision"),
        attention: if s("attention") == "eager" {
            Attention::Eager
        } else {
            Attention::Sdpa
        },
        kv_cache: vramlab_words::parse::<KvCache>(&s("kv_cache")).unwrap_or_default(),
        allocator: AllocatorConfig::default(),
    }
}

/// `InferPlanner::with_device_map_quant` of a grid row (`fp32_cpu_offload` as the row says).
fn planner(row: &Value, flag: bool) -> Result<InferPlanner, PlanError> {
    InferPlanner::with_device_map_quant(
        &preset(row),
        &infer_config(row),
        &Decoding::default(),
        budget(row),
        Some(quant(row)),
        flag,
    )
}

/// One measured row planned: (map equal, |allocated error|, |reserved error|).
fn compare(row: &Value) -> (bool, f64, f64) {
    let id = row["id"].as_str().unwrap_or_default();
    let s = |k: &str| row[k].as_str().unwrap_or_default().to_string();
    let u = |k: &str| row[k].as_u64();
    let cfg = infer_config(row);
    let flag = row["fp32_cpu_offload"].as_bool().unwrap_or(false);
    let planner = planner(row, flag)
        .unwrap_or_else(|e| panic!("{id}: {e}"))
        // the runner's checkpoints are `from_config`'s random weights
        .with_int8_outliers(Int8Outliers::RandomInit { std: 0.02 });
    let pl = planner.placement.as_ref().expect("placement");
    let planned = planned_map(pl);
    let want = row
        .get("hf_device_map")
        .map_or_else(|| BTreeMap::from([(String::new(), "0".into())]), as_map);
    let plan = planner.plan(cfg.batch).expect("plan");
    let err = |p: u64, m: Option<u64>| m.map_or(f64::NAN, |m| (p as f64 - m as f64) / m as f64);
    let a = err(plan.peak_allocated_bytes.0, u("peak_allocated"));
    let r = err(plan.peak_reserved_bytes.0, u("peak_reserved"));
    println!(
        "{id} {} {} {}: map {}; {}/{} layers on GPU 0; allocated {} planned vs {} measured \
         ({:+.2}%), reserved {} vs {} ({:+.2}%) (offloaded params {})",
        s("model_type"),
        s("quant"),
        s("step"),
        if planned == want { "equal" } else { "DIFFERS" },
        pl.offload.layers_gpu,
        pl.offload.layers,
        plan.peak_allocated_bytes.0,
        row["peak_allocated"],
        100.0 * a,
        plan.peak_reserved_bytes.0,
        row["peak_reserved"],
        100.0 * r,
        row["offloaded_params"]
    );
    if planned != want {
        println!("  planned {planned:?}\n  hf_device_map {want:?}");
    }
    (planned == want, a.abs(), r.abs())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// grid30q's fit rows (session 30b, H100 80GB HBM3, `tests/data/infer/grid30q.jsonl`): 5 of
/// the 6 drawn (g30q-007 was left unrun by the device script's 200 s deadline; its checkpoint
/// gave `grid30q_refusal.json`). The 3 int8 rows ran: the planned map is `hf_device_map` and
/// the peaks are within issue 29's bounds (allocated / reserved medians ≤ 2 % / ≤ 4 %; they
/// came out at 0.02 % / 0.10 %) and each row within 0.5 % (worst: 0.05 % / 0.15 %). The 2 nf4
/// rows failed at the first forward with modules offloaded; the planner refuses them with the
/// error each raised.
#[test]
fn grid30q_quantized_device_map_rows() {
    let Some(rows) = rows("grid30q.jsonl") else {
        println!("tests/data/infer/grid30q.jsonl absent: session 30b not added yet");
        return;
    };
    let ids: Vec<&str> = rows.iter().map(|r| r["id"].as_str().expect("id")).collect();
    assert_eq!(ids.len(), 5, "5 of the 6 fit rows ran: {ids:?}");
    assert!(!ids.contains(&"g30q-007"), "g30q-007 was left unrun");
    for r in &rows {
        for (k, v) in [
            ("transformers", "5.17.0"),
            ("accelerate", "1.15.0"),
            ("bitsandbytes", "0.50.2"),
            ("torch", "2.11.0+cu130"),
        ] {
            assert_eq!(r[k], v, "{}", r["id"]);
        }
    }
    let (failed, ran): (Vec<&Value>, Vec<&Value>) =
        rows.iter().partition(|r| r.get("error").is_some());
    // the rows that failed on the GPU: 4-bit with offloaded modules, refused by the planner
    // with the error they raised
    assert_eq!(failed.len(), 2);
    for r in &failed {
        let id = r["id"].as_str().unwrap_or_default();
        let error = r["error"].as_str().expect("error");
        assert!(BNB_4BIT_OFFLOAD_ERRORS.contains(&error), "{id}: {error}");
        assert!(quant(r).quant.is_4bit(), "{id}");
        let flag = r["fp32_cpu_offload"].as_bool().expect("flag");
        assert!(flag, "{id}");
        let offloads = placement(r, flag).expect("placement").device_map.offloads();
        assert!(offloads, "{id}: the map offloads");
        match planner(r, flag) {
            Err(PlanError::Field { field, reason }) => {
                assert_eq!(field, "quant", "{id}");
                assert!(reason.contains(error), "{id}: {reason}");
                assert!(reason.contains(BNB_4BIT_OFFLOAD_VERSIONS), "{id}: {reason}");
                println!("{id}: refused (measured: {error})");
            }
            other => panic!("{id}: planned {:?}", other.map(|_| ())),
        }
    }
    assert_eq!(ran.len(), 3);
    let got: Vec<(bool, f64, f64)> = ran.iter().map(|r| compare(r)).collect();
    let equal = got.iter().filter(|g| g.0).count();
    let am = median(got.iter().map(|g| g.1).collect());
    let rm = median(got.iter().map(|g| g.2).collect());
    println!(
        "grid30q: maps equal {equal} of {}; allocated median {am:.4}, reserved median {rm:.4}",
        got.len()
    );
    assert_eq!(equal, got.len());
    assert!(am <= 0.02, "allocated median {am}");
    assert!(rm <= 0.04, "reserved median {rm}");
    for g in &got {
        assert!(g.1 <= 0.005 && g.2 <= 0.005, "a row past 0.5 %: {got:?}");
    }
}

/// `grid30q_refusal.json`: g30q-007's checkpoint (Qwen2.5-0.5B int8, `max_memory={0:
/// "625MiB"}`) loaded without `llm_int8_enable_fp32_cpu_offload`: transformers raised
/// [`BNB_OFFLOAD_REFUSAL`] word for word, and the placement refuses it the same way.
#[test]
fn grid30q_refusal_without_the_flag() {
    let Ok(text) = std::fs::read_to_string(crate::data("infer/grid30q_refusal.json")) else {
        println!("tests/data/infer/grid30q_refusal.json absent: session 30b not added yet");
        return;
    };
    let got: Value = serde_json::from_str(&text).expect("json");
    let refused = got["refused"].as_str().expect("refused");
    assert!(refused.starts_with("ValueError: "), "{refused}");
    assert!(refused.contains(BNB_OFFLOAD_REFUSAL), "{refused}");
    let configs = std::fs::read_to_string(crate::data("../../lab/grids/grid30q_configs.jsonl"))
        .expect("configs");
    let row: Value = configs
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("row"))
        .find(|r| r["id"] == got["id"])
        .expect("the row");
    assert_eq!(row["max_gpu_memory"], got["max_gpu_memory"]);
    match placement(&row, false) {
        Err(PlanError::Field { field, reason }) => {
            assert_eq!(field, "llm_int8_enable_fp32_cpu_offload");
            assert!(reason.contains(BNB_OFFLOAD_REFUSAL), "{reason}");
        }
        other => panic!("planned {:?}", other.map(|_| ())),
    }
    assert!(placement(&row, true).is_ok());
}

/// grid30q's untouched third, read once, as it came out (printed, not bounded).
#[test]
fn grid30q_untouched_third() {
    let Some(rows) = rows("grid30q_untouched.jsonl") else {
        println!("tests/data/infer/grid30q_untouched.jsonl absent: session 30b not added yet");
        return;
    };
    for r in &rows {
        match r.get("error") {
            Some(e) => println!("{}: {e}", r["id"]),
            None => {
                compare(r);
            }
        }
    }
}
