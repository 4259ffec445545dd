//! Built-in presets with numbers overridden by the fuzzer (any u64, any float): the JSON
//! parser is bypassed so that every input is a parseable model with hostile sizes, and the
//! graph builder and planner see it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::hostile_preset(data));
