//! Number and name parsers of the CLI and the GUI: byte sizes with units, precision,
//! optimizer, attention, export format, GPU ids, and GPU catalog entries.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramlab::export::Format;
use vramlab::plan::search::Budget;
use vramlab::plan::{Attention, Gpu, Optimizer, Precision, gpus};
use vramlab::units::Bytes;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(b) = Bytes::parse(text) {
        // Display and the round trip through the display form never panic.
        let shown = b.to_string();
        let _ = Bytes::parse(&shown.replace(' ', ""));
        let _ = b.as_gib_f64();
    }
    let _ = text.parse::<Precision>();
    let _ = text.parse::<Optimizer>();
    let _ = text.parse::<Attention>();
    let _ = Format::parse(text);
    let _ = gpus::find(text);
    let _ = text.parse::<u64>();
    if let Ok(gpu) = serde_json::from_str::<Gpu>(text) {
        for margin in [0.0, 0.05, 0.999, f64::NAN, -1.0] {
            let budget = Budget {
                capacity: gpu.memory(),
                margin,
            };
            let _ = budget.allocator_cap(Bytes::mib(782));
        }
    }
});
