//! The binary's tests: the command line end to end, golden outputs, and (ignored unless a
//! GPU is present) the engines on a real device. One test binary, linked once.

mod architecture;
mod cli;
mod cli_infer;
mod cli_infer_export;
mod cli_outputs;
mod docs;
mod doctor;
mod gpu;
mod hf_import;
mod hub;
mod lab;
mod regressions;
