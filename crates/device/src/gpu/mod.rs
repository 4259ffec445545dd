//! Real GPUs: NVML device discovery and the live monitor (a sampler thread). This is an edge module (it links NVML at run
//! time); the core (`model`, `plan`) never depends on it.

pub mod monitor;
pub mod nvml;

pub use nvml::{DetectedGpu, detect, detect_all};
