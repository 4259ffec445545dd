//! Captured graphs (`tests/data/captured/*.vramlab-graph.json`, written by `tools/capture.py`
//! on the H200 machine on fake tensors) planned by the core and compared with the same
//! training step run for real on the H200 (`tests/data/captured.jsonl`, written by
//! `tools/capture_on_device.sh`). CI has no torch: the graphs are committed.

use vramlab_core::model::{ModelSpec, Preset};
use vramlab_core::plan::{Planner, TrainConfig};

use super::data;

#[derive(serde::Deserialize)]
struct Row {
    graph: String,
    model: String,
    batch: u64,
    #[serde(rename = "loop")]
    loop_shape: String,
    peak_allocated: u64,
    peak_reserved: u64,
    device: String,
    torch: String,
}

fn load(graph: &str) -> Preset {
    let path = data(&format!("captured/{graph}"));
    let text = std::fs::read_to_string(&path).expect("graph file");
    Preset::from_captured(graph, &text).expect("captured graph parses")
}

/// The training config the graph was captured with, at `batch`.
fn own_config(p: &Preset, batch: u64) -> TrainConfig {
    let ModelSpec::Captured(c) = &p.spec else {
        panic!("not captured")
    };
    let v = vramlab_core::vocabulary::precision(&c.settings.precision).expect("precision");
    let o = vramlab_core::vocabulary::optimizer(&c.settings.optimizer).expect("optimizer");
    TrainConfig {
        batch,
        precision: v.value,
        optimizer: o.value,
        checkpointing: c.settings.checkpointing,
        loop_shape: c.settings.loop_shape.parse().expect("loop"),
        ..TrainConfig::default()
    }
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(data("captured.jsonl")).expect("captured.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("row"))
        .collect()
}

fn err(pred: u64, meas: u64) -> f64 {
    100.0 * (pred as f64 / meas as f64 - 1.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Every measured row: predicted vs measured peaks. Returns (|alloc| errors, |reserved| errors).
fn errors() -> (Vec<f64>, Vec<f64>, Vec<String>) {
    let mut a = Vec::new();
    let mut r = Vec::new();
    let mut models = Vec::new();
    for row in rows() {
        assert!(row.device.contains("H200"), "{}", row.device);
        assert!(row.torch.starts_with("2.11"), "{}", row.torch);
        let p = load(&row.graph);
        let cfg = own_config(&p, row.batch);
        assert_eq!(cfg.loop_shape.as_str(), row.loop_shape, "{}", row.graph);
        let planner = Planner::new(&p, &cfg).expect("planner");
        let peaks = planner.peaks(row.batch).expect("peaks");
        let ea = err(peaks.allocated.0, row.peak_allocated);
        let er = err(peaks.reserved.0, row.peak_reserved);
        println!(
            "{:<44} {:<8} b={:<3} alloc {:+6.2} %  reserved {:+6.2} %",
            row.model, row.loop_shape, row.batch, ea, er
        );
        a.push(ea.abs());
        r.push(er.abs());
        if !models.contains(&row.model) {
            models.push(row.model);
        }
    }
    (a, r, models)
}
