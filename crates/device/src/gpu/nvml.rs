//! NVML: the process's one handle ([`handle`]), device discovery, per-process and device
//! memory, the driver version. `Nvml::init()` loads `libnvidia-ml.so.1` at run time and
//! returns an error (never panics) when the driver is missing, so every function here
//! degrades to "no GPU". Nothing else in vramlab initialises NVML.

use std::sync::OnceLock;

use anyhow::{Context, Result};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use serde::{Deserialize, Serialize};

use vramlab_core::units::Bytes;

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

static NVML: OnceLock<Nvml> = OnceLock::new();

/// The process's NVML handle, initialised on first success (a failure is retried on the
/// next call, so a refresh after installing the driver works). `Nvml` is `Send + Sync`:
/// engines, the monitor's sampler thread and the GUI share this one handle.
pub fn handle() -> Result<&'static Nvml> {
    if let Some(nvml) = NVML.get() {
        return Ok(nvml);
    }
    let nvml = Nvml::init().context("initialising NVML (is the NVIDIA driver installed?)")?;
    Ok(NVML.get_or_init(|| nvml))
}

/// NVML's memory of process `pid` on device `index` (what nvidia-smi lists), where NVML
/// can tell: compute processes first, then graphics ones.
pub fn process_memory(index: u32, pid: u32) -> Option<Bytes> {
    let dev = handle().ok()?.device_by_index(index).ok()?;
    let lists = [
        dev.running_compute_processes(),
        dev.running_graphics_processes(),
    ];
    lists
        .into_iter()
        .flatten()
        .flatten()
        .find(|p| p.pid == pid)
        .and_then(|p| used_memory(p.used_gpu_memory))
}

/// A process's memory as NVML reports it (`None` where the driver does not say).
pub fn used_memory(used: UsedGpuMemory) -> Option<Bytes> {
    match used {
        UsedGpuMemory::Used(b) => Some(Bytes(b)),
        UsedGpuMemory::Unavailable => None,
    }
}

/// Memory used on device `index` by every process (NVML's `used`).
pub fn device_used(index: u32) -> Option<Bytes> {
    let dev = handle().ok()?.device_by_index(index).ok()?;
    dev.memory_info().ok().map(|m| Bytes(m.used))
}

/// The driver version ("580.159.04"), where NVML is present.
pub fn driver_version() -> Option<String> {
    handle().ok()?.sys_driver_version().ok()
}

/// Every GPU NVML can see; an error when NVML or the driver is unavailable.
pub fn detect_all() -> Result<Vec<DetectedGpu>> {
    let nvml = handle()?;
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

/// The first GPU, or `None` without a driver / NVML / device. Call it at start-up or on
/// an explicit refresh, not every frame: querying every device costs milliseconds.
pub fn detect() -> Option<DetectedGpu> {
    match detect_all() {
        Ok(gpus) => gpus.into_iter().next(),
        Err(_) => None,
    }
}
