//! `device_map="auto"` (issue 29): the planner's placement against the maps transformers 5.17
//! itself computes (`tools/device_map_reference.py`: `_get_device_map` on a meta-device model,
//! accelerate 1.15, on the CPU), module for module.

use serde_json::Value;
use std::collections::BTreeMap;
use vramlab_core::model::{ModelSpec, hf};
use vramlab_core::plan::inference::device_map::{MaxMemory, Placement, max_memory_bytes};
use vramlab_core::vocabulary::parse_dtype;

fn rows(rel: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(crate::data(rel)).expect("reference file");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// A JSON device map as module → device ("0", "cpu", "disk").
fn as_map(v: &Value) -> BTreeMap<String, String> {
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
