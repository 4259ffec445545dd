//! Preset documents (custom model files): parse, build the graph at a few sizes, plan.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::preset_json(data));
