//! Issue 29's pre-registered inference grid (`lab/grids/make_grid29.py`, measured on an H200 by
//! `lab/run grid29_lanes` → `lab/device/infer_runner.py`, one process per row, several
//! side by side on the GPU; memory stats are per process): `generate` and no_grad prefill
//! calls drawn at random over model types, caches, dtypes, attention, batch, prompt and new
//! tokens. The plan of every measured fit row is compared with the device; the untouched
//! third (`tests/data/infer/grid29_untouched.jsonl`) is read once, after the fixes
//! (`grid29_untouched_third`).

use serde_json::Value;
use vramlab_core::model::hf;
use vramlab_core::plan::config::{AllocatorConfig, Attention};
use vramlab_core::plan::inference::{Decoding, InferConfig, InferPlanner, InferStep, KvCache};
use vramlab_words::parse_dtype;

/// One measured row and its plan.
struct Compared {
    id: String,
    what: String,
    /// The groups this row is summarised in: step, cache, attention, model type.
    groups: [String; 4],
    measured: [u64; 2],
    planned: [u64; 2],
}

impl Compared {
    /// Signed relative errors (plan − measured) / measured of allocated and reserved.
    fn errors(&self) -> [f64; 2] {
        [0, 1].map(|i| (self.planned[i] as f64 - self.measured[i] as f64) / self.measured[i] as f64)
    }
}

fn root(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// A grid row's call (lab/device/infer_runner.py keys).
pub(crate) fn config(row: &Value) -> InferConfig {
    let s = |k: &str| row[k].as_str().unwrap_or_default().to_string();
    let u = |k: &str| row[k].as_u64().unwrap_or(0);
    InferConfig {
        step: vramlab_words::parse::<InferStep>(&s("step")).expect("step"),
        batch: u("batch"),
        prompt: u("prompt"),
        new_tokens: u("new_tokens"),
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

/// A row's decoding (lab/grids/make_grid29b.py): transformers' defaults for what it leaves out.
fn decoding(row: &Value) -> Decoding {
    let d = Decoding::default();
    Decoding {
        do_sample: row["do_sample"].as_bool().unwrap_or(d.do_sample),
        temperature: row["temperature"].as_f64().unwrap_or(d.temperature),
        top_k: row["top_k"].as_u64().unwrap_or(d.top_k),
        top_p: row["top_p"].as_f64().unwrap_or(d.top_p),
        num_beams: row["num_beams"].as_u64().unwrap_or(1),
    }
}

/// Plans every row that ran (no OOM, no error) of a grid result file, but beam search.
fn compare(file: &str) -> Vec<Compared> {
    compare_rows(file, false)
}

/// Plans the rows that ran of a grid result file: those with beam search (`beams`), or the
/// others.
fn compare_rows(file: &str, beams: bool) -> Vec<Compared> {
    let text = std::fs::read_to_string(crate::data(file)).expect("grid results");
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let row: Value = serde_json::from_str(line).expect("json row");
        if row["oom"].as_bool() != Some(false) || row.get("error").is_some() {
            continue;
        }
        let model = row["model"].as_str().expect("model");
        let text = std::fs::read_to_string(root(model)).expect("config.json");
        let preset = hf::from_config_text(&text, model).expect("preset");
        let cfg = config(&row);
        if (row["num_beams"].as_u64().unwrap_or(1) > 1) != beams {
            continue;
        }
        let dec = decoding(&row);
        let plan = InferPlanner::with_decoding(&preset, &cfg, &dec)
            .and_then(|p| p.plan(cfg.batch))
            .unwrap_or_else(|e| panic!("{}: {e}", row["id"]));
        out.push(Compared {
            id: row["id"].as_str().unwrap_or_default().to_string(),
            groups: [
                format!("step {}", cfg.step),
                format!("cache {}", cfg.kv_cache.as_str()),
                format!(
                    "attention {}",
                    row["attention"].as_str().unwrap_or_default()
                ),
                format!("model {}", row["model_type"].as_str().unwrap_or_default()),
            ],
            what: format!(
                "{} {} b{} p{} n{} {} {} {}",
                row["model_type"].as_str().unwrap_or_default(),
                cfg.step,
                cfg.batch,
                cfg.prompt,
                cfg.new_tokens,
                row["precision"].as_str().unwrap_or_default(),
                row["attention"].as_str().unwrap_or_default(),
                cfg.kv_cache.as_str()
            ),
            measured: [
                row["peak_allocated"].as_u64().expect("peak_allocated"),
                row["peak_reserved"].as_u64().expect("peak_reserved"),
            ],
            planned: [plan.peak_allocated_bytes.0, plan.peak_reserved_bytes.0],
        });
    }
    out
}

/// Median and worst of the absolute errors of allocated (0) and reserved (1).
fn stats(rows: &[&Compared]) -> [[f64; 2]; 2] {
    [0, 1].map(|i| {
        let mut e: Vec<f64> = rows.iter().map(|r| r.errors()[i].abs()).collect();
        e.sort_by(f64::total_cmp);
        let median = match e.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => e[n / 2],
            n => 0.5 * (e[n / 2 - 1] + e[n / 2]),
        };
        [median, e.last().copied().unwrap_or(f64::NAN)]
    })
}

/// Prints every row (planned vs measured, signed %), then median / worst per group and over
/// all rows; returns the latter.
fn report(rows: &[Compared]) -> [[f64; 2]; 2] {
    println!(
        "{:<8} {:<52} {:>8} {:>8} {:>8}  {:>8} {:>8} {:>8}",
        "id", "row", "alloc", "planned", "err", "reserved", "planned", "err"
    );
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for r in rows {
        let [a, res] = r.errors();
        println!(
            "{:<8} {:<52} {:>8.3} {:>8.3} {:>+7.2}%  {:>8.3} {:>8.3} {:>+7.2}%",
            r.id,
            r.what,
            gib(r.measured[0]),
            gib(r.planned[0]),
            100.0 * a,
            gib(r.measured[1]),
            gib(r.planned[1]),
            100.0 * res
        );
    }
    let mut groups: Vec<&String> = rows.iter().flat_map(|r| r.groups.iter()).collect();
    groups.sort();
    groups.dedup();
    let line = |name: &str, sel: Vec<&Compared>| {
        let [a, r] = stats(&sel);
        println!(
            "{:<28} {:>3} rows: allocated median {:>5.2}% worst {:>5.2}%; reserved median {:>5.2}% worst {:>5.2}%",
            name,
            sel.len(),
            100.0 * a[0],
            100.0 * a[1],
            100.0 * r[0],
            100.0 * r[1]
        );
    };
    for g in groups {
        line(g, rows.iter().filter(|r| r.groups.contains(g)).collect());
    }
    let all: Vec<&Compared> = rows.iter().collect();
    line("all", all.clone());
    stats(&all)
}

/// The fit rows (what the planner was fixed against, 32 rows): allocated within the issue's
/// bounds (median ≤ 2 %, worst ≤ 8 %), reserved median ≤ 4 %. After the fixes: allocated
/// median 0.00 %, worst 1.26 % (g29-001, gemma3 bf16 generate b32 n336); reserved median
/// 0.18 %, worst 12.13 % (g29-008, qwen2 bf16 static-cache generate b32: the allocator model
/// fragments the measured call's 436 MiB MLP blocks where the device reuses the warm-up's), so
/// reserved worst is bounded at 13 %.
#[test]
fn grid29_fit_rows() {
    let rows = compare("infer/grid29.jsonl");
    assert_eq!(rows.len(), 32, "the fit rows ran 32 rows");
    let [alloc, reserved] = report(&rows);
    assert!(alloc[0] <= 0.02, "allocated median {alloc:?}");
    assert!(alloc[1] <= 0.08, "allocated worst {alloc:?}");
    assert!(reserved[0] <= 0.04, "reserved median {reserved:?}");
    assert!(reserved[1] <= 0.13, "reserved worst {reserved:?}");
}

/// The untouched third (`tests/data/infer/grid29_untouched.jsonl`, 16 rows: llama, qwen3,
/// phi3, gemma, gemma3; dynamic and static caches; fp32 / bf16 / fp16; one eager), read once
/// after the fixes (2026-12-04). As it came out: allocated median 0.00 %, worst 0.16 %
/// (g29-044, gemma3 fp16 generate b1, −0.16 %); reserved median 0.05 %, worst 6.89 % (g29-033,
/// qwen3 bf16 generate b64 p2535, planned −6.89 %). The bounds are the (allocated
/// median ≤ 2 %, worst ≤ 8 %; reserved median ≤ 4 %) and reserved worst ≤ 8 %, all of which
/// held.
#[test]
fn grid29_untouched_third() {
    let rows = compare("infer/grid29_untouched.jsonl");
    assert_eq!(rows.len(), 16, "the untouched third ran 16 rows");
    let [alloc, reserved] = report(&rows);
    assert!(alloc[0] <= 0.02, "allocated median {alloc:?}");
    assert!(alloc[1] <= 0.08, "allocated worst {alloc:?}");
    assert!(reserved[0] <= 0.04, "reserved median {reserved:?}");
    assert!(reserved[1] <= 0.08, "reserved worst {reserved:?}");
}

/// Sampling (`lab/grids/make_grid29b.py`, measured in session 19 on an H100 80GB HBM3, driver
/// 580.159.04, torch 2.11.0+cu130, transformers 5.17.0): the fit rows that sample (9; the 3
/// beam-search rows are refused by the planner and left out), within the bounds
/// (allocated median ≤ 2 %, worst ≤ 8 %; reserved median ≤ 4 %).
#[test]
fn grid29b_sampling_fit_rows() {
    let rows = compare("infer/grid29b.jsonl");
    assert_eq!(rows.len(), 9, "the sampling fit rows");
    let [alloc, reserved] = report(&rows);
    assert!(alloc[0] <= 0.02, "allocated median {alloc:?}");
    assert!(alloc[1] <= 0.08, "allocated worst {alloc:?}");
    assert!(reserved[0] <= 0.04, "reserved median {reserved:?}");
}

/// Beam search (`lab/grids/make_grid29b.py`'s 3 fit rows with `num_beams` 2–4, measured in
/// session 19 with the sampling rows; planned from session 21).
#[test]
fn grid29b_beam_fit_rows() {
    let rows = compare_rows("infer/grid29b.jsonl", true);
    assert_eq!(rows.len(), 3, "the beam-search fit rows");
    let [alloc, reserved] = report(&rows);
    assert!(alloc[1] <= 0.08, "allocated worst {alloc:?}");
    assert!(reserved[0] <= 0.04, "reserved median {reserved:?}");
}

/// Beam search's untouched third (`grid29b_untouched.jsonl`'s 3 rows with `num_beams`),
/// read once in session 21 after the fit rows, with no fix after it; printed as it came out
/// (docs/inference.md quotes it).
#[test]
fn grid29b_beam_untouched_third() {
    let rows = compare_rows("infer/grid29b_untouched.jsonl", true);
    assert_eq!(rows.len(), 3, "the untouched beam-search rows");
    report(&rows);
}

/// Sampling's untouched third (`tests/data/infer/grid29b_untouched.jsonl`: 3 sampling rows;
/// its 3 beam-search rows are refused by the planner), read once at the end of session 19
/// with no fix after it; printed as it came out (docs/inference.md quotes it).
#[test]
fn grid29b_sampling_untouched_third() {
    let rows = compare("infer/grid29b_untouched.jsonl");
    assert_eq!(rows.len(), 3, "the untouched sampling rows");
    report(&rows);
}

/// Mixture-of-experts decoders (`lab/grids/make_grid29d.py`: qwen2_moe, qwen3_moe and gpt_oss —
/// transformers 5.17 forces eager attention for gpt_oss: sinks, alternating sliding window),
/// measured in session 23 on an H200 (driver 580.159.04, torch 2.11.0+cu130, transformers
/// 5.17.0; `tests/data/infer/grid29d_nvidia-smi.txt`): the 16 fit rows. As first planned:
/// allocated median 0.00 %, worst 6.13 % (g29d-011, qwen2_moe b32 static: 1.82 GiB under;
/// g29d-014, gpt_oss fp16 b8: 1.29 GiB under), both under at a decode step: generate's
/// decode loop switches the experts to `batched_mm`, which gathers each routed row's expert
/// weights (`plan/inference/moe.rs`, `batched_experts`). With it: allocated median 0.00 %,
/// worst 0.35 %; reserved median 0.01 %, worst 4.55 % (g29d-009, gpt_oss eager static
/// b2 p3342: the allocator model, its allocated exact).
#[test]
fn grid29d_moe_fit_rows() {
    let rows = compare("infer/grid29d.jsonl");
    assert_eq!(rows.len(), 16, "the MoE fit rows");
    let [alloc, reserved] = report(&rows);
    assert!(alloc[0] <= 0.001, "allocated median {alloc:?}");
    assert!(alloc[1] <= 0.01, "allocated worst {alloc:?}");
    assert!(reserved[0] <= 0.01, "reserved median {reserved:?}");
    assert!(reserved[1] <= 0.05, "reserved worst {reserved:?}");
}

/// grid29d's untouched third (8 rows), read once after the fix above, with no fix after it;
/// printed as it came out (docs/inference.md quotes it).
#[test]
fn grid29d_moe_untouched_third() {
    let rows = compare("infer/grid29d_untouched.jsonl");
    assert_eq!(rows.len(), 8, "the untouched MoE rows");
    report(&rows);
}

/// Gemma 2 inference (session 25: no longer refused; the attention soft-cap is eager's only),
/// the pre-registered calls of `lab/grids/make_gemma2_infer_s25.py` (committed before any was
/// measured), run by `lab/run grid29_lanes` on an H100 80GB HBM3 (driver 580.159.04, torch
/// 2.11.0+cu130, transformers 5.17.0; each call in its own process, several at once): the fit
/// two-thirds.
#[test]
fn gemma2_inference_fit_rows() {
    let rows = compare("infer/gemma2_infer_s25.jsonl");
    assert_eq!(rows.len(), 8);
    let [alloc, reserved] = report(&rows);
    // As measured, the first time Gemma 2 inference was planned: allocated median 0.00 %,
    // worst 0.02 %; reserved median 0.14 %, worst 2.90 % (gi25-005, fp16 SDPA generate with a
    // 6721-token prompt past the 4096 window, planned under). Eager (3 rows, the soft-cap's
    // three score tensors) within 0.01 % allocated.
    assert!(
        alloc[0] <= 0.001 && alloc[1] <= 0.001,
        "allocated {alloc:?}"
    );
    assert!(
        reserved[0] <= 0.01 && reserved[1] <= 0.03,
        "reserved {reserved:?}"
    );
}

/// The untouched third of the Gemma 2 inference grid (4 calls), read once, as it came out.
#[test]
fn gemma2_inference_untouched_third() {
    let rows = compare("infer/gemma2_infer_s25_untouched.jsonl");
    assert_eq!(rows.len(), 4);
    let [alloc, reserved] = report(&rows);
    println!("untouched: allocated {alloc:?}, reserved {reserved:?}");
    // As it came out: allocated median 0.00 %, worst 0.05 %; reserved median 1.25 %, worst
    // 5.04 % (gi25-010, bf16 eager generate b8 p1365 n207: planned under, the allocator model
    // as in grid29's generate rows, not the op sequence: allocated exact).
    assert!(
        alloc[0] <= 0.001 && alloc[1] <= 0.001,
        "allocated {alloc:?}"
    );
    assert!(
        reserved[0] <= 0.02 && reserved[1] <= 0.055,
        "reserved {reserved:?}"
    );
}

/// The answer's verdict skips the capped replay when the uncapped peak reserved is within the
/// cap; it must say what the capped replay says, at every batch, on small and tight caps.
#[test]
fn the_answers_verdict_equals_the_capped_replay() {
    use vramlab_core::answer::inference::fits;
    use vramlab_core::plan::config::DType;
    use vramlab_core::plan::search::Budget;
    use vramlab_core::units::Bytes;
    let preset = vramlab_core::model::preset::find_builtin("TinyLlama-1.1B").expect("preset");
    let cfg = InferConfig::generate(1, 512, 64, DType::BF16);
    let planner = InferPlanner::new(&preset, &cfg).expect("planner");
    let mut both = [0u32; 2];
    for gib in [3u64, 4, 6, 8, 12] {
        let budget = Budget {
            capacity: Bytes(gib << 30),
            margin: 0.05,
        };
        for batch in [1u64, 2, 3, 5, 8, 13, 21, 34] {
            let plan = planner.plan(batch).expect("plan");
            let got = fits(&planner, &plan, budget).expect("verdict");
            let replayed = planner.fits(budget, batch).expect("capped replay");
            assert_eq!(got, replayed, "{gib} GiB, batch {batch}");
            both[usize::from(got)] += 1;
        }
    }
    assert!(both[0] > 0 && both[1] > 0, "both verdicts met: {both:?}");
}
