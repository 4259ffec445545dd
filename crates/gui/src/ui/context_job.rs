//! The longest prompt at the inference call's batch (`vramlab_core::answer::max_context`, as
//! `vramlab max-context` answers it), computed on a worker thread: the search plans whole
//! calls at a few dozen lengths (about a second for a 1 B model in a release build), so the
//! frame that asks shows "searching…" until it arrives. Tests compute it on the calling
//! thread so that what they draw is deterministic.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError, channel};

use vramlab_core::answer::max_context::MaxContext;
use vramlab_core::plan::search::Budget;

/// Which answer: the inference planner's generation, the batch and the GPU's budget.
pub type ContextKey = (u64, u64, Budget);

type Answer = Result<MaxContext, String>;

/// The answer shown and the one being computed.
#[derive(Default)]
pub struct ContextJob {
    done: Option<(ContextKey, Answer)>,
    pending: Option<(ContextKey, Receiver<Answer>)>,
    /// Compute on the calling thread (tests, screenshots).
    pub blocking: bool,
    /// Called when a background answer is ready (asks the UI for a frame).
    pub on_done: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl ContextJob {
    /// Asks for the answer `key`, computed by `work`: now when blocking, else on a worker
    /// unless it is the one shown or running (one asked meanwhile replaces the running one,
    /// whose result is then dropped).
    pub fn ensure(&mut self, key: ContextKey, work: impl FnOnce() -> Answer + Send + 'static) {
        self.poll();
        if self.done.as_ref().is_some_and(|(k, _)| *k == key)
            || self.pending.as_ref().is_some_and(|(k, _)| *k == key)
        {
            return;
        }
        if self.blocking {
            self.done = Some((key, work()));
            return;
        }
        let (tx, rx) = channel();
        let on_done = self.on_done.clone();
        std::thread::spawn(move || {
            // The receiver is gone when a newer answer was asked for or the app closed.
            if tx.send(work()).is_ok()
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
            Ok(answer) => {
                if let Some((key, _)) = self.pending.take() {
                    self.done = Some((key, answer));
                }
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => self.pending = None,
        }
    }

    /// The answer for `key` once computed (`None` while it is searched; [`Self::ensure`],
    /// called every frame, collects a finished one).
    pub fn answer(&self, key: ContextKey) -> Option<&Answer> {
        match &self.done {
            Some((k, a)) if *k == key => Some(a),
            _ => None,
        }
    }
}
