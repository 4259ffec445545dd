//! The core's tests: accuracy against measured runs, invariants, parsers, presets.
//! One test binary, linked once, without any GUI or GPU crate.

mod accuracy;
mod accuracy_tables;
mod allocator_history;
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

/// The events' own steps (model creation, the warm-up step, the measured one) through `a` at
/// `batch`, without the steps after them (`eval::later_steps`); the request that ran out of
/// memory, if one did.
pub fn replay_events(
    ev: &vramlab_core::plan::events::Events,
    batch: u64,
    a: &mut vramlab_core::plan::allocator::CachingAllocator,
) -> Option<u64> {
    let mut h = vec![u32::MAX; ev.buffers.len()];
    for e in &ev.events {
        let b = &ev.buffers[e.buffer as usize];
        let size = b.per_sample * batch + b.fixed;
        if e.alloc {
            h[e.buffer as usize] = a.malloc(size);
            if a.oom {
                return Some(size);
            }
        } else {
            a.free(h[e.buffer as usize]);
        }
    }
    None
}
