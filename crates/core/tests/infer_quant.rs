//! Inference with bitsandbytes-quantized weights (issue 29, `plan::inference::quant`): the
//! bytes bitsandbytes 0.50.2 keeps for tiny models loaded with `quantization_config` on the
//! CPU (`lab/cpu/infer_quant_cpu.py`), exactly.

use serde_json::Value;
use vramlab_core::model::hf;
use vramlab_core::plan::config::{AllocatorConfig, Attention};
use vramlab_core::plan::eval;
use vramlab_core::plan::events::Phase;
use vramlab_core::plan::finetune_mode::Quant;
use vramlab_core::plan::inference::quant::Int8Outliers;
use vramlab_core::plan::inference::{Decoding, InferConfig, InferPlanner, InferStep, KvCache};
use vramlab_core::plan::policy::QuantStorage;
use vramlab_words::parse_dtype;

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
    let quant: Quant = vramlab_words::parse(row["quant"].as_str().expect("quant")).expect("quant");
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
    let step = row["step"].as_str().map_or(InferStep::Prefill, |s| {
        vramlab_words::parse(s).expect("step")
    });
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
        kv_cache: vramlab_words::parse::<KvCache>(&s("kv_cache")).unwrap_or_default(),
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

/// `memory_allocated()` and `memory_reserved()` after `from_pretrained` (and the prompt on
/// the GPU): the state when the first forward begins; and the largest allocated bytes
/// before it (`from_pretrained`'s peak).
fn after_build(p: &InferPlanner, batch: u64) -> (u64, u64, u64) {
    let mut ev = p.events_at(batch).into_owned();
    let setup = ev
        .events
        .iter()
        .position(|e| e.phase != Phase::Setup)
        .unwrap_or(ev.events.len());
    ev.measured_start = 0;
    let t = eval::memory_trace(&ev, batch, AllocatorConfig::default()).expect("trace");
    let peak = t[..=setup].iter().map(|x| x.0.0).max().unwrap_or(0);
    (t[setup].0.0, t[setup].1.0, peak)
}

/// The config's `initializer_range` (transformers' default 0.02).
fn initializer_range(row: &Value) -> f64 {
    let model = row["model"].as_str().expect("model");
    let text = std::fs::read_to_string(root(model)).expect("config.json");
    let v: Value = serde_json::from_str(&text).expect("json");
    v["initializer_range"].as_f64().unwrap_or(0.02)
}

/// One measured row of grid29c and its plan.
struct Row {
    id: String,
    /// Ran in its own process (`"process": "own"`): reserved and the state after the build are
    /// this row's alone (the first run shared one process: its cuBLAS workspace and pool stayed).
    own: bool,
    what: String,
    /// allocated peak, reserved peak, allocated after the build, reserved after the build
    measured: [u64; 4],
    planned: [u64; 4],
}

impl Row {
    /// Signed relative errors (plan − measured) / measured; 0 where not measured.
    fn errors(&self) -> [f64; 4] {
        [0, 1, 2, 3].map(|i| {
            if self.measured[i] == 0 {
                0.0
            } else {
                (self.planned[i] as f64 - self.measured[i] as f64) / self.measured[i] as f64
            }
        })
    }
}

fn grid(file: &str) -> Vec<Row> {
    let mut out = Vec::new();
    for row in rows(file) {
        if row["oom"].as_bool() != Some(false) || row.get("error").is_some() {
            continue;
        }
        // the untouched file holds the device-map rows too
        if row.get("quant").is_none() {
            continue;
        }
        // the runner's checkpoints are `from_config`'s random weights
        let p = planner(&row).with_int8_outliers(Int8Outliers::RandomInit {
            std: initializer_range(&row),
        });
        let batch = row["batch"].as_u64().expect("batch");
        let plan = p.plan(batch).expect("plan");
        let (a, r, load_peak) = after_build(&p, batch);
        if std::env::var_os("VRAMLAB_PRINT").is_some() {
            println!(
                "{} planned after build: allocated {} reserved {} (reserved − allocated {} MiB); peak reserved {}",
                row["id"].as_str().unwrap_or_default(),
                a,
                r,
                (r - a) >> 20,
                p.plan(batch).expect("plan").peak_reserved_bytes.0
            );
        }
        if let Some(m) = row["load_peak_allocated"].as_u64() {
            println!(
                "{} load peak allocated {:+.2}%",
                row["id"].as_str().unwrap_or_default(),
                100.0 * (load_peak as f64 - m as f64) / m as f64
            );
        }
        let u = |k: &str| row[k].as_u64().unwrap_or_else(|| panic!("{k} in {row}"));
        out.push(Row {
            id: row["id"].as_str().unwrap_or_default().to_string(),
            own: row["process"] == "own",
            what: format!(
                "{} {} b{} p{} n{} {} {} {}{}",
                row["model_type"].as_str().unwrap_or_default(),
                row["step"].as_str().unwrap_or_default(),
                batch,
                u("prompt"),
                row["new_tokens"].as_u64().unwrap_or(0),
                row["precision"].as_str().unwrap_or_default(),
                row["attention"].as_str().unwrap_or_default(),
                row["quant"].as_str().unwrap_or_default(),
                if row["double_quant"].as_bool() == Some(true) {
                    "+dq"
                } else {
                    ""
                },
            ),
            measured: [
                u("peak_allocated"),
                row["peak_reserved"].as_u64().unwrap_or(0),
                u("allocated_after_build"),
                row["reserved_after_build"].as_u64().unwrap_or(0),
            ],
            planned: [
                plan.peak_allocated_bytes.0,
                plan.peak_reserved_bytes.0,
                a,
                r,
            ],
        });
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn print(rows: &[Row]) {
    for r in rows {
        let e = r.errors();
        println!(
            "{} {:<48} alloc {:+6.2}% reserved {:+6.2}% | after build: alloc {:+6.2}% reserved {:+6.2}%",
            r.id,
            r.what,
            100.0 * e[0],
            100.0 * e[1],
            100.0 * e[2],
            100.0 * e[3]
        );
    }
}

/// The fit rows of grid29c's quantized calls (`lab/grids/make_grid29c.py`, pre-registered;
/// measured on an H100 80GB HBM3 by `lab/device/infer_runner.py`; random-weight checkpoints, so
/// LLM.int8's outlier columns are `Int8Outliers::RandomInit`). Issue 29's targets: peak
/// allocated median ≤ 2 %, worst ≤ 8 %; peak reserved median ≤ 4 % (the rows run in their
/// own process). What `from_pretrained` leaves allocated and reserved is exact there.
#[test]
fn grid29c_quantized_fit_rows() {
    let rows = grid("infer/grid29c_quant.jsonl");
    print(&rows);
    assert_eq!(rows.len(), 18);
    let own: Vec<&Row> = rows.iter().filter(|r| r.own).collect();
    assert_eq!(own.len(), 13);
    let abs =
        |rs: &[&Row], i: usize| -> Vec<f64> { rs.iter().map(|r| r.errors()[i].abs()).collect() };
    let all: Vec<&Row> = rows.iter().collect();
    let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (alloc, reserved) = (abs(&all, 0), abs(&own, 1));
    let (built_a, built_r) = (abs(&own, 2), abs(&own, 3));
    println!(
        "allocated: median {:.2}% worst {:.2}%; reserved (own process): median {:.2}% worst {:.2}%; \
         after the build: allocated worst {:.3}%, reserved worst {:.3}%",
        100.0 * median(alloc.clone()),
        100.0 * worst(&alloc),
        100.0 * median(reserved.clone()),
        100.0 * worst(&reserved),
        100.0 * worst(&built_a),
        100.0 * worst(&built_r),
    );
    assert!(median(alloc.clone()) <= 0.02, "allocated median");
    assert!(worst(&alloc) <= 0.08, "allocated worst");
    assert!(median(reserved) <= 0.04, "reserved median");
    assert!(
        worst(&built_a) <= 0.001 && worst(&built_r) <= 0.001,
        "after the build"
    );
}

/// grid29c's untouched third, its quantized rows (`tests/data/infer/grid29c_untouched.jsonl`),
/// read once after the fixes, as it came out (session 20): allocated (9 rows) median 0.01 %,
/// worst 0.12 %; reserved (7 rows run in their own process) median 1.47 %, worst 2.76 %.
#[test]
fn grid29c_quantized_untouched_third() {
    let rows = grid("infer/grid29c_untouched.jsonl");
    print(&rows);
    assert_eq!(rows.len(), 9, "the untouched quantized rows");
    let own: Vec<&Row> = rows.iter().filter(|r| r.own).collect();
    let abs =
        |rs: &[&Row], i: usize| -> Vec<f64> { rs.iter().map(|r| r.errors()[i].abs()).collect() };
    let all: Vec<&Row> = rows.iter().collect();
    let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (alloc, reserved) = (abs(&all, 0), abs(&own, 1));
    println!(
        "untouched: allocated ({} rows) median {:.2}% worst {:.2}%; reserved ({} rows, own process) \
         median {:.2}% worst {:.2}%",
        all.len(),
        100.0 * median(alloc.clone()),
        100.0 * worst(&alloc),
        own.len(),
        100.0 * median(reserved.clone()),
        100.0 * worst(&reserved),
    );
}
