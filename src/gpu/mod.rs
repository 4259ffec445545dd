//! Real GPUs: NVML device discovery. This is an edge module (it links NVML at run
//! time); the core (`model`, `plan`) never depends on it.

pub mod nvml;

pub use nvml::{DetectedGpu, detect, detect_all};
