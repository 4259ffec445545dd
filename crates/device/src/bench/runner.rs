//! Drives an engine through a run: picks batches (list or sweep until OOM), attaches the
//! planner's prediction to every trial, streams [`BenchEvent`]s, honours Cancel. A run
//! can go on a worker thread ([`spawn`]) that talks to the UI through a bounded channel
//! and stops when its [`BenchHandle`] is dropped. A request with an inference call goes
//! to [`super::infer`] (the same sweep, the inference planner's predictions).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

use anyhow::Result;

pub use super::engine::{Control, Engine, TrialJob};

pub use super::request::BenchRequest;
use super::trials::{guarded_trial, new_run, runner_env, sweep_trials};
use vramlab_core::plan::Planner;
use vramlab_core::plan::search::{Budget, max_batch};
use vramlab_core::record::{BenchEvent, EngineKind, Predicted, Run};
use vramlab_core::sweep::BatchPlan;

/// Opens the engine a request names (a clear error without a GPU / CUDA / PyTorch).
pub fn open_engine(req: &BenchRequest) -> Result<Box<dyn Engine>> {
    if req.inference.is_some() {
        anyhow::bail!(
            "an inference call runs through bench::infer (run_blocking dispatches it), not a \
             training engine"
        );
    }
    // A world the engine cannot run is refused before anything starts (native + a
    // strategy, DeepSpeed, several nodes).
    super::world::check_config(req.engine, &req.config).map_err(anyhow::Error::msg)?;
    match req.engine {
        EngineKind::Native => Ok(Box::new(super::native::NativeEngine::open(
            req.device_index,
        )?)),
        EngineKind::Torch => {
            let env = runner_env(req, req.config.allocator);
            if req.config.distributed.active() {
                return Ok(Box::new(super::dist::DistEngine::open(
                    req.python.clone(),
                    req.device_index,
                    &env,
                    &req.config,
                )?));
            }
            Ok(Box::new(super::torch::TorchEngine::open(
                req.python.clone(),
                req.device_index,
                &env,
            )?))
        }
    }
}

/// Runs the whole request on `engine`, emitting events; returns the run record (also
/// sent as [`BenchEvent::Finished`]).
pub fn run_with(
    req: &BenchRequest,
    engine: &mut dyn Engine,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(BenchEvent),
) -> Result<Run> {
    let planner = Planner::new(&req.preset, &req.config)?;
    let device = engine.device();
    emit(BenchEvent::Started {
        engine: req.engine,
        device: device.clone(),
        planned: req.batches.planned(),
    });
    let mut run = new_run(req, device, planner.size);
    let mut batches = req.batches.clone();
    if let BatchPlan::UntilOom { seed: 0, limit } = batches {
        // Seed from the device the engine really has (its CUDA-visible total).
        let budget = Budget {
            capacity: run.device.total_bytes,
            margin: 0.0,
        };
        let seed = max_batch(&planner, budget, limit)?.unwrap_or(1);
        run.predicted_max_batch = Some(seed);
        batches = BatchPlan::UntilOom { seed, limit };
    }
    let steps = req.steps.max(1);
    let mut trial = |index: u32, batch: u64, ctl: &mut Control<'_>| {
        let job = TrialJob {
            preset: &req.preset,
            planner: &planner,
            index,
            batch,
            steps,
        };
        guarded_trial(job.index, job.batch, ctl, |ctl| engine.trial(&job, ctl))
    };
    let predict = |batch: u64| planner.peaks(batch).ok().map(Predicted::from);
    sweep_trials(batches, &mut run, cancel, emit, &mut trial, &predict);
    emit(BenchEvent::Finished { run: run.clone() });
    Ok(run)
}

/// Opens the engine and runs; a failure to start is reported as
/// [`BenchEvent::Failed`] and returned.
pub fn run_blocking(
    req: &BenchRequest,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(BenchEvent),
) -> Result<Run> {
    if let Some(bench) = &req.inference {
        return super::infer::run_blocking(req, bench, cancel, emit);
    }
    let mut engine = match open_engine(req) {
        Ok(e) => e,
        Err(e) => {
            emit(BenchEvent::Failed {
                message: format!("{e:#}"),
            });
            return Err(e);
        }
    };
    match run_with(req, engine.as_mut(), cancel, emit) {
        Ok(run) => Ok(run),
        Err(e) => {
            emit(BenchEvent::Failed {
                message: format!("{e:#}"),
            });
            Err(e)
        }
    }
}

/// Capacity of the event channel. Samples are dropped when it is full (the UI is
/// behind); trial results and the end of the run are never dropped.
pub const CHANNEL_CAPACITY: usize = 1024;

/// A run on a worker thread. Dropping the handle cancels the run.
pub struct BenchHandle {
    rx: Receiver<BenchEvent>,
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl BenchHandle {
    /// Events received since the last call (never blocks).
    pub fn poll(&self) -> Vec<BenchEvent> {
        self.rx.try_iter().collect()
    }

    /// Asks the run to stop; the engine checks between ops and frees its memory.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Whether the worker has ended (all its events are in the channel).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// A handle that delivers recorded events (a saved run, or tests of the UI).
    pub fn replay(events: Vec<BenchEvent>) -> BenchHandle {
        let (tx, rx) = sync_channel(events.len().max(1));
        for e in events {
            // Capacity is the event count: this never blocks or fails.
            let _ = tx.try_send(e);
        }
        BenchHandle {
            rx,
            cancel: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }
}

impl Drop for BenchHandle {
    fn drop(&mut self) {
        self.cancel();
    }
}

fn send(tx: &SyncSender<BenchEvent>, e: BenchEvent, notify: &(dyn Fn() + Send)) {
    let droppable = matches!(e, BenchEvent::Sample { .. } | BenchEvent::Progress { .. });
    if droppable {
        match tx.try_send(e) {
            Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
    } else {
        // Blocks only while the UI is far behind; errors mean the UI is gone.
        let _ = tx.send(e);
    }
    notify();
}

/// Starts the request on a worker thread; `notify` is called after every event (the
/// GUI passes `ctx.request_repaint`).
pub fn spawn(req: BenchRequest, notify: Box<dyn Fn() + Send>) -> BenchHandle {
    let (tx, rx) = sync_channel(CHANNEL_CAPACITY);
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let thread = std::thread::Builder::new()
        .name("vramlab-bench".into())
        .spawn(move || {
            let mut emit = |e: BenchEvent| send(&tx, e, notify.as_ref());
            // The outcome is in the events (Finished / Failed).
            let _ = run_blocking(&req, &flag, &mut emit);
        });
    match thread {
        Ok(t) => BenchHandle {
            rx,
            cancel,
            thread: Some(t),
        },
        Err(e) => {
            let h = BenchHandle::replay(vec![BenchEvent::Failed {
                message: format!("could not start the bench thread: {e}"),
            }]);
            drop(rx);
            h
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::engine::cancelled_trial;
    use vramlab_core::model::preset::find_builtin;
    use vramlab_core::plan::TrainConfig;
    use vramlab_core::record::DeviceInfo;
    use vramlab_core::record::{Outcome, Trial};
    use vramlab_core::units::Bytes;

    /// An engine whose device fits batches up to `cap` (CI has no GPU).
    struct Scripted {
        cap: u64,
        fail_at: Option<u64>,
    }

    impl Engine for Scripted {
        fn device(&self) -> DeviceInfo {
            DeviceInfo {
                name: "scripted".into(),
                total_bytes: Bytes(80 << 30),
                ..Default::default()
            }
        }

        fn trial(&mut self, job: &TrialJob<'_>, ctl: &mut Control<'_>) -> Trial {
            let (index, batch) = (job.index, job.batch);
            ctl.progress(index, batch, "step", 0.5);
            if ctl.cancelled() {
                return cancelled_trial(index, batch);
            }
            if Some(batch) == self.fail_at {
                return Trial::failed(
                    index,
                    batch,
                    Outcome::Error {
                        message: "boom".into(),
                    },
                );
            }
            if batch > self.cap {
                return Trial::failed(
                    index,
                    batch,
                    Outcome::Oom {
                        message: "CUDA out of memory".into(),
                    },
                );
            }
            let mut t = Trial::failed(index, batch, Outcome::Ran);
            t.peak_allocated = Some(Bytes(batch << 20));
            t
        }
    }

    fn request(batches: BatchPlan) -> BenchRequest {
        BenchRequest {
            preset: find_builtin("resnet18").expect("preset"),
            config: TrainConfig::default(),
            engine: EngineKind::Native,
            batches,
            steps: 1,
            python: None,
            device_index: 0,
            predicted_max_batch: None,
            runner_env: Vec::new(),
            inference: None,
        }
    }

    #[test]
    fn sweep_stops_at_the_boundary_and_attaches_predictions() {
        let req = request(BatchPlan::UntilOom {
            seed: 40,
            limit: 4096,
        });
        let mut engine = Scripted {
            cap: 37,
            fail_at: None,
        };
        let cancel = AtomicBool::new(false);
        let mut events = Vec::new();
        let run = run_with(&req, &mut engine, &cancel, &mut |e| events.push(e)).expect("run");
        assert_eq!(run.max_batch_ran(), Some(37));
        assert_eq!(run.first_oom(), Some(38));
        assert!(run.trials.iter().all(|t| t.predicted.is_some()));
        assert!(matches!(events.first(), Some(BenchEvent::Started { .. })));
        assert!(matches!(events.last(), Some(BenchEvent::Finished { .. })));
        let done = events
            .iter()
            .filter(|e| matches!(e, BenchEvent::TrialDone { .. }))
            .count();
        assert_eq!(done, run.trials.len());
    }

    #[test]
    fn an_error_ends_a_sweep_but_not_a_list() {
        let cancel = AtomicBool::new(false);
        let mut engine = Scripted {
            cap: 100,
            fail_at: Some(8),
        };
        let sweep = request(BatchPlan::UntilOom { seed: 8, limit: 64 });
        let run = run_with(&sweep, &mut engine, &cancel, &mut |_| {}).expect("run");
        assert_eq!(run.trials.len(), 1);
        assert!(run.stopped.as_deref().unwrap_or("").contains("boom"));
        let list = request(BatchPlan::List(vec![4, 8, 16]));
        let run = run_with(&list, &mut engine, &cancel, &mut |_| {}).expect("run");
        assert_eq!(run.trials.len(), 3);
        assert_eq!(run.max_batch_ran(), Some(16));
    }

    #[test]
    fn cancel_stops_before_the_next_trial() {
        let cancel = AtomicBool::new(true);
        let mut engine = Scripted {
            cap: 100,
            fail_at: None,
        };
        let run = run_with(
            &request(BatchPlan::List(vec![1, 2])),
            &mut engine,
            &cancel,
            &mut |_| {},
        )
        .expect("run");
        assert!(run.trials.is_empty());
        assert_eq!(run.stopped.as_deref(), Some("cancelled"));
    }

    #[test]
    fn replay_delivers_recorded_events() {
        let h = BenchHandle::replay(vec![BenchEvent::Failed {
            message: "no GPU".into(),
        }]);
        assert!(h.is_finished());
        assert_eq!(h.poll().len(), 1);
        assert!(h.poll().is_empty());
    }

    #[test]
    fn run_records_round_trip_through_json() {
        let cancel = AtomicBool::new(false);
        let mut engine = Scripted {
            cap: 3,
            fail_at: None,
        };
        let run = run_with(
            &request(BatchPlan::List(vec![2, 4])),
            &mut engine,
            &cancel,
            &mut |_| {},
        )
        .expect("run");
        let text = serde_json::to_string(&run).expect("serialise");
        let back: Run = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, run);
    }
}
