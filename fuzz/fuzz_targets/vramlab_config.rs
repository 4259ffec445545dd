//! `.vramlab.json` documents: parse, resolve the model and the GPU, plan.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::vramlab_config(data));
