//! The "make it fit" search for the GUI: one search per (model, config, GPU budget), run on
//! a worker thread (it plans dozens of combinations: ~150 ms for an 8 B model) and cached.
//! At most one search runs: changes made meanwhile (dragging the batch slider) start one
//! search for the latest configuration when it ends. Tests run it on the calling thread so
//! that what they draw is deterministic.

use std::sync::mpsc::{Receiver, TryRecvError, channel};
use std::time::Duration;

use vramlab_core::model::Preset;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::fit::{FitReport, FitRequest, fit};
use vramlab_core::plan::search::Budget;

/// What a search answers, with its time in milliseconds.
pub type FitResult = Result<(FitReport, f64), String>;

/// How long the frame that starts a search waits for it (a short search then shows at once):
/// short enough that the frame stays within 16 ms (60 Hz) while the batch slider is dragged
/// and a search starts at each change (`frame_time_during_a_search`; it was 40 ms).
const FIRST_WAIT: Duration = Duration::from_millis(6);

#[derive(Debug, Clone, PartialEq)]
struct Key {
    preset: Preset,
    config: TrainConfig,
    budget: Budget,
    gpu: String,
}

/// The cached search and the one running.
#[derive(Default)]
pub struct FitSearch {
    /// The search asked for last, and its request.
    wanted: Option<(Key, FitRequest)>,
    /// The last finished search.
    done: Option<(Key, FitResult)>,
    /// The running search.
    pending: Option<(Key, Receiver<FitResult>)>,
    /// Run searches on the calling thread (tests, screenshots).
    pub blocking: bool,
    /// Called when a background search finishes (asks the UI for a frame).
    pub on_done: Option<std::sync::Arc<dyn Fn() + Send + Sync>>,
}

impl FitSearch {
    /// Asks for the search of `config` on `preset` against `budget` on GPU `gpu` (the request
    /// from `make`, called only when these change); starts it unless it is cached or another
    /// runs, and collects a finished one.
    pub fn ensure(
        &mut self,
        preset: &Preset,
        config: &TrainConfig,
        budget: Budget,
        gpu: &str,
        make: impl FnOnce() -> FitRequest,
    ) {
        let same = |k: &Key| {
            k.config == *config && k.budget == budget && k.gpu == gpu && k.preset == *preset
        };
        if !self.wanted.as_ref().is_some_and(|(k, _)| same(k)) {
            let key = Key {
                preset: preset.clone(),
                config: *config,
                budget,
                gpu: gpu.to_string(),
            };
            self.wanted = Some((key, make()));
        }
        self.poll();
        self.start();
    }

    /// Starts the wanted search when it is not the finished one and none runs.
    fn start(&mut self) {
        let Some((key, req)) = &self.wanted else {
            return;
        };
        if self.pending.is_some() || self.done.as_ref().is_some_and(|(k, _)| k == key) {
            return;
        }
        let (key, req) = (key.clone(), req.clone());
        let (preset, config) = (key.preset.clone(), key.config);
        let run = move || {
            let t = std::time::Instant::now();
            fit(&preset, &config, &req)
                .map(|r| (r, t.elapsed().as_secs_f64() * 1e3))
                .map_err(|e| format!("{e:#}"))
        };
        if self.blocking {
            self.done = Some((key, run()));
            return;
        }
        let (tx, rx) = channel();
        let on_done = self.on_done.clone();
        std::thread::spawn(move || {
            // The receiver is gone when the app closed.
            let _ = tx.send(run());
            if let Some(d) = on_done {
                d();
            }
        });
        match rx.recv_timeout(FIRST_WAIT) {
            Ok(r) => self.done = Some((key, r)),
            Err(_) => self.pending = Some((key, rx)),
        }
    }

    fn poll(&mut self) {
        let Some((_, rx)) = &self.pending else {
            return;
        };
        let r = match rx.try_recv() {
            Ok(r) => r,
            Err(TryRecvError::Empty) => return,
            Err(TryRecvError::Disconnected) => Err("the search stopped unexpectedly".into()),
        };
        if let Some((key, _)) = self.pending.take() {
            self.done = Some((key, r));
        }
    }

    /// The answer for the last search asked for; `None` while it runs.
    pub fn result(&self) -> Option<&FitResult> {
        let (wanted, _) = self.wanted.as_ref()?;
        self.done
            .as_ref()
            .filter(|(k, _)| k == wanted)
            .map(|(_, r)| r)
    }

    /// Whether a search runs.
    pub fn running(&self) -> bool {
        self.pending.is_some()
    }
}
