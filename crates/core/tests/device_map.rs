//! `device_map="auto"` (issue 29): the planner's placement against the maps transformers 5.17
//! itself computes (`lab/cpu/device_map_reference.py`: `_get_device_map` on a meta-device model,
//! accelerate 1.15, on the CPU), module for module.

use serde_json::Value;
use std::collections::BTreeMap;
use vramlab_core::model::{ModelSpec, hf};
use vramlab_core::plan::inference::device_map::{MaxMemory, Placement};
use vramlab_core::plan::inference::{Decoding, InferPlanner};
use vramlab_words::max_memory_bytes;
use vramlab_words::parse_dtype;

fn rows(rel: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(crate::data(rel)).expect("reference file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// A JSON device map as module → device ("0", "cpu", "disk").
pub(crate) fn as_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .expect("device map object")
        .iter()
        .map(|(k, d)| {
            let d = match d {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.clone(),
                other => panic!("device {other}"),
            };
            (k.clone(), d)
        })
        .collect()
}

/// The planner's placement for a row with `model`, `precision`, `max_gpu_memory`,
/// `max_cpu_memory`.
pub fn placement(row: &Value) -> Placement {
    let path = row["model"].as_str().expect("model");
    let text = std::fs::read_to_string(crate::data("").join("../..").join(path)).expect("config");
    let preset = hf::from_config_text(&text, path).expect("preset");
    let ModelSpec::Llama(p) = &preset.spec else {
        panic!("{path}: not a Llama-lineage decoder")
    };
    let d = parse_dtype(row["precision"].as_str().expect("precision")).expect("dtype");
    let budget = MaxMemory {
        gpu: max_memory_bytes(row["max_gpu_memory"].as_str().expect("gpu")).expect("gpu size"),
        cpu: row["max_cpu_memory"]
            .as_str()
            .map(|s| max_memory_bytes(s).expect("cpu size")),
    };
    Placement::of(p, d.size(), budget).expect("placement")
}

pub fn planned_map(p: &Placement) -> BTreeMap<String, String> {
    as_map(&serde_json::to_value(&p.device_map).expect("serialize"))
}

#[test]
fn placement_equals_transformers_device_map() {
    let rows = rows("infer/device_maps_accelerate.jsonl");
    assert!(rows.len() >= 100, "{} rows", rows.len());
    let mut equal = 0;
    let mut kinds = BTreeMap::new();
    for row in &rows {
        let p = placement(row);
        let total = p.offload.gpu_bytes + p.offload.cpu_bytes + p.offload.disk_bytes;
        assert_eq!(
            total,
            row["weights_bytes"].as_u64().expect("weights"),
            "{} {}: compute_module_sizes total",
            row["model"],
            row["precision"]
        );
        let want = as_map(&row["device_map"]);
        let got = planned_map(&p);
        assert_eq!(
            got, want,
            "{} {} gpu {} cpu {}",
            row["model"], row["precision"], row["max_gpu_memory"], row["max_cpu_memory"]
        );
        equal += 1;
        let mut devs: Vec<&String> = want.values().collect();
        devs.sort();
        devs.dedup();
        *kinds.entry(format!("{devs:?}")).or_insert(0) += 1;
    }
    eprintln!(
        "device maps equal to transformers 5.17 / accelerate 1.15: {equal} of {}; by devices used: {kinds:?}",
        rows.len()
    );
    // the reference covers split maps and disk
    assert!(
        kinds
            .keys()
            .any(|k| k.contains("disk") && k.contains("\"0\""))
    );
    assert!(
        kinds
            .keys()
            .any(|k| k.contains("cpu") && k.contains("\"0\""))
    );
}

fn median_worst(mut e: Vec<f64>) -> (f64, f64) {
    e.sort_by(f64::total_cmp);
    let n = e.len();
    let median = if n % 2 == 1 {
        e[n / 2]
    } else {
        0.5 * (e[n / 2 - 1] + e[n / 2])
    };
    (median, e[n - 1])
}

/// Issue 29's pre-registered `device_map="auto"` rows (lab/grids/grid29c_configs.jsonl, the "fit"
/// split: 10 rows), measured on an H100 80GB HBM3 (driver 580.159.04, torch 2.11.0+cu130,
/// transformers 5.17.0, accelerate 1.15.0) by lab/run grid29c →
/// lab/device/infer_runner.py (`from_pretrained` of a saved random-weight checkpoint with
/// `device_map="auto"` and `max_memory`; the warm-up, then the measured call):
/// - the planned map equals `hf_device_map` on every row (absent when nothing is dispatched,
///   `{"": 0}`: 2 rows);
/// - allocated: median 0.02 %, worst 0.78 % (g29c-028, qwen3 generate with every layer on the
///   CPU: 3.5 MiB short), within the bounds;
/// - reserved, on the 5 rows that ran in a process of their own (`"process": "own"`): equal to
///   the byte on all 5 (the first run kept one process for the whole grid, where a segment an
///   early row reserved stayed for the rest; the lead removed the reserved fields of the rows
///   measured only there). The reserved bound is the (median ≤ 4 %).
#[test]
fn grid29c_device_map_rows() {
    let rows = rows("infer/grid29c_device_map.jsonl");
    let got = compare_rows(&rows);
    assert_eq!(got.maps_equal, 10);
    let (am, aw) = got.allocated;
    assert!(
        am <= 0.02 && aw <= 0.08,
        "allocated median {am}, worst {aw}"
    );
    if let Some((rm, _)) = got.reserved {
        assert!(rm <= 0.04, "reserved median {rm}");
    }
}

/// What a set of measured device-map rows came to.
struct Compared {
    /// Rows whose planned map equals `hf_device_map`.
    maps_equal: usize,
    /// |allocated error|: median, worst.
    allocated: (f64, f64),
    /// |reserved error| over the rows run in their own process: median, worst.
    reserved: Option<(f64, f64)>,
}

/// Plans every row, prints it beside the measurement, and sums up.
fn compare_rows(rows: &[Value]) -> Compared {
    let (mut alloc, mut reserved) = (Vec::new(), Vec::new());
    let mut maps_equal = 0;
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for row in rows {
        let id = row["id"].as_str().unwrap_or_default();
        let p = placement(row);
        let want = match row.get("hf_device_map") {
            Some(m) => as_map(m),
            None => BTreeMap::from([(String::new(), "0".to_string())]),
        };
        if planned_map(&p) == want {
            maps_equal += 1;
        } else {
            println!(
                "{id}: planned map {:?}\n  hf_device_map {want:?}",
                planned_map(&p)
            );
        }
        let path = row["model"].as_str().expect("model");
        let text =
            std::fs::read_to_string(crate::data("").join("../..").join(path)).expect("config");
        let preset = hf::from_config_text(&text, path).expect("preset");
        let cfg = crate::inference::config(row);
        let budget = MaxMemory {
            gpu: p.offload.max_gpu_memory_bytes,
            cpu: p.offload.max_cpu_memory_bytes,
        };
        let plan = InferPlanner::with_device_map(&preset, &cfg, &Decoding::default(), budget)
            .and_then(|pl| pl.plan(cfg.batch))
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let err =
            |planned: u64, measured: u64| (planned as f64 - measured as f64) / measured as f64;
        let m_alloc = row["peak_allocated"].as_u64().expect("peak_allocated");
        let a = err(plan.peak_allocated_bytes.0, m_alloc);
        alloc.push(a.abs());
        let res = row["peak_reserved"].as_u64().map(|m| {
            let e = err(plan.peak_reserved_bytes.0, m);
            reserved.push(e.abs());
            format!(
                ", reserved {:.3} planned {:.3} ({:+.2}%)",
                gib(m),
                gib(plan.peak_reserved_bytes.0),
                100.0 * e
            )
        });
        println!(
            "{id} {:<6} {:<8} {:<5} b{:<3} p{:<4} n{:<3} {:<5} gpu {:>8}: {:>2}/{:<2} layers on \
             GPU 0; allocated {:.3} planned {:.3} ({:+.2}%){}",
            row["model_type"].as_str().unwrap_or_default(),
            cfg.step.as_str(),
            row["precision"].as_str().unwrap_or_default(),
            cfg.batch,
            cfg.prompt,
            cfg.new_tokens,
            row["attention"].as_str().unwrap_or_default(),
            row["max_gpu_memory"].as_str().unwrap_or_default(),
            p.offload.layers_gpu,
            p.offload.layers,
            gib(m_alloc),
            gib(plan.peak_allocated_bytes.0),
            100.0 * a,
            res.unwrap_or_default()
        );
    }
    let (am, aw) = median_worst(alloc);
    println!(
        "grid29c device_map: maps equal {maps_equal} of {}; allocated median {:.2}% worst {:.2}%",
        rows.len(),
        100.0 * am,
        100.0 * aw
    );
    let reserved = (!reserved.is_empty()).then(|| {
        let n = reserved.len();
        let (rm, rw) = median_worst(reserved);
        println!(
            "reserved ({n} rows): median {:.2}% worst {:.2}%",
            100.0 * rm,
            100.0 * rw
        );
        (rm, rw)
    });
    Compared {
        maps_equal,
        allocated: (am, aw),
        reserved,
    }
}

/// grid29c's untouched third, its `device_map="auto"` rows (`tests/data/infer/
/// grid29c_untouched.jsonl`), read once after the fixes, as it came out (session 20): maps
/// equal 5 of 5; allocated median 0.08 %, worst 0.14 %; reserved (3 rows run in their own
/// process) median 0.11 %, worst 0.16 %.
#[test]
fn grid29c_device_map_untouched_third() {
    let rows: Vec<Value> = rows("infer/grid29c_untouched.jsonl")
        .into_iter()
        .filter(|r| r.get("device_map").is_some())
        .collect();
    let got = compare_rows(&rows);
    assert_eq!(rows.len(), 5, "the untouched device-map rows");
    println!("untouched: maps equal {} of {}", got.maps_equal, rows.len());
}
