//! NVML device discovery. `Nvml::init()` loads `libnvidia-ml.so.1` at run time and
//! returns an error (never panics) when the driver is missing, so every function here
//! degrades to "no GPU".

use anyhow::{Context, Result};
use nvml_wrapper::Nvml;
use serde::{Deserialize, Serialize};

use crate::units::Bytes;

/// One NVIDIA GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DetectedGpu {
    /// Device index in NVML order.
    pub index: u32,
    /// Marketing name, e.g. "NVIDIA H200".
    pub name: String,
    /// Total device memory.
    pub total: Bytes,
    /// Device memory not used by any process when queried.
    pub free: Bytes,
}

impl DetectedGpu {
    /// Device memory used by all processes (total − free).
    pub fn used(&self) -> Bytes {
        self.total.saturating_sub(self.free)
    }
}

/// Every GPU NVML can see; an error when NVML or the driver is unavailable.
pub fn detect_all() -> Result<Vec<DetectedGpu>> {
    let nvml = Nvml::init().context("initialising NVML (is the NVIDIA driver installed?)")?;
    let count = nvml.device_count().context("counting NVML devices")?;
    let mut out = Vec::new();
    for index in 0..count {
        let device = nvml
            .device_by_index(index)
            .with_context(|| format!("opening NVML device {index}"))?;
        let name = device
            .name()
            .with_context(|| format!("reading the name of device {index}"))?;
        let mem = device
            .memory_info()
            .with_context(|| format!("reading the memory of device {index}"))?;
        out.push(DetectedGpu {
            index,
            name,
            total: Bytes(mem.total),
            free: Bytes(mem.free),
        });
    }
    Ok(out)
}

/// The first GPU, or `None` without a driver / NVML / device. Call it once at
/// start-up (or on an explicit refresh), not every frame: NVML init costs milliseconds.
pub fn detect() -> Option<DetectedGpu> {
    match detect_all() {
        Ok(gpus) => gpus.into_iter().next(),
        Err(_) => None,
    }
}
