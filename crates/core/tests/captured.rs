//! Captured graphs (`tests/data/captured/*.vramlab-graph.json`, written by `runners/capture.py`
//! on the H200 machine on fake tensors) planned by the core and compared with the same
//! training step run for real on the H200 (`tests/data/captured.jsonl`, written by
//! `lab/run capture`). CI has no torch: the graphs are committed.

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
pub fn own_config(p: &Preset, batch: u64) -> TrainConfig {
    let ModelSpec::Captured(c) = &p.spec else {
        panic!("not captured")
    };
    let v = vramlab_words::vocabulary::precision(&c.settings.precision).expect("precision");
    let o = vramlab_words::vocabulary::optimizer(&c.settings.optimizer).expect("optimizer");
    TrainConfig {
        batch,
        precision: v.value,
        optimizer: o.value,
        checkpointing: c.settings.checkpointing,
        loop_shape: vramlab_words::parse(&c.settings.loop_shape).expect("loop"),
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
        let mib = |b: u64| b as f64 / 1048576.0;
        println!(
            "{:<44} {:<8} b={:<3} alloc {:+6.2} %  reserved {:+6.2} %  | {} | {:.0} | {:.0} | {:.0} | {:.0}",
            row.model,
            row.loop_shape,
            row.batch,
            ea,
            er,
            row.graph,
            mib(row.peak_allocated),
            mib(peaks.allocated.0),
            mib(row.peak_reserved),
            mib(peaks.reserved.0)
        );
        a.push(ea.abs());
        r.push(er.abs());
        if !models.contains(&row.model) {
            models.push(row.model);
        }
    }
    (a, r, models)
}

/// The issue's "Done when": ≥ 12 models no builder covers (timm architectures, a
/// torchvision segmentation model, a hand-written module, a language model), allocated
/// median |error| ≤ 2 %, worst ≤ 8 %, reserved median ≤ 4 % — H200, session 9's captures
/// with kernel calls (21 graphs, 16 models, 42 rows).
#[test]
fn captured_models_meet_the_issue_targets() {
    let (a, r, models) = errors();
    assert!(
        models.len() >= 12,
        "only {} models: {models:?}",
        models.len()
    );
    check_bounds(&a, &r, 2.0, 8.0, 4.0);
}

/// The language models captured from their config.json (`--hf`, fake tensors) against the
/// same config.json imported by the builder (`hf::from_config_text`): both plans, for the
/// same step, within 2 % of each other and of the H200 measurement.
#[test]
fn captured_language_models_agree_with_their_config_import() {
    let mut n = 0;
    for row in rows() {
        let Some(name) = row.model.strip_prefix("hf:") else {
            continue;
        };
        n += 1;
        let captured = load(&row.graph);
        let ccfg = own_config(&captured, row.batch);
        let from_capture = Planner::new(&captured, &ccfg)
            .expect("planner")
            .peaks(row.batch)
            .expect("peaks")
            .allocated
            .0;
        let text = std::fs::read_to_string(data(&format!("hf_configs/{name}"))).expect("config");
        let imported =
            vramlab_core::model::hf::from_config_text(&text, name).expect("config.json imports");
        let icfg = TrainConfig {
            size: Some(512),
            ..ccfg
        };
        let from_import = Planner::new(&imported, &icfg)
            .expect("planner")
            .peaks(row.batch)
            .expect("peaks")
            .allocated
            .0;
        let (ec, ei) = (
            err(from_capture, row.peak_allocated),
            err(from_import, row.peak_allocated),
        );
        let between = err(from_capture, from_import);
        println!(
            "{name} {} b={}: captured {ec:+.2} %, imported {ei:+.2} %, captured vs imported {between:+.2} %",
            row.loop_shape, row.batch
        );
        assert!(ec.abs() <= 2.0 && ei.abs() <= 2.0 && between.abs() <= 2.0);
    }
    assert!(n >= 4, "only {n} language-model rows");
}

fn check_bounds(a: &[f64], r: &[f64], median_max: f64, worst_max: f64, reserved_max: f64) {
    use vramlab_core::validate::{max_abs, median_abs};
    let am = median_abs(a.iter().copied());
    let aw = max_abs(a.iter().copied());
    let rm = median_abs(r.iter().copied());
    println!(
        "captured: {} rows: allocated median {am:.2} % worst {aw:.2} %, reserved median {rm:.2} %",
        a.len()
    );
    assert!(am <= median_max, "allocated median {am:.2} %");
    assert!(aw <= worst_max, "allocated worst {aw:.2} %");
    assert!(rm <= reserved_max, "reserved median {rm:.2} %");
}

/// Every committed graph plans at any batch (peaks grow with it), finds a max batch, and
/// refuses settings that change the recorded step, naming the re-capture.
#[test]
fn committed_graphs_plan_at_any_batch_and_refuse_other_settings() {
    let dir = data("captured");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/data/captured") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        if !name.ends_with(".vramlab-graph.json") {
            continue;
        }
        n += 1;
        let p = load(&name);
        let planner = Planner::new(&p, &own_config(&p, 1)).expect("planner");
        let mut last = 0;
        for b in [1, 2, 3, 5, 8, 13, 64, 200] {
            let peaks = planner.peaks(b).expect("peaks");
            assert!(peaks.allocated.0 >= last, "{name}: peak falls at batch {b}");
            assert!(peaks.reserved >= peaks.allocated, "{name}");
            last = peaks.allocated.0;
        }
        let plan = planner.plan(8).expect("plan");
        assert!(plan.params > 0 && !plan.peak_layer.is_empty(), "{name}");
        let budget = vramlab_core::plan::search::Budget {
            capacity: vramlab_core::units::Bytes(141 << 30),
            margin: 0.05,
        };
        let max = vramlab_core::plan::search::max_batch(&planner, budget, 1 << 16)
            .expect("search")
            .expect("batch 1 fits an H200");
        assert!(max >= 8, "{name}: max batch {max}");
        let mut other = own_config(&p, 8);
        other.precision = if other.precision == vramlab_core::plan::Precision::Fp32 {
            vramlab_core::plan::Precision::AmpBf16
        } else {
            vramlab_core::plan::Precision::Fp32
        };
        let e = Planner::new(&p, &other).expect_err("other precision");
        assert!(e.to_string().contains("re-capture"), "{e}");
        other = own_config(&p, 8);
        other.checkpointing = !other.checkpointing;
        let e = Planner::new(&p, &other).expect_err("other checkpointing");
        assert!(e.to_string().contains("checkpointing"), "{e}");
    }
    assert!(n >= 3, "only {n} committed graphs");
}

/// Graphs captured on a machine without a GPU (`tests/data/captured_cpu/`, torch 2.11.0
/// from the package registry on a 2-core CPU-only machine, `runners/capture.py` with its
/// default device, i.e. fake CPU tensors and CUDA's autocast lists from
/// `runners/cuda_autocast.py`) plan like the same models captured on the H200 host
/// (`tests/data/captured/`): peak allocated and reserved within 1 % at batches from 1 to 64
/// (MobileViT too, since runners/cuda_composites.py mirrors CUDA's SDPA backend choice).
#[test]
fn cpu_captures_plan_like_gpu_host_captures() {
    let dir = data("captured_cpu");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("captured_cpu")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".vramlab-graph.json"))
        .collect();
    names.sort();
    let mut worst = 0f64;
    for name in &names {
        let text = std::fs::read_to_string(dir.join(name)).expect("cpu graph");
        let cpu = Preset::from_captured(name, &text).expect("cpu graph parses");
        let doc: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(
            doc["capture"]["device"], "cpu",
            "{name}: captured on the CPU"
        );
        let gpu = load(name);
        for batch in [1u64, 8, 32, 64] {
            let pc = Planner::new(&cpu, &own_config(&cpu, batch))
                .expect("plan")
                .peaks(batch)
                .expect("peaks");
            let pg = Planner::new(&gpu, &own_config(&gpu, batch))
                .expect("plan")
                .peaks(batch)
                .expect("peaks");
            let (ea, er) = (
                err(pc.allocated.0, pg.allocated.0),
                err(pc.reserved.0, pg.reserved.0),
            );
            println!("{name} b{batch}: allocated {ea:+.3} %, reserved {er:+.3} %");
            // MobileViT's attention heads are not a multiple of 8 wide: CUDA's flash kernel
            // pads q/k/v (`constant_pad_nd`, `slice_backward`); runners/cuda_composites.py
            // mirrors that choice on the CPU (it planned 2.5 % low before).
            worst = worst.max(ea.abs()).max(er.abs());
            assert!(
                ea.abs() <= 1.0 && er.abs() <= 1.0,
                "{name} b{batch}: {ea:+.2} / {er:+.2} %"
            );
        }
    }
    println!("{} models, worst {worst:.3} %", names.len());
    assert!(names.len() >= 8, "{} CPU captures", names.len());
}
