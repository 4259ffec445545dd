//! Preset documents (custom model files): parse, build the graph at a few sizes, plan.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use vramlab::model::Preset;
use vramlab::model::families::transformer::AttnImpl;
use vramlab::plan::{Attention, Precision, TrainConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(preset) = Preset::from_json(text) else {
        return;
    };
    // The document must survive a round trip.
    let back = Preset::from_json(&preset.to_json()).expect("a parsed preset re-parses");
    assert_eq!(back, preset);
    let size = preset.default_size();
    for s in [1, size.min(64), size] {
        let _ = preset.build(s, AttnImpl::Eager);
    }
    // Plan at the default size and at a small one, in two precisions.
    for (size, precision, checkpointing) in [
        (None, Precision::AmpBf16, false),
        (Some(size.min(32)), Precision::Fp32, true),
    ] {
        let cfg = TrainConfig {
            batch: 2,
            size,
            precision,
            checkpointing,
            attention: Attention::Eager,
            ..TrainConfig::default()
        };
        common::plan_small(&preset, &cfg);
    }
});
