//! The "make it fit" search for the GUI: one search per (model, config, GPU budget), run on
//! a worker thread (it plans dozens of combinations: hundreds of ms for an 8 B model) and
//! cached; tests run it on the calling thread so that what they draw is deterministic.

use std::sync::mpsc::{Receiver, TryRecvError, channel};
use std::time::Duration;

use vramlab_core::model::Preset;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::fit::{FitReport, FitRequest, fit};
use vramlab_core::plan::search::Budget;

/// What a search answers, with its time in milliseconds.
pub type FitResult = Result<(FitReport, f64), String>;

/// How long the frame that starts a search waits for it (a short search then shows at once).
const FIRST_WAIT: Duration = Duration::from_millis(40);

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
    key: Option<Key>,
    result: Option<FitResult>,
    pending: Option<Receiver<FitResult>>,
    /// Run searches on the calling thread (tests, screenshots).
    pub blocking: bool,
    /// Called when a background search finishes (asks the UI for a frame).
    pub on_done: Option<std::sync::Arc<dyn Fn() + Send + Sync>>,
}

impl FitSearch {
    /// Starts a search (the request from `make`) unless the same one is cached or running;
    /// then collects a finished one.
    pub fn ensure(
        &mut self,
        preset: &Preset,
        config: &TrainConfig,
        budget: Budget,
        gpu: &str,
        make: impl FnOnce() -> FitRequest,
    ) {
        let same = self.key.as_ref().is_some_and(|k| {
            k.config == *config && k.budget == budget && k.gpu == gpu && k.preset == *preset
        });
        if !same {
            self.key = Some(Key {
                preset: preset.clone(),
                config: *config,
                budget,
                gpu: gpu.to_string(),
            });
            self.result = None;
            let (preset, config, req) = (preset.clone(), *config, make());
            let run = move || {
                let t = std::time::Instant::now();
                fit(&preset, &config, &req)
                    .map(|r| (r, t.elapsed().as_secs_f64() * 1e3))
                    .map_err(|e| format!("{e:#}"))
            };
            if self.blocking {
                self.pending = None;
                self.result = Some(run());
            } else {
                let (tx, rx) = channel();
                let done = self.on_done.clone();
                std::thread::spawn(move || {
                    // The receiver is gone when a newer search replaced this one.
                    let _ = tx.send(run());
                    if let Some(d) = done {
                        d();
                    }
                });
                if let Ok(r) = rx.recv_timeout(FIRST_WAIT) {
                    self.result = Some(r);
                } else {
                    self.pending = Some(rx);
                }
            }
        }
        self.poll();
    }

    fn poll(&mut self) {
        let Some(rx) = &self.pending else {
            return;
        };
        match rx.try_recv() {
            Ok(r) => {
                self.result = Some(r);
                self.pending = None;
            }
            Err(TryRecvError::Empty) => {}
            Err(TryRecvError::Disconnected) => {
                self.result = Some(Err("the search stopped unexpectedly".into()));
                self.pending = None;
            }
        }
    }

    /// The answer for the last search asked for; `None` while it runs.
    pub fn result(&self) -> Option<&FitResult> {
        self.result.as_ref()
    }

    /// Whether a search runs.
    pub fn running(&self) -> bool {
        self.pending.is_some()
    }

    /// Forgets the cached search (nothing to search: the plan fits and the section is closed).
    pub fn clear(&mut self) {
        self.key = None;
        self.result = None;
        self.pending = None;
    }
}
