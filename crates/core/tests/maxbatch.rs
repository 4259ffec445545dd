//! Predicted largest batch against the largest batch that really ran under a memory cap
//! (`crates/device/runners/torch_runner.py max-batch --cap-gib 24` on an H200, tests/data/maxbatch.jsonl).
//! The planned max batch is judged at the upper edge of the mode's measured reserved band,
//! as `max-batch` plans it: it must never exceed the largest batch that ran.

use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::search::max_batch_capped;
use vramlab_core::plan::{Planner, TrainConfig};
use vramlab_core::units::Bytes;

#[test]
fn predicted_max_batch_matches_measured_under_a_cap() {
    let text = std::fs::read_to_string(crate::data("maxbatch.jsonl")).expect("maxbatch.jsonl");
    let mut checked = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        let Some(measured) = v["max_batch"].as_u64() else {
            continue;
        };
        let c = &v["config"];
        let preset = find_builtin(c["model"].as_str().expect("model")).expect("preset");
        let cfg = TrainConfig {
            batch: 1,
            size: c["image"].as_u64().or(c["seq"].as_u64()),
            precision: vramlab_words::parse(c["precision"].as_str().expect("precision"))
                .expect("p"),
            optimizer: vramlab_words::parse(c["optimizer"].as_str().expect("optimizer"))
                .expect("o"),
            accum: c["accum"].as_u64().unwrap_or(1),
            checkpointing: c["checkpointing"].as_bool().unwrap_or(false),
            attention: vramlab_words::parse(c["attention"].as_str().unwrap_or("sdpa")).expect("a"),
            ..TrainConfig::default()
        };
        let cap = Bytes((v["cap_gib"].as_f64().expect("cap") * (1u64 << 30) as f64) as u64);
        let planner = Planner::new(&preset, &cfg).expect("planner");
        let estimator = max_batch_capped(&planner, cap, 8192)
            .expect("search")
            .unwrap_or(0);
        let band = planner.band();
        let predicted = max_batch_capped(&planner, band.reserved.cap_for_upper(cap), 8192)
            .expect("search")
            .unwrap_or(0);
        println!(
            "{}: measured {measured}, planned {predicted} at the band's upper edge ({}), {estimator} by the estimator alone",
            preset.id,
            band.describe()
        );
        // Never above what ran; the estimator alone within 10 % (at most one sample off for
        // tiny batches), and the band costs at most its own width.
        assert!(
            predicted <= measured,
            "{}: planned {predicted}, only {measured} ran",
            preset.id
        );
        let tol = (measured as f64 * 0.10).max(1.0);
        assert!(
            (estimator as f64 - measured as f64).abs() <= tol,
            "{}: estimator {estimator}, measured {measured}",
            preset.id
        );
        let floor = measured as f64 / band.reserved.upper_factor() * 0.9 - 1.0;
        assert!(
            predicted as f64 >= floor,
            "{}: planned {predicted}, measured {measured}: more than the band's width below",
            preset.id
        );
        checked += 1;
    }
    assert!(checked >= 3);
}
