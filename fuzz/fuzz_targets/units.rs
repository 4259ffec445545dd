//! Number and name parsers of the CLI and the GUI: byte sizes with units, precision,
//! optimizer, attention, export format, GPU ids, and GPU catalog entries.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::units(data));
