//! Command lines: clap parsing of every subcommand, then `plan` and `max-batch` for real
//! (built-in models only: file paths would make the fuzzer read or write files).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vramlab_fuzz_harness::cli_args(data));
