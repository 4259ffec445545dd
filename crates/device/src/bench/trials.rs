//! What training and inference runs share: the run record before any trial, the runner
//! process's environment, the sweep over batches and a trial guarded against an engine's panic.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::engine::Control;
use super::request::BenchRequest;
use vramlab_core::plan::config::AllocatorConfig;
use vramlab_core::record::{
    BenchEvent, DeviceInfo, Outcome, Predicted, RUN_SCHEMA_VERSION, Run, Trial,
};
use vramlab_core::sweep::{BatchPlan, Sweep};

/// The runner process's environment: the request's, and the plan's allocator settings
/// (they apply to the real run too).
pub(crate) fn runner_env(req: &BenchRequest, allocator: AllocatorConfig) -> Vec<(String, String)> {
    let mut env = req.runner_env.clone();
    let mut conf = Vec::new();
    if allocator.expandable_segments {
        conf.push("expandable_segments:True".to_string());
    }
    if let Some(mb) = allocator.max_split_size_mb {
        conf.push(format!("max_split_size_mb:{mb}"));
    }
    if !conf.is_empty() {
        env.push(("PYTORCH_CUDA_ALLOC_CONF".into(), conf.join(",")));
    }
    env
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The run record of `req` before any trial.
pub(crate) fn new_run(req: &BenchRequest, device: DeviceInfo, size: u64) -> Run {
    Run {
        schema_version: RUN_SCHEMA_VERSION,
        engine: req.engine,
        device,
        model: req.preset.id.clone(),
        config: req.config,
        size,
        started_unix: now_unix(),
        vramlab_version: env!("CARGO_PKG_VERSION").to_string(),
        predicted_max_batch: req.predicted_max_batch,
        trials: Vec::new(),
        stopped: None,
        inference: None,
    }
}

/// A trial run at `(index, batch)` under a [`Control`].
pub(crate) type TrialFn<'a> = dyn FnMut(u32, u64, &mut Control<'_>) -> Trial + 'a;

/// The trials of `batches` (a list, or a sweep until OOM that bisects to the boundary): each
/// one run by `trial`, given `predict`'s prediction for its batch, streamed as
/// [`BenchEvent::TrialDone`] and pushed onto `run`. Training and inference runs share it.
pub(crate) fn sweep_trials(
    batches: BatchPlan,
    run: &mut Run,
    cancel: &AtomicBool,
    emit: &mut dyn FnMut(BenchEvent),
    trial: &mut TrialFn<'_>,
    predict: &dyn Fn(u64) -> Option<Predicted>,
) {
    let sweeping = matches!(batches, BatchPlan::UntilOom { .. });
    let mut sweep = Sweep::new(batches);
    while let Some(batch) = sweep.next_batch() {
        if cancel.load(Ordering::Relaxed) {
            run.stopped = Some("cancelled".into());
            break;
        }
        let index = run.trials.len() as u32;
        let mut t = {
            let mut ctl = Control::new(cancel, emit);
            trial(index, batch, &mut ctl)
        };
        t.predicted = predict(batch);
        let outcome = t.outcome.clone();
        emit(BenchEvent::TrialDone { trial: t.clone() });
        run.trials.push(t);
        match outcome {
            Outcome::Ran => sweep.record(batch, true),
            Outcome::Oom { .. } => sweep.record(batch, false),
            Outcome::Cancelled => {
                run.stopped = Some("cancelled".into());
                break;
            }
            Outcome::Error { message } => {
                if sweeping {
                    // Not a capacity answer: the boundary cannot be found past it.
                    run.stopped = Some(format!("trial at batch {batch} failed: {message}"));
                    break;
                }
            }
        }
    }
}

/// Runs one trial; a panic inside an engine (a bug) becomes an error outcome, so the
/// run and the app go on.
pub(crate) fn guarded_trial(
    index: u32,
    batch: u64,
    ctl: &mut Control<'_>,
    run: impl FnOnce(&mut Control<'_>) -> Trial,
) -> Trial {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(ctl)));
    r.unwrap_or_else(|p| {
        let what = p
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Trial::failed(
            index,
            batch,
            Outcome::Error {
                message: format!("internal error in the engine: {what}"),
            },
        )
    })
}
