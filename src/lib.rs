//! vramlab: predicts the peak GPU memory of a training step and checks it on the device.
//!
//! The core — [`model`], [`plan`] — is pure: no egui, no CUDA, no NVML.

pub mod app;
pub mod bench;
pub mod bench_cli;
pub mod cli;
pub mod doctor;
pub mod doctor_cli;
pub mod export;
pub mod gpu;
pub mod model;
pub mod plan;
pub mod plan_bench;
pub mod ui;
pub mod units;
pub mod validate;
