//! The engine seam: what every benchmark engine implements ([`Engine`]), the one trial it
//! is asked to run ([`TrialJob`]) and what it may do meanwhile ([`Control`]: Cancel,
//! progress, memory samples). The runner drives engines through this trait only.

use std::sync::atomic::{AtomicBool, Ordering};

use vramlab_core::model::Preset;
use vramlab_core::plan::Planner;
use vramlab_core::record::{BenchEvent, DeviceInfo, MemSample, Outcome, Trial};

/// What an engine may do while a trial runs: check for Cancel, report progress and
/// memory samples.
pub struct Control<'a> {
    cancel: &'a AtomicBool,
    emit: &'a mut dyn FnMut(BenchEvent),
}

impl<'a> Control<'a> {
    pub fn new(cancel: &'a AtomicBool, emit: &'a mut dyn FnMut(BenchEvent)) -> Control<'a> {
        Control { cancel, emit }
    }

    /// Whether the user pressed Cancel (engines check this between ops).
    pub fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    pub fn progress(&mut self, trial: u32, batch: u64, phase: &str, fraction: f32) {
        (self.emit)(BenchEvent::Progress {
            trial,
            batch,
            phase: phase.to_string(),
            fraction: fraction.clamp(0.0, 1.0),
        });
    }

    pub fn sample(&mut self, trial: u32, sample: MemSample) {
        (self.emit)(BenchEvent::Sample { trial, sample });
    }
}

/// A benchmark engine: runs one trial (one batch size) at a time on its device.
pub trait Engine {
    /// The device this engine runs on.
    fn device(&self) -> DeviceInfo;

    /// Runs `job.steps` timed training steps of the job's configuration at `job.batch`.
    /// OOM and errors are outcomes, never panics; the trial's memory is released before
    /// it returns.
    fn trial(&mut self, job: &TrialJob<'_>, ctl: &mut Control<'_>) -> Trial;
}

/// One trial to run.
pub struct TrialJob<'a> {
    pub preset: &'a Preset,
    pub planner: &'a Planner,
    pub index: u32,
    pub batch: u64,
    pub steps: u32,
}

/// A trial result for an engine that stopped because of Cancel.
pub fn cancelled_trial(index: u32, batch: u64) -> Trial {
    Trial::failed(index, batch, Outcome::Cancelled)
}
