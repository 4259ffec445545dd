//! The `vramlab` command line over the core (plan, max-batch, export, validate) and, with
//! the default `app` feature, the GPU commands (bench, gpus, profile) and the GUI.

pub mod cli;
pub mod heap;
