//! A model folder's safetensors header: bounded read, stored dtypes or an error; never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::safetensors_header(data));
