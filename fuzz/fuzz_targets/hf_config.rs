//! Hugging Face config.json import: parse, build, plan small; never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::hf_config(data));
