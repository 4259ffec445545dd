//! A model folder's model.safetensors.index.json: shard names of the folder only; never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::safetensors_index(data));
