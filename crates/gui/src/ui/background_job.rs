//! A result computed on a worker thread, keyed by what it was asked for: the frame that asks
//! shows the previous result (or nothing) until the new one arrives, so the UI never waits
//! for it. A result asked meanwhile replaces the running one, whose answer is then dropped.
//! Tests set `blocking` and compute on the calling thread, so what they draw is
//! deterministic. Used for the memory-versus-batch curve ([`super::sweep_job`]) and the
//! longest prompt of an inference call ([`super::inference`]).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError, channel};

/// The result shown and the one being computed.
pub struct BackgroundJob<K, T> {
    done: Option<(K, T)>,
    pending: Option<(K, Receiver<T>)>,
    /// Compute on the calling thread (tests, screenshots).
    pub blocking: bool,
    /// Called when a background result is ready (asks the UI for a frame).
    pub on_done: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl<K, T> Default for BackgroundJob<K, T> {
    fn default() -> Self {
        BackgroundJob {
            done: None,
            pending: None,
            blocking: false,
            on_done: None,
        }
    }
}

impl<K: PartialEq, T: Send + 'static> BackgroundJob<K, T> {
    /// Collects a finished result, then says whether `key` still has to be started: it is
    /// neither the one shown nor the one running. Callers build the work only then.
    pub fn wants(&mut self, key: &K) -> bool {
        self.poll();
        !(self.done.as_ref().is_some_and(|(k, _)| k == key)
            || self.pending.as_ref().is_some_and(|(k, _)| k == key))
    }

    /// Computes `key` with `work`: now when blocking, else on a worker thread.
    pub fn start(&mut self, key: K, work: impl FnOnce() -> T + Send + 'static) {
        if self.blocking {
            self.done = Some((key, work()));
            return;
        }
        let (tx, rx) = channel();
        let on_done = self.on_done.clone();
        std::thread::spawn(move || {
            // The receiver is gone when a newer result was asked for or the app closed.
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
            Ok(result) => {
                if let Some((key, _)) = self.pending.take() {
                    self.done = Some((key, result));
                }
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => self.pending = None,
        }
    }

    /// Whether a result is being computed on a worker (as of the last [`Self::wants`]).
    pub fn running(&self) -> bool {
        self.pending.is_some()
    }

    /// The newest finished result and its key ([`Self::wants`], called every frame, collects
    /// a finished one).
    pub fn done(&self) -> Option<&(K, T)> {
        self.done.as_ref()
    }
}
