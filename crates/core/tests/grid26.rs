//! Issue 26's pre-registered grid (`lab/grids/make_grid26.py`, measured on an H200 by
//! `lab/run grid26`): LoRA / QLoRA steps drawn at random over the axes users
//! combine, and max-batch searches under caps of 24, 48 and 80 GiB. The untouched third
//! (`tests/data/grid26_lora_untouched.jsonl`) was read once, after the fixes
//! (`grid26_untouched_third`); it does not feed the error bands.

use vramlab_core::model::preset::Preset;
use vramlab_core::plan::Planner;
use vramlab_core::plan::search::max_batch_capped;
use vramlab_core::units::Bytes;
use vramlab_core::validate::{
    Measured, Row, compare, max_abs, median_abs, model_file, parse_lines, summary,
};

pub(crate) fn root(rel: &str) -> String {
    format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// Rows of a grid file with the model paths made absolute (the runner wrote them relative
/// to the repository root).
pub(crate) fn rows(file: &str) -> Vec<Measured> {
    let text = std::fs::read_to_string(crate::data(file)).expect("grid file");
    parse_lines(&text)
        .into_iter()
        .map(|mut m| {
            if m.model.ends_with(".json") {
                m.model = root(&m.model);
            }
            m
        })
        .collect()
}

fn preset(path: &str) -> Preset {
    model_file(path).expect("model file")
}

/// Prints every row and the summary; returns allocated median and worst, reserved median
/// and worst |error| (%).
fn report(got: &[Row]) -> (f64, f64, f64, f64) {
    for r in got {
        println!(
            "{:<34} {:<90} alloc {:+6.1} %  reserved {:+6.1} %",
            r.model.rsplit('/').next().unwrap_or(""),
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    println!("{}", summary(got));
    let a = || got.iter().map(Row::allocated_error);
    let res = || got.iter().map(Row::reserved_error);
    (
        median_abs(a()),
        max_abs(a()),
        median_abs(res()),
        max_abs(res()),
    )
}

/// The fit two-thirds: every valid row is planned (QLoRA in bf16 too: peft upcasts it to
/// fp32) and the misses are bounded where they stand today, so a change that makes them
/// worse fails. Rows peft or the model refuses (Phi-3 has no peft default targets) carry an
/// `error` and are skipped by `usable`.
#[test]
fn grid26_fit_rows_are_planned_within_todays_bounds() {
    let got = compare(&rows("grid26_lora.jsonl")).expect("every usable row plans");
    let (am, aw, rm, rw) = report(&got);
    assert!(got.len() >= 40, "{} rows", got.len());
    // Before the frozen-norm rule (RMSNorm's normalised input is saved only for a trainable
    // weight): allocated 1.14 / 13.0 %, reserved 5.01 / 16.9 %. Now 0.08 / 2.2 %, 1.59 /
    // 10.1 %: issue 26's targets are allocated 1.5 / 6 %, reserved 3 / 10 %.
    assert!(am <= 0.5 && aw <= 3.0, "allocated {am:.2} / {aw:.2}");
    // CUDA's softmax backward temporary (`tmp = grad * output`, session 17) took the worst
    // reserved row (TinyLlama QLoRA fp32 ckpt) from +8.0 to +14.0 %, over the measurement.
    assert!(rm <= 2.0 && rw <= 14.5, "reserved {rm:.2} / {rw:.2}");
}

/// What one set of max-batch searches under caps came to.
#[derive(Default)]
struct Caps {
    /// Searches whose model was built under the cap and were checked.
    checked: usize,
    /// Batches that ran only after the allocator freed its cache and retried.
    flushed: usize,
    /// Of those, the ones the plan without pressure reserves more than the cap for.
    flushed_planned_above: usize,
    /// (id, planned, measured) of every checked search.
    searches: Vec<(String, u64, u64)>,
}

/// Plans every search in `lines` (max-batch outputs of `crates/device/runners/torch_runner.py max-batch`)
/// with the free-and-retry allocator model and prints it beside the largest batch that ran.
/// Searches whose model build itself ran out of memory under the cap are reported, not
/// checked; ids in `skip` (searches run again later) are left out.
fn plan_caps(lines: &[serde_json::Value], skip: &[String]) -> Caps {
    let mut got = Caps::default();
    for s in lines.iter().filter(|v| v.get("max_batch").is_some()) {
        let id = s["config"]["grid_id"].as_str().expect("grid_id");
        if skip.iter().any(|k| k == id) {
            continue;
        }
        let in_process = s["max_batch"].as_u64().expect("max_batch");
        // The largest batch that ran, in the search's process or alone in a fresh one, below
        // any batch that ran out of memory alone in a fresh process: a training script is a
        // fresh process, and what a search's earlier trials left in the pool can carry a batch
        // the script cannot run (c26-09: 93 in the search's process, 85 fresh).
        let fresh = fresh_runs(id);
        let fresh_oom = fresh.iter().filter(|(_, oom)| *oom).map(|(b, _)| *b).min();
        let measured = fresh
            .iter()
            .filter(|(_, oom)| !oom)
            .map(|(b, _)| *b)
            .chain([in_process])
            .filter(|&b| fresh_oom.is_none_or(|o| b < o))
            .max()
            .unwrap_or(0);
        let limit = s["limit"].as_u64().expect("limit");
        let trial = lines
            .iter()
            .find(|v| v["grid_id"] == id && v.get("trial").is_some())
            .expect("a trial");
        let built = lines
            .iter()
            .any(|v| v["grid_id"] == id && v.get("params").is_some());
        let m: Measured = serde_json::from_value(trial.clone()).expect("trial row");
        let model = root(&m.model);
        let cfg = m.config().expect("config");
        let planner = Planner::new(&preset(&model), &cfg).expect("planner");
        let cap = Bytes((s["cap_gib"].as_f64().expect("cap") * (1u64 << 30) as f64) as u64);
        let predicted = max_batch_capped(&planner, cap, limit)
            .expect("search")
            .unwrap_or(0);
        let fresh_note: String = fresh
            .iter()
            .map(|(b, oom)| format!(" b{b} {}", if *oom { "OOM" } else { "ran" }))
            .collect();
        println!(
            "{id} {:<28} {:<70} cap {:>3} GiB: measured {measured:>3}, planned {predicted:>3} (in-process {in_process}{}{fresh_note}){}",
            m.model.rsplit('/').next().unwrap_or(""),
            m.describe(),
            cap.0 >> 30,
            if fresh.is_empty() { "" } else { "; fresh:" },
            if built {
                ""
            } else {
                "  (the build ran out of memory: not checked)"
            }
        );
        if !built {
            continue;
        }
        // Batches that ran: did they need the allocator to free its cache and retry
        // (`num_alloc_retries`), and does the plan without pressure say the same?
        for t in lines.iter().filter(|v| {
            v["grid_id"] == id
                && v["oom"] == serde_json::Value::Bool(false)
                && v.get("alloc_retries").is_some()
        }) {
            let b = t["batch"].as_u64().expect("batch");
            let flushed = t["alloc_retries"].as_u64().unwrap_or(0) > 0;
            let planned = planner.peaks(b).expect("peaks").reserved;
            println!(
                "    b{b}: ran {} cache flushes; planned reserved without pressure {:.2} GiB {} the cap",
                t["alloc_retries"],
                planned.0 as f64 / (1u64 << 30) as f64,
                if planned > cap { "above" } else { "within" }
            );
            if flushed {
                got.flushed += 1;
                got.flushed_planned_above += usize::from(planned > cap);
            }
        }
        got.searches.push((id.to_string(), predicted, measured));
        got.checked += 1;
    }
    println!(
        "steps that ran only after a cache flush: {} ; planned above the cap without pressure: {}",
        got.flushed, got.flushed_planned_above
    );
    got
}

/// Batches of search `id` run alone in a fresh process under the same cap, and whether each
/// ran out of memory: `grid26b/caps_fresh.jsonl` (session 28, H100 80GB HBM3: one batch past
/// the in-process answer, `lab/device/session28.sh`) and c26-06 at b45 (session 27, the
/// allocator history's run, `traces/h100-c26-06-b45-cap48-measure.jsonl`; b46 ran out of
/// memory there too, `traces/h100-c26-06-b46-cap48-oom.log`). A search runs every trial in
/// one process, and what the earlier trials left in the pool can stop it one batch early
/// (c26-06: 44 in-process, 45 fresh; c26b-00: 40, 41; c26b-04: 76, 77).
fn fresh_runs(id: &str) -> Vec<(u64, bool)> {
    let mut runs: Vec<(u64, bool)> = json_lines("grid26b/caps_fresh.jsonl")
        .iter()
        .chain(&json_lines("traces/h100-c26-06-b45-cap48-measure.jsonl"))
        // Session 30 (H100 80GB HBM3, `lab/device/session30c.sh`): c28-07 at b20 alone in a
        // fresh process under its 12 GiB cap ran.
        .chain(&json_lines("grid26b/caps_fresh30.jsonl"))
        // Session 31 (H200, `lab/device/session31.sh`, `session31b.sh`): the two 80 GiB
        // searches, each batch alone in a fresh process: c26-09 b85 ran, b86, b87, b89 and b93
        // ran out of memory; c26b-02 b54 and b55 ran (one cache flush each), b56 ran out.
        .chain(&json_lines("grid26b/caps_fresh31.jsonl"))
        .filter(|v| v["grid_id"] == id)
        .map(|v| {
            (
                v["batch"].as_u64().expect("batch"),
                v["oom"].as_bool().expect("oom"),
            )
        })
        .collect();
    if id == "c26-06" {
        runs.push((46, true));
    }
    runs.sort_unstable();
    runs
}

/// A measured file's rows as JSON values (`tests/data/` relative).
pub(crate) fn json_lines(file: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(crate::data(file))
        .expect("grid file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect()
}

/// Max batch under a cap (`torch.cuda.set_per_process_memory_fraction`): the planner's
/// free-and-retry allocator model against the largest batch that ran — session 11's
/// searches (`grid26/caps.jsonl`) and session 13's (`grid26b/caps.jsonl`: the second grid's
/// fit searches and six of session 11's run again, built in bf16 as `from_pretrained(dtype=)`
/// builds). Never above the largest batch that ran; below it by at most 7 % (one sample for
/// small batches). Issue 26 asks for "within one": c26-09 (Llama-2-7B LoRA under 80 GiB)
/// plans 87 where 93 ran — its allocated peaks are planned to 0.01 GiB, the real allocator
/// got through with six cache flushes where the model of free-and-retry
/// (release_cached_blocks, then one retry) gives up. Session 20 added the grid's three
/// remaining QLoRA searches under 48 GiB, run one at a time on an H100 80GB HBM3
/// (`LANES=1`): c26b-07 (Qwen2.5-0.5B fp32, paged AdamW 8-bit) planned 3, 3 ran; c26b-03
/// (Gemma-2-2B fp32, paged AdamW 8-bit) planned 3, 4 ran (4 since session 24: SDPA no
/// longer planned as eager for the soft-cap, see `gemma2_softcap_is_eager_only`); c26b-04 (Mistral-7B bf16,
/// checkpointed, trainer loop) planned 71, 76 ran — its allocated peaks are planned to the
/// MB, its reserved 15-20 % above what ran (b64: 52.5 GB planned, 43.8 GB measured, no
/// cache flush), so the capped search stops early: safe, and 6.6 % short. Session 23 ran
/// c26b-05 on an H200 (Qwen2.5-0.5B QLoRA fp32, checkpointed, trainer loop, 80 GiB cap):
/// planned 41, 43 ran (b42 and b43 only after a cache flush; planned reserved without
/// pressure 81.4 and 83.3 GiB, above the cap). 16 of the 20 searches are within one.
/// Session 28 ran each 24 and 48 GiB search one batch past its answer in a fresh process
/// ([`fresh_runs`]); with the module frames' references (`Graph::holds`) and `LlamaRMSNorm`'s
/// and dropout's allocation order from the allocator histories, 18 of the 20 are within one
/// of the largest batch that ran: c26-09 plans 85 (87 before) and c26b-02 50 (52), both under
/// 80 GiB caps that an H100 cannot emulate. Session 31 ran both alone in fresh processes on an
/// H200: c26-09's b85 runs and b86 does not (the search's process got through 93 after what
/// its earlier trials left in the pool), so 19 of the 20 are within one; c26b-02 runs b55.
#[test]
fn grid26_max_batch_under_caps() {
    let again = json_lines("grid26b/caps.jsonl");
    let rerun: Vec<String> = again
        .iter()
        .filter(|v| v.get("max_batch").is_some())
        .map(|v| {
            v["config"]["grid_id"]
                .as_str()
                .expect("grid_id")
                .to_string()
        })
        .collect();
    let first = plan_caps(&json_lines("grid26/caps.jsonl"), &rerun);
    let second = plan_caps(&again, &[]);
    for (id, predicted, measured) in first.searches.iter().chain(&second.searches) {
        assert!(
            predicted <= measured,
            "{id}: planned {predicted} > {measured} that ran"
        );
        // Session 31: c26-09 plans 85 and 85 is the largest batch that runs in a fresh
        // process; c26b-02 stops furthest short, 50 for 55 (9.1 %): replaying PyTorch's
        // recorded requests, the allocator model reserves what PyTorch reserved to the byte
        // (`allocator_history.rs`), but the plan's first-step cache flush releases an 864 MiB
        // segment PyTorch kept, and the next step's logits land in half of a freed loss block.
        // Every other search is within one of the largest batch that ran.
        let tol = if id == "c26b-02" {
            5.0
        } else {
            (*measured as f64 * 0.09).max(1.0)
        };
        assert!(
            (measured - predicted) as f64 <= tol,
            "{id}: planned {predicted}, measured {measured}"
        );
    }
    let checked = first.checked + second.checked;
    let within_one = first
        .searches
        .iter()
        .chain(&second.searches)
        .filter(|(_, p, m)| m - p <= 1)
        .count();
    println!("{within_one} of {checked} searches planned within one of the largest batch that ran");
    assert!(within_one >= 19, "{within_one} of {checked} within one");
    for (id, p, m) in first.searches.iter().chain(&second.searches) {
        if m - p > 1 {
            println!("  {id}: planned {p}, {m} ran");
        }
    }
    assert!(checked >= 12, "{checked} searches checked");
    // A step that ran only after the allocator flushed its cache is one the plan, without
    // memory pressure, should reserve more than the cap for: the free-and-retry model is what
    // lets max batch count it. Session 11: 7 of 7 (one step, gpt2 QLoRA b28 at 48.45 planned
    // for a 48 GiB cap, ran without a flush). Session 13: 4 of 5 — c26b-02 (TinyLlama LoRA
    // all-linear, checkpointed, amp-bf16) b52 flushed under 80 GiB where 79.11 GiB is
    // planned: the checkpointed-LoRA reserved under-prediction issue 26 names.
    let flushed = first.flushed + second.flushed;
    let above = first.flushed_planned_above + second.flushed_planned_above;
    println!("flushed steps: {flushed}, planned above the cap: {above}");
    assert!(flushed - above <= 1, "flushed steps planned within the cap");
    assert!(flushed >= 10);
}

/// The second grid's untouched searches (`grid26b/caps_untouched.jsonl`), read once, as
/// they came out.
#[test]
fn grid26b_caps_untouched() {
    // As it came out (session 13): c26b-00 (TinyLlama LoRA all-linear, checkpointed, bf16,
    // 48 GiB) planned 41 where 40 ran — one above, the side that hurts; c26b-01 (Gemma-2-2B
    // LoRA, trainer loop, 48 GiB) planned 10, 10 ran. The one flushed step (c26b-00 b40) was
    // planned above the cap. Session 28: b41 ran in a fresh process (one flush), and the plan
    // with the frames' references says 41 (`caps_fresh.jsonl`).
    let got = plan_caps(&json_lines("grid26b/caps_untouched.jsonl"), &[]);
    assert_eq!(got.checked, 2);
    for (id, predicted, measured) in &got.searches {
        assert!(
            predicted <= &(measured + 1),
            "{id}: planned {predicted}, {measured} ran"
        );
    }
}

/// Session 28's pre-registered searches (`lab/grids/make_caps28.py`, drawn after that session's
/// allocation-order changes and before any was planned or measured; all untouched): eight
/// LoRA / QLoRA searches on small models under 12, 16 and 24 GiB caps, run on an H100 80GB
/// HBM3 (`lab/device/session28b.sh`, `grid26b/caps28_untouched.jsonl`), read once, as they
/// came out.
#[test]
fn caps28_untouched() {
    let got = plan_caps(&json_lines("grid26b/caps28_untouched.jsonl"), &[]);
    assert_eq!(got.checked, 8);
    let within_one = got
        .searches
        .iter()
        .filter(|(_, p, m)| p.abs_diff(*m) <= 1)
        .count();
    let above = got.searches.iter().filter(|(_, p, m)| p > m).count();
    println!("{within_one} of 8 within one; {above} planned above the largest batch that ran");
    // As it came out: all eight within one; c28-07 (GPT-2 LoRA r8 attn, bf16, trainer loop,
    // seq 512, 12 GiB) planned 20 where 19 ran in the search's process; c28-02, c28-04 and
    // c28-06 one below; the other four equal. Session 30 ran c28-07 at b20 alone in a fresh
    // process (`grid26b/caps_fresh30.jsonl`): it ran, so none is planned above what ran.
    assert_eq!(within_one, 8);
    assert_eq!(above, 0, "{above} searches planned above what ran");
}

/// c26-01 (Mistral-7B LoRA r64 attn, checkpointed, bf16, seq 1024) at b13 under its 24 GiB
/// cap, alone in a fresh process (session 30, H100 80GB HBM3; the allocator's history
/// `traces/h100-c26-01-b13-cap24-oom-snapshot.pickle.gz`, read with
/// `lab/cpu/snapshot_events.py`): the two warm-up steps ran, each only after the allocator
/// released its cached segments and retried, and the third (measured) step ran out of memory
/// at the gradient of the cross-entropy, a request of 1 744 830 464 bytes (the fp32 logits at
/// b13), its 2.28 GiB of free cached blocks split by the earlier steps' activations. The plan
/// runs out of memory at that same request, one step earlier (its second); b12 runs, also
/// through the steps after the measured one (`eval::later_steps`).
#[test]
fn c26_01_runs_out_of_memory_at_the_measured_request() {
    use vramlab_core::plan::allocator::CachingAllocator;
    use vramlab_core::plan::config::AllocatorConfig;
    use vramlab_core::plan::eval::reserved_within;
    let m = &rows("traces/h100-c26-01-b13-cap24-measure.jsonl")[0];
    assert!(
        m.oom == Some(true) && m.batch == 13,
        "the measured row is b13's out-of-memory"
    );
    let planner = Planner::new(&preset(&m.model), &m.config().expect("config")).expect("plan");
    let cap = Bytes(24 << 30);
    let ev = &planner.events;
    let mut a = CachingAllocator::with_cap(AllocatorConfig::default(), cap.0);
    let failed = crate::replay_events(ev, 13, &mut a);
    assert_eq!(
        failed,
        Some(1_744_830_464),
        "the request that ran out of memory"
    );
    assert!(a.flushes > 0, "after cache flushes");
    let within = |b| reserved_within(ev, b, AllocatorConfig::default(), cap).expect("replay");
    assert_eq!(within(13), None);
    assert!(within(12).is_some(), "b12 runs on");
    assert_eq!(
        max_batch_capped(&planner, cap, 64).expect("search"),
        Some(12)
    );
}
