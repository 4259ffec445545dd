//! The core's tests: accuracy against measured runs, invariants, parsers, presets.
//! One test binary, linked once, without any GUI or GPU crate.

mod accuracy;
mod accuracy_tables;
mod bench_data;
mod callbacks_recorded;
mod captured;
mod device_map;
mod distributed;
mod distributed_deepspeed;
mod distributed_knobs;
mod error_bands;
mod exports;
mod grid26;
mod grid26b;
mod grid30;
mod grid31;
mod infer_moe;
mod infer_quant;
mod infer_quant_device_map;
mod inference;
mod invariants;
mod max_context;
mod maxbatch;
mod moe;
mod parser_props;
mod presets;
mod snapshot_golden;
mod t5_sdpa;
mod types30;
mod types30_bart;
mod types30_encoder;
mod types30_moe;
mod vllm;

/// A file under the repository's `tests/data/`.
pub fn data(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(rel)
}
mod sampling;
