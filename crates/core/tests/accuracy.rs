//! The estimator against every measured row in tests/data (PyTorch on an H200).
//! Thresholds are the product's accuracy targets.

use vramlab_core::validate::{compare, max_abs, median_abs, parse_lines, summary};

fn rows(files: &[&str]) -> Vec<vramlab_core::validate::Row> {
    let mut measured = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(crate::data(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        measured.extend(parse_lines(&text));
    }
    compare(&measured).expect("every measured row plans")
}

fn check(files: &[&str]) {
    let rows = rows(files);
    assert!(rows.len() >= 25, "too few measured rows: {}", rows.len());
    println!("{}", summary(&rows));
    for r in &rows {
        println!(
            "{:<22} {:<44} alloc {:+6.1} %  reserved {:+6.1} %",
            r.model,
            r.config,
            r.allocated_error(),
            r.reserved_error()
        );
    }
    let alloc_median = median_abs(rows.iter().map(|r| r.allocated_error()));
    let alloc_worst = max_abs(rows.iter().map(|r| r.allocated_error()));
    let reserved_median = median_abs(rows.iter().map(|r| r.reserved_error()));
    assert!(alloc_median <= 3.0, "allocated median {alloc_median:.2} %");
    assert!(alloc_worst <= 10.0, "allocated worst {alloc_worst:.2} %");
    assert!(
        reserved_median <= 5.0,
        "reserved median {reserved_median:.2} %"
    );
}

#[test]
fn calibration_set_within_targets() {
    check(&["calibration.jsonl"]);
}

#[test]
fn holdout_set_within_targets() {
    check(&["holdout.jsonl"]);
}

/// Measured mid-session, after the first tuning round on the calibration set; later rule
/// changes were driven by calibration rows and this set was only reported.
#[test]
fn second_holdout_set_within_targets() {
    check(&["holdout2.jsonl"]);
}

/// Measured at the end of the session, after every rule change, and never tuned on.
#[test]
fn third_holdout_set_within_targets() {
    check(&["holdout3.jsonl"]);
}

/// Measured after the convolution-workspace rule was written from per-convolution
/// measurements (tools/conv_workspace.py), on an H100 (PyTorch 2.11, cuDNN 9.19); its
/// whole-model rows were never tuned on.
#[test]
fn fourth_holdout_set_within_targets() {
    check(&["holdout4.jsonl"]);
}

/// 44 configurations drawn at random (`tools/make_holdout5.py`, seed 5) and measured on the
/// H200 after session 5's rule changes (residual-add gradients, weight-gradient partials, stem
/// workspaces), before any of its rows was looked at.
#[test]
fn fifth_holdout_set_within_targets() {
    check(&["holdout5.jsonl"]);
}

const ALL: [&str; 6] = [
    "calibration.jsonl",
    "holdout.jsonl",
    "holdout2.jsonl",
    "holdout3.jsonl",
    "holdout4.jsonl",
    "holdout5.jsonl",
];

/// The targets hold per model family over every measured row, not only on average.
#[test]
fn every_family_within_targets() {
    let rows = rows(&ALL);
    let families: [(&str, &[&str]); 4] = [
        (
            "CNN",
            &["resnet", "efficientnet", "mobilenet_v3", "convnext"],
        ),
        ("ViT", &["vit"]),
        ("segmentation", &["deeplabv3", "fcn", "unet"]),
        ("language models", &["gpt2", "bert", "llama"]),
    ];
    for (name, members) in families {
        let fam: Vec<_> = rows
            .iter()
            .filter(|r| members.contains(&r.family.as_str()))
            .collect();
        assert!(fam.len() >= 20, "{name}: only {} rows", fam.len());
        let alloc_median = median_abs(fam.iter().map(|r| r.allocated_error()));
        let alloc_worst = max_abs(fam.iter().map(|r| r.allocated_error()));
        let reserved_median = median_abs(fam.iter().map(|r| r.reserved_error()));
        println!(
            "{name}: {} rows, allocated median {alloc_median:.2} % worst {alloc_worst:.2} %, reserved median {reserved_median:.2} %",
            fam.len()
        );
        assert!(
            alloc_median <= 3.0,
            "{name}: allocated median {alloc_median:.2} %"
        );
        assert!(
            alloc_worst <= 10.0,
            "{name}: allocated worst {alloc_worst:.2} %"
        );
        assert!(
            reserved_median <= 5.0,
            "{name}: reserved median {reserved_median:.2} %"
        );
    }
}
