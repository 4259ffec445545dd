//! A result computed on a worker thread, keyed by what it was asked for: the frame that asks
//! shows the previous result (or nothing) until the new one arrives, so the UI never waits
//! for it. One worker runs at a time: a result asked while one runs waits until it ends (the
//! newest such request replaces an older waiting one), so that dragging a slider over a
//! search of a second (the longest prompt of an 8 B model) does not start a search per frame,
//! each competing with the frames for the CPU (`frame_time_inference_mode`: 527 ms frames).
//! Tests set `blocking` and compute on the calling thread, so what they draw is
//! deterministic. Used for the memory-versus-batch curve ([`super::sweep_job`]), the
//! remedies ([`super::derived`]) and the longest prompt of an inference call
//! ([`super::inference`]). A worker that died without an answer (a panic: a bug, reported
//! on stderr once) is not started again for the same key: the frames after it would each
//! start one more ([`BackgroundJob::failed`]).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError, channel};

/// Work waiting for the running worker to end.
type Queued<K, T> = (K, Box<dyn FnOnce() -> T + Send>);

/// The result shown, the one being computed and the one waiting to be.
pub struct BackgroundJob<K, T> {
    done: Option<(K, T)>,
    pending: Option<(K, Receiver<T>)>,
    /// Asked while `pending` ran: started when it ends.
    queued: Option<Queued<K, T>>,
    /// The key whose worker died without an answer.
    failed: Option<K>,
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
            queued: None,
            failed: None,
            blocking: false,
            on_done: None,
        }
    }
}

impl<K: PartialEq, T: Send + 'static> BackgroundJob<K, T> {
    /// Collects a finished result, then says whether `key` still has to be started: it is
    /// neither the one shown, nor the one running or waiting, nor one whose worker died.
    /// Callers build the work only then.
    pub fn wants(&mut self, key: &K) -> bool {
        self.poll();
        !(self.done.as_ref().is_some_and(|(k, _)| k == key)
            || self.pending.as_ref().is_some_and(|(k, _)| k == key)
            || self.queued.as_ref().is_some_and(|(k, _)| k == key)
            || self.failed.as_ref().is_some_and(|k| k == key))
    }

    /// Computes `key` with `work`: now when blocking, else on a worker thread — when the
    /// running one ends, if one runs (replacing whatever waited for it).
    pub fn start(&mut self, key: K, work: impl FnOnce() -> T + Send + 'static) {
        if self.blocking {
            self.done = Some((key, work()));
            return;
        }
        self.failed = None;
        if self.pending.is_some() {
            self.queued = Some((key, Box::new(work)));
            return;
        }
        self.spawn(key, Box::new(work));
    }

    fn spawn(&mut self, key: K, work: Box<dyn FnOnce() -> T + Send>) {
        let (tx, rx) = channel();
        let on_done = self.on_done.clone();
        std::thread::spawn(move || {
            // The receiver is gone when the app closed.
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
            Err(TryRecvError::Empty) => return,
            // The worker died without an answer: not started again for this key.
            Err(TryRecvError::Disconnected) => self.failed = self.pending.take().map(|(k, _)| k),
        }
        if let Some((key, work)) = self.queued.take() {
            self.failed = None;
            self.spawn(key, work);
        }
    }

    /// The key whose worker died without an answer (as of the last [`Self::wants`]), while
    /// no later key was asked for.
    pub fn failed(&self) -> Option<&K> {
        self.failed.as_ref()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_until(
        job: &mut BackgroundJob<u32, u32>,
        key: u32,
        done: impl Fn(&BackgroundJob<u32, u32>) -> bool,
    ) {
        // A deadline, not a count of polls: a panicking worker prints its backtrace first
        // (RUST_BACKTRACE=1 in CI), which took over a second with the whole suite running.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            job.wants(&key);
            if done(job) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        panic!("the worker never finished");
    }

    /// Requests made while a worker runs wait for it; only the newest of them runs after it,
    /// so at most one worker computes at a time however often the key changes.
    #[test]
    fn one_worker_at_a_time_and_the_newest_request_runs_next() {
        let (release, gate) = std::sync::mpsc::channel::<()>();
        let gate = std::sync::Mutex::new(gate);
        let mut job: BackgroundJob<u32, u32> = BackgroundJob::default();
        job.start(1, move || {
            let _ = gate.lock().map(|g| g.recv());
            10
        });
        assert!(job.wants(&2));
        job.start(2, || 20);
        assert!(job.wants(&3));
        job.start(3, || 30);
        assert!(!job.wants(&3), "a waiting request is not asked for again");
        assert!(job.running());
        assert_eq!(job.done(), None, "2 and 3 wait while 1 runs");
        release.send(()).expect("release the first worker");
        wait_until(&mut job, 3, |j| j.done().is_some_and(|(k, _)| *k == 3));
        assert_eq!(
            job.done(),
            Some(&(3, 30)),
            "the newest request ran after the first"
        );
        assert!(job.wants(&2), "the replaced request never ran");
    }

    #[test]
    fn a_worker_that_dies_is_not_started_again_for_its_key() {
        let mut job: BackgroundJob<u32, u32> = BackgroundJob::default();
        assert!(job.wants(&1));
        job.start(1, || panic!("a bug in the work (expected in this test)"));
        wait_until(&mut job, 1, |j| !j.running());
        assert_eq!(job.failed(), Some(&1));
        assert!(!job.wants(&1), "a dead key would be started on every frame");
        // Another key is computed as usual, and clears the failure.
        assert!(job.wants(&2));
        job.start(2, || 4);
        wait_until(&mut job, 2, |j| j.done().is_some());
        assert_eq!(job.done(), Some(&(2, 4)));
        assert_eq!(job.failed(), None);
        assert!(!job.wants(&2) && job.wants(&1));
    }
}
