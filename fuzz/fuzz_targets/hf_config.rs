//! Hugging Face config.json import: parse, build, plan small; never a panic.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use vramlab::model::hf;
use vramlab::plan::{Precision, TrainConfig};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(preset) = hf::from_config_text(text, "fuzz") else {
        return;
    };
    for (size, precision, checkpointing) in [
        (Some(8), Precision::AmpBf16, false),
        (Some(16), Precision::Fp32, true),
    ] {
        let cfg = TrainConfig {
            batch: 2,
            size,
            precision,
            checkpointing,
            ..TrainConfig::default()
        };
        common::plan_small(&preset, &cfg);
    }
});
