//! `.vramlab.json` documents: parse, resolve the model and the GPU, plan.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use vramlab::export::VramlabConfig;
use vramlab::plan::gpus;

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = VramlabConfig::from_bytes(data) else {
        return;
    };
    // What was accepted is written back and read again identically.
    let back = VramlabConfig::from_bytes(doc.to_json().as_bytes()).expect("re-parses");
    assert_eq!(back.training, doc.training);
    let _ = gpus::find(&doc.gpu);
    if let Ok(preset) = doc.preset() {
        common::plan_small(&preset, &doc.training);
    }
});
