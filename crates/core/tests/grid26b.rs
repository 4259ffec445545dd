//! Issue 26's second pre-registered grid (`lab/grids/make_grid26b.py`, measured on an H200 by
//! `lab/run grid26b`, session 12): 30 multi-GPU ranks (FSDP2, DDP, PyTorch ZeRO-1,
//! DeepSpeed ZeRO-1/2/3; rank 0 of a world of N under the fake process group, DDP at world 1
//! under NCCL) and 12 models captured on a CPU-only machine (`vramlab capture` defaults,
//! torch 2.11.0 from the package registry) and measured on the GPU host. A random third of
//! each was set aside before anything ran (`*_untouched.jsonl`, not in the error bands) and
//! read once, after the fixes (`grid26b_untouched_third`).

use vramlab_core::model::preset::Preset;
use vramlab_core::plan::Planner;

use crate::captured::own_config;
use vramlab_core::validate::{Measured, Row, compare, max_abs, median_abs, parse_lines, summary};

fn root(rel: &str) -> String {
    format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// Rows with model and graph paths made absolute (the runners wrote them relative to the
/// repository root).
fn rows(file: &str) -> Vec<Measured> {
    let text = std::fs::read_to_string(crate::data(file)).expect("grid file");
    parse_lines(&text)
        .into_iter()
        .map(|mut m| {
            if m.model.ends_with(".json") {
                m.model = root(&m.model);
            }
            if let Some(g) = m.graph.as_mut()
                && g.contains('/')
            {
                *g = root(g);
            }
            m
        })
        .collect()
}

/// Prints every row, the summary and one summary per `key` found in the row's description;
/// returns allocated median and worst, reserved median and worst |error| (%).
fn report(got: &[Row], keys: &[&str]) -> (f64, f64, f64, f64) {
    for r in got {
        println!(
            "{:<40} {:<90} alloc {:+6.2} %  reserved {:+6.2} %",
            r.model.rsplit('/').next().unwrap_or(""),
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    for key in keys {
        let m: Vec<Row> = got
            .iter()
            .filter(|r| r.config.contains(key))
            .cloned()
            .collect();
        if !m.is_empty() {
            println!("{key}: {}", summary(&m));
        }
    }
    println!("all: {}", summary(got));
    let a = || got.iter().map(Row::allocated_error);
    let res = || got.iter().map(Row::reserved_error);
    (
        median_abs(a()),
        max_abs(a()),
        median_abs(res()),
        max_abs(res()),
    )
}

const STRATEGIES: [&str; 6] = [
    "fsdp2",
    "ddp×",
    "torch-zero1",
    " zero1×",
    " zero2×",
    " zero3×",
];

/// The fit two-thirds of the ranks, bounded where they stand after this session's fixes
/// (DeepSpeed ZeRO-3 keeps an fp32 master copy of an fp32 model too; FSDP2 keeps each
/// unit's all-gather result in forward until the next unit's copy-out): allocated 0.33 →
/// 0.11 % median, worst 5.7 % (Gemma-2 over: its logits soft-capping); reserved median
/// 4.5 %, worst −18.6 % (DeepSpeed ZeRO-2 at world 8) — issue 26's reserved targets
/// (3 / 10 %) are not met for ranks.
#[test]
fn grid26b_rank_fit_rows_are_planned_within_todays_bounds() {
    let got = compare(&rows("grid26b_ranks.jsonl")).expect("every rank plans");
    let (am, aw, rm, rw) = report(&got, &STRATEGIES);
    assert_eq!(got.len(), 20, "the fit two-thirds");
    assert!(am <= 0.3 && aw <= 6.0, "allocated {am:.2} / {aw:.2}");
    assert!(rm <= 5.0 && rw <= 19.0, "reserved {rm:.2} / {rw:.2}");
}

/// Models captured on the CPU-only machine, planned from that graph, against the step
/// measured on the H200 (issue 26's targets for captures hold on the fit rows).
#[test]
fn grid26b_cpu_captured_fit_rows_meet_the_targets() {
    let got = compare(&rows("grid26b_captured.jsonl")).expect("every captured row plans");
    let (am, aw, rm, rw) = report(&got, &[]);
    assert!(got.len() >= 12, "{} rows", got.len());
    assert!(am <= 1.5 && aw <= 6.0, "allocated {am:.2} / {aw:.2}");
    assert!(rm <= 3.0 && rw <= 10.0, "reserved {rm:.2} / {rw:.2}");
}

fn graph(path: &str) -> Preset {
    let text = std::fs::read_to_string(path).expect("graph");
    Preset::from_captured(path, &text).expect("graph parses")
}

/// The same model captured on the CPU-only machine (`runners/cuda_autocast.py`,
/// `runners/cuda_composites.py`) and on the H200 host plans alike: within 1 % at batches 1 to 64,
/// the TinyViT whose learned attention biases sent the CPU's SDPA to its math path (+13 %
/// before `cuda_sdpa`) included.
#[test]
fn grid26b_cpu_and_gpu_host_captures_plan_alike() {
    let dir = root("tests/data/grid26b/captured_gpu");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("captured_gpu")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 9, "{names:?}");
    let mut worst = 0f64;
    for name in &names {
        let cpu = graph(&root(&format!("tests/data/grid26b/captured_cpu/{name}")));
        let gpu = graph(&format!("{dir}/{name}"));
        for batch in [1u64, 8, 32, 64] {
            let pc = Planner::new(&cpu, &own_config(&cpu, batch))
                .expect("plan")
                .peaks(batch)
                .expect("peaks");
            let pg = Planner::new(&gpu, &own_config(&gpu, batch))
                .expect("plan")
                .peaks(batch)
                .expect("peaks");
            let err = |a: u64, b: u64| (a as f64 - b as f64) / b as f64 * 100.0;
            let (ea, er) = (
                err(pc.allocated.0, pg.allocated.0),
                err(pc.reserved.0, pg.reserved.0),
            );
            println!("{name} b{batch}: allocated {ea:+.3} %, reserved {er:+.3} %");
            worst = worst.max(ea.abs());
            // MobileNetV3 at batch 1: one 2 MiB segment (reserved −1.08 %): the capture's
            // fp32 shape probe runs cuDNN's batch norm on CUDA (allocation order output,
            // reserve) and the native one on the CPU; the training step itself is identical.
            // nfnet_l0 (x26b-05): the CPU capture of session 13 was made with timm 1.0.31,
            // whose NFNet runs its last stem activation and `final_act` out of place
            // (`act_layer(inplace=False)`, "a feature tap"); the GPU host's timm 1.0.29 runs
            // them in place (`inplace=cfg.num_features > 0`) — two different models, reserved
            // +14.9 % apart at batch 32. Captured again on the CPU with timm 1.0.29 (session
            // 18), the two plan alike; captures now record their model library's version.
            if !(name.starts_with("x26b-06") && batch == 1) {
                worst = worst.max(er.abs());
            } else {
                assert!(er.abs() <= 1.1, "{name} b1 reserved {er:+.3} %");
            }
        }
    }
    assert!(worst <= 1.0, "worst {worst:.3} %");
}

/// The untouched third of both sets, as it came out: drawn with the grid, measured in the
/// same device calls, read first after the fixes above (session 12). Its numbers are quoted
/// in docs/accuracy.md; this test keeps them from getting worse.
#[test]
fn grid26b_untouched_third() {
    let ranks = compare(&rows("grid26b_ranks_untouched.jsonl")).expect("every rank plans");
    println!("— ranks");
    let r = report(&ranks, &STRATEGIES);
    let captured = compare(&rows("grid26b_captured_untouched.jsonl")).expect("every row plans");
    println!("— captured on the CPU");
    let c = report(&captured, &[]);
    let above = |got: &[Row]| -> Vec<String> {
        got.iter()
            .filter(|r| {
                let band = vramlab_core::plan::band::ErrorBand::of(r.mode.as_ref().expect("mode"));
                r.measured_reserved
                    > band
                        .reserved
                        .upper(vramlab_core::units::Bytes(r.predicted_reserved))
                        .0
            })
            .map(|r| r.config.clone())
            .collect()
    };
    let (ar, ac) = (above(&ranks), above(&captured));
    println!(
        "measured above the upper edge of their reserved band: ranks {} of {} {ar:?}; captured {} of {} {ac:?}",
        ar.len(),
        ranks.len(),
        ac.len(),
        captured.len()
    );
    // As it came out — ranks (10): allocated 0.04 / 1.76 %, reserved 1.31 / 5.46 % (FSDP2, 3
    // rows: 0.13 / 1.76 / 2.14 / 5.46 %); captured on the CPU (6 rows, 3 models; nfnet_l0
    // was not measured): allocated 0.13 / 0.56 %, reserved 1.16 / 10.0 % (DLA-34 at batch 8).
    // One of ten ranks (FSDP2 ×8 with a bf16 MixedPrecisionPolicy) and one of six captured
    // rows (DLA-34 b8) measured above the upper edge of their reserved band.
    // Session 13 measured nfnet_l0 (amp-bf16, checkpointed; captured on the CPU in session
    // 12), as it came out: allocated −1.20 % at b8, −4.72 % at b16 (planned under), reserved
    // +0.49 / +1.12 %; the eight rows together: allocated 0.35 / 4.72 %, reserved 1.04 / 10.0 %.
    assert_eq!((ranks.len(), captured.len()), (10, 8));
    assert!(
        r.0 <= 0.1 && r.1 <= 2.0,
        "ranks allocated {:.2} / {:.2}",
        r.0,
        r.1
    );
    assert!(
        r.2 <= 1.5 && r.3 <= 5.5,
        "ranks reserved {:.2} / {:.2}",
        r.2,
        r.3
    );
    assert!(
        c.0 <= 0.4 && c.1 <= 4.8,
        "captured allocated {:.2} / {:.2}",
        c.0,
        c.1
    );
    assert!(
        c.2 <= 1.1 && c.3 <= 10.0,
        "captured reserved {:.2} / {:.2}",
        c.2,
        c.3
    );
    // Since session 33's bounds for the next row (`band::RISK`): no rank above its edge
    // (the FSDP2 ×8 rank's mode has 3 rows and takes `*/full/fsdp2`'s bound), DLA-34 b8 still.
    assert!(ar.is_empty() && ac.len() <= 1, "{ar:?} {ac:?}");
}
