//! The memory-versus-batch curve, computed on a worker thread: a curve evaluates the plan at
//! a few dozen batches (~10–20 ms for an 8 B model), and it is asked anew whenever its range
//! changes (the batch slider passing a power of two). The frame that asks shows the previous
//! curve of the same planner until the new one arrives, so dragging never waits for it
//! (`frame_time_during_a_search` measured those frames at 22–28 ms before). Tests compute it
//! on the calling thread so that what they draw is deterministic.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError, channel};

use vramlab_core::plan::Planner;
use vramlab_core::plan::search::{SweepPoint, sweep};

/// Which curve: the planner's generation and the top batch.
pub type SweepKey = (u64, u64);

/// The curve shown and the one being computed.
#[derive(Default)]
pub struct SweepJob {
    done: Option<(SweepKey, Vec<SweepPoint>)>,
    pending: Option<(SweepKey, Receiver<Vec<SweepPoint>>)>,
    /// Compute on the calling thread (tests, screenshots).
    pub blocking: bool,
    /// Called when a background curve is ready (asks the UI for a frame).
    pub on_done: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl SweepJob {
    /// Asks for the curve `key` of `planner` at `batches`: computed now when blocking, else
    /// started on a worker unless it is the one shown or running (a curve asked meanwhile
    /// replaces the running one, whose result is then dropped).
    pub fn ensure(&mut self, key: SweepKey, planner: &Planner, batches: Vec<u64>) {
        self.poll();
        if self.done.as_ref().is_some_and(|(k, _)| *k == key)
            || self.pending.as_ref().is_some_and(|(k, _)| *k == key)
        {
            return;
        }
        if self.blocking {
            self.done = Some((key, sweep(planner, batches)));
            return;
        }
        let planner = planner.clone();
        let (tx, rx) = channel();
        let on_done = self.on_done.clone();
        std::thread::spawn(move || {
            // The receiver is gone when a newer curve was asked for or the app closed.
            if tx.send(sweep(&planner, batches)).is_ok()
                && let Some(d) = on_done
            {
                d();
            }
        });
        self.pending = Some((key, rx));
    }

    fn poll(&mut self) {
        let Some((_, rx)) = &self.pending else {
            return;
        };
        match rx.try_recv() {
            Ok(points) => {
                if let Some((key, _)) = self.pending.take() {
                    self.done = Some((key, points));
                }
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => self.pending = None,
        }
    }

    /// The newest finished curve of planner generation `generation` (empty while the first
    /// one of a new planner is computed).
    pub fn points(&self, generation: u64) -> &[SweepPoint] {
        match &self.done {
            Some(((g, _), points)) if *g == generation => points,
            _ => &[],
        }
    }
}
