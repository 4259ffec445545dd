//! The app's background work and its sources, each replaceable in tests: GPU detection, the
//! bench run's spawner, the monitor's sampler, a screenshot asked for and a Hub id or model
//! folder being read.

use std::sync::Arc;
use std::sync::mpsc::Receiver;

use egui::{ColorImage, Rect};

use crate::ui::png::PlotId;
use vramlab_device::bench::{BenchHandle, BenchRequest};
use vramlab_device::gpu::DetectedGpu;
use vramlab_device::gpu::monitor::Monitor;
use vramlab_hub::Source;

/// GPU detection (NVML in the real app).
pub type Detector = Box<dyn FnMut() -> Option<DetectedGpu>>;
/// Starts a bench run (the real app: [`vramlab_device::bench::spawn`] on a worker thread).
pub type Spawner = Box<dyn FnMut(BenchRequest, Box<dyn Fn() + Send>) -> BenchHandle>;
/// Starts the monitor's sampler (the real app: NVML device 0).
pub type MonitorOpener = Box<dyn FnMut(Box<dyn Fn() + Send>) -> Monitor>;

/// A screenshot asked for, to crop to a plot.
pub(super) struct PendingShot {
    pub(super) id: PlotId,
    pub(super) rect: Rect,
    pub(super) pixels_per_point: f32,
    pub(super) rx: Receiver<Arc<ColorImage>>,
}

pub(super) fn default_spawner() -> Spawner {
    Box::new(vramlab_device::bench::spawn)
}

pub(super) fn default_monitor() -> MonitorOpener {
    Box::new(|notify| Monitor::start_nvml(0, notify))
}

/// A read under way.
pub(super) struct Loading {
    pub(super) name: String,
    pub(super) rx: Receiver<Result<Source, String>>,
}
