//! The OOM doctor's readers on hostile input: the safe pickle reader, the snapshot typing
//! and replay, and the OOM message parser must reject or read anything without panicking,
//! executing nothing and staying within their limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramlab::doctor::pickle::{Limits, read_pickle_bytes};
use vramlab::doctor::{Snapshot, analyze, diagnose, parse_message};

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_nodes: 1 << 20,
        max_string_bytes: 1 << 20,
        max_stack: 1 << 16,
        max_memo: 1 << 20,
    };
    if let Ok(p) = read_pickle_bytes(data, limits) {
        let _ = p.to_json(p.root, 8);
        if let Ok(s) = Snapshot::from_pickle(&p)
            && let Ok(r) = analyze(&s, None)
        {
            let _ = diagnose(None, Some(&r));
        }
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Some(m) = parse_message(text)
    {
        let _ = diagnose(Some(&m), None);
    }
});
