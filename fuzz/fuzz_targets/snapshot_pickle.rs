//! The OOM doctor's readers on hostile input: the safe pickle reader, the snapshot typing
//! and replay, and the OOM message parser must reject or read anything without panicking,
//! executing nothing and staying within their limits.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::snapshot_pickle(data));
