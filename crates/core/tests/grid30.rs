//! Issue 30's pre-registered grids: training steps of olmo2, granite, starcoder2, smollm3 and
//! falcon (`lab/grids/make_grid30.py`, measured by `lab/run grid30`) and of bart,
//! modernbert, deberta-v2, deepseek_v3 and gpt_oss (`lab/grids/make_grid30_{bart,encoder,moe}.py`,
//! measured by `lab/run grid30_new`), imported from config.json and drawn at random
//! over loop shape, precision, checkpointing, attention, batch and sequence. The untouched
//! thirds (`tests/data/grid30/*_untouched.jsonl`) were read once, at the end
//! (`grid30_untouched_thirds`), and fed no fix.

use std::collections::BTreeMap;

use crate::grid26::rows;
use vramlab_core::validate::{Row, compare, max_abs, median_abs, summary};

/// The model type of a layer-cut config's file name (`falcon-40b-L1.json` → `falcon`,
/// `Moonlight-16B-A3B-L2.json` → `deepseek_v3`).
fn model_type(model: &str) -> &'static str {
    let file = model.rsplit('/').next().unwrap_or("").to_ascii_lowercase();
    [
        ("olmo", "olmo2"),
        ("granite", "granite"),
        ("starcoder2", "starcoder2"),
        ("smollm3", "smollm3"),
        ("falcon", "falcon"),
        ("bart", "bart"),
        ("modernbert", "modernbert"),
        ("deberta", "deberta-v2"),
        ("deepseek-v3", "deepseek_v3"),
        ("moonlight", "deepseek_v3"),
        ("gpt-oss", "gpt_oss"),
    ]
    .into_iter()
    .find(|(prefix, _)| file.starts_with(prefix))
    .map_or("other", |(_, t)| t)
}

/// Allocated median and worst, reserved median and worst |error| (%) per model type, printed
/// with every row.
fn per_type(got: &[Row]) -> BTreeMap<&'static str, (usize, f64, f64, f64, f64)> {
    for r in got {
        println!(
            "{:<34} {:<90} alloc {:+6.2} %  reserved {:+6.2} %",
            r.model.rsplit('/').next().unwrap_or(""),
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    println!("{}", summary(got));
    let mut by: BTreeMap<&'static str, Vec<&Row>> = BTreeMap::new();
    for r in got {
        by.entry(model_type(&r.model)).or_default().push(r);
    }
    by.into_iter()
        .map(|(t, rs)| {
            let a = || rs.iter().map(|r| r.allocated_error());
            let res = || rs.iter().map(|r| r.reserved_error());
            let s = (rs.len(), median_abs(a()), max_abs(a()), median_abs(res()), max_abs(res()));
            println!(
                "{t:<12} {:>2} rows  allocated median {:.2} % worst {:.2} %  reserved median {:.2} % worst {:.2} %",
                s.0, s.1, s.2, s.3, s.4
            );
            (t, s)
        })
        .collect()
}

/// The fit two-thirds: every row plans, and each type is within issue 30's targets
/// (allocated median ≤ 2 %, worst ≤ 8 %; reserved median ≤ 4 %).
#[test]
fn grid30_fit_rows_are_within_issue_30s_targets() {
    let got = compare(&rows("grid30/grid30_fit.jsonl")).expect("every usable row plans");
    assert_eq!(got.len(), 40, "rows planned");
    for (t, (n, am, aw, rm, _)) in per_type(&got) {
        assert!(n >= 6, "{t}: {n} rows");
        assert!(am <= 2.0 && aw <= 8.0, "{t}: allocated {am:.2} / {aw:.2}");
        assert!(rm <= 4.0, "{t}: reserved median {rm:.2}");
    }
}

/// The later five types' fit two-thirds (`lab/run grid30_new`: bart, modernbert,
/// deberta-v2, deepseek_v3, gpt_oss), measured on an H100 in session 17.
#[test]
fn grid30_new_fit_rows_are_within_issue_30s_targets() {
    let got = compare(&rows("grid30/grid30_new_fit.jsonl")).expect("every usable row plans");
    assert_eq!(got.len(), 40, "rows planned");
    for (t, (n, am, aw, rm, _)) in per_type(&got) {
        assert!(n >= 6, "{t}: {n} rows");
        assert!(am <= 2.0 && aw <= 8.0, "{t}: allocated {am:.2} / {aw:.2}");
        assert!(rm <= 4.0, "{t}: reserved median {rm:.2}");
    }
}

/// The untouched thirds of both grids, read once at the end of session 17 after the fixes
/// (CUDA's softmax-backward temporary, the math-path SDPA's dropout): every row plans, and
/// the misses are printed as they came out then (docs/modelled.md quotes them: allocated
/// median <= 0.23 %, worst <= 3.23 % per type; reserved median <= 4.53 % (deberta-v2)).
#[test]
fn grid30_untouched_thirds() {
    for file in [
        "grid30/grid30_untouched.jsonl",
        "grid30/grid30_new_untouched.jsonl",
    ] {
        let got = compare(&rows(file)).expect("every usable row plans");
        assert_eq!(got.len(), 20, "{file}: rows planned");
        for (t, (n, am, aw, rm, rw)) in per_type(&got) {
            println!("{file} {t}: {n} rows {am:.2} {aw:.2} {rm:.2} {rw:.2}");
        }
    }
}
