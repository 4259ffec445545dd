//! A captured graph file (`*.vramlab-graph.json`): parse, fit, plan; never a panic.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::captured_graph(data));
