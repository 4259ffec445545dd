//! The memory-versus-batch curve, computed on a worker thread: a curve evaluates the plan at
//! a few dozen batches (~10–20 ms for an 8 B model), and it is asked anew whenever its range
//! changes (the batch slider passing a power of two). The frame that asks shows the previous
//! curve of the same planner until the new one arrives, so dragging never waits for it
//! (`frame_time_during_a_search` measured those frames at 22–28 ms before). Tests compute it
//! on the calling thread so that what they draw is deterministic.

use vramlab_core::plan::Planner;
use vramlab_core::plan::search::{SweepPoint, sweep};

use super::background_job::BackgroundJob;

/// Which curve: the planner's generation and the top batch.
pub type SweepKey = (u64, u64);

/// The curve shown and the one being computed.
pub type SweepJob = BackgroundJob<SweepKey, Vec<SweepPoint>>;

impl SweepJob {
    /// Asks for the curve `key` of `planner` at `batches`: computed now when blocking, else
    /// started on a worker unless it is the one shown, running or waiting (a curve asked while
    /// another is computed waits for it; the newest such request replaces an older one).
    pub fn ensure(&mut self, key: SweepKey, planner: &Planner, batches: Vec<u64>) {
        if self.wants(&key) {
            let planner = planner.clone();
            self.start(key, move || sweep(&planner, batches));
        }
    }

    /// The newest finished curve of planner generation `generation` (empty while the first
    /// one of a new planner is computed).
    pub fn points(&self, generation: u64) -> &[SweepPoint] {
        match self.done() {
            Some(((g, _), points)) if *g == generation => points,
            _ => &[],
        }
    }
}
