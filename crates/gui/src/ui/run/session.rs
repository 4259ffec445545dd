//! The runs of this session: the live one (a [`BenchHandle`] and what it streamed so
//! far) and the last [`KEPT_RUNS`] finished or opened runs, with the predicted curves
//! drawn beside their measurements. Runtime only, never persisted; fed events by
//! [`RunSession::poll`] once per frame.

use crate::ui::derived::{sweep_batches, sweep_points};
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::Planner;
use vramlab_core::plan::inference::InferPlanner;
use vramlab_core::plan::search::{SweepPoint, sweep};
use vramlab_core::record::{BenchEvent, MemSample, Outcome, RUN_SCHEMA_VERSION, Run, Trial};
use vramlab_device::bench::runner::BenchHandle;

/// Runs kept for comparison.
pub const KEPT_RUNS: usize = 5;
/// How many times beyond the other trials an OOM trial is drawn off the scale.
pub const OFF_SCALE: u64 = 4;
/// Points of an inference run's predicted curve.
const INFER_CURVE_POINTS: u64 = 24;
/// Samples of the running trial kept for the live timeline.
const LIVE_SAMPLES: usize = 20_000;

/// Where a kept run came from.
#[derive(Debug, Clone, PartialEq)]
pub enum RunSource {
    /// Measured in this session.
    Session,
    /// Opened from this file.
    File(String),
}

/// The predicted peaks over a batch range, for the batch plot.
#[derive(Debug, Clone)]
pub struct Curve {
    pub top: u64,
    pub points: Vec<SweepPoint>,
}

/// A finished, running or opened run.
#[derive(Debug, Clone)]
pub struct KeptRun {
    /// Stable id (indices shift when runs are added).
    pub id: u64,
    pub run: Run,
    pub source: RunSource,
    /// Drawn in the batch plot beside the selected run.
    pub overlay: bool,
    /// Index into `run.trials` of the trial whose timeline is shown.
    pub selected_trial: Option<usize>,
    /// The planner of the run's model and config, where it can be rebuilt (built-in
    /// preset, or the live run's model).
    planner: Option<Planner>,
    /// The inference planner of an inference run started here (it draws the curve).
    infer: Option<InferPlanner>,
    curve: Option<Curve>,
}

impl KeptRun {
    pub fn new(id: u64, run: Run, source: RunSource, planner: Option<Planner>) -> KeptRun {
        let planner = planner.or_else(|| {
            // an inference run's config is no training step: its curve needs its own planner
            if run.inference.is_some() {
                return None;
            }
            let preset = find_builtin(&run.model).ok()?;
            Planner::new(&preset, &run.config).ok()
        });
        KeptRun {
            id,
            run,
            source,
            overlay: false,
            selected_trial: None,
            planner,
            infer: None,
            curve: None,
        }
    }

    /// An inference run whose predicted curve `planner` draws.
    pub fn with_infer_planner(mut self, planner: InferPlanner) -> KeptRun {
        self.infer = Some(planner);
        self.curve = None;
        self
    }

    /// The predicted curve (`None` without a planner: the plot then joins the trials'
    /// own predictions).
    pub fn curve(&self) -> Option<&Curve> {
        self.curve.as_ref()
    }

    /// Top of the batch range the plot shows: a little beyond every trial on the scale
    /// ([`Self::off_scale`] ones excepted) and the predicted max batch.
    pub fn batch_top(&self) -> u64 {
        let hi = self
            .run
            .trials
            .iter()
            .filter(|t| !self.off_scale(t))
            .map(|t| t.batch)
            .chain(self.run.predicted_max_batch)
            .max()
            .unwrap_or(8);
        (hi + hi.div_ceil(8)).max(4)
    }

    /// An OOM trial far beyond every other trial and the predicted max batch (more than
    /// [`OFF_SCALE`] times): a probe such as the priming OOM at batch 100 000. Its
    /// predicted bytes would stretch the axes until the real data is a flat line, so the
    /// plot marks it at its edge instead.
    pub fn off_scale(&self, t: &Trial) -> bool {
        let base = self
            .run
            .trials
            .iter()
            .filter(|t| !matches!(t.outcome, Outcome::Oom { .. }))
            .map(|t| t.batch)
            .chain(self.run.predicted_max_batch)
            .max();
        matches!(t.outcome, Outcome::Oom { .. })
            && base.is_some_and(|b| t.batch > b.saturating_mul(OFF_SCALE))
    }

    /// Recomputes the predicted curve when the batch range changed.
    fn refresh_curve(&mut self) {
        let top = self.batch_top();
        if self.curve.as_ref().is_some_and(|c| c.top == top) {
            return;
        }
        if let Some(infer) = &self.infer {
            // each point is a pass of the allocator model over the whole call
            let points = sweep_batches(top, INFER_CURVE_POINTS)
                .into_iter()
                .map_while(|b| {
                    infer.peaks(b).ok().map(|p| SweepPoint {
                        batch: b,
                        allocated: p.allocated,
                        reserved: p.reserved,
                        nvidia_smi: p.nvidia_smi,
                    })
                })
                .collect();
            self.curve = Some(Curve { top, points });
            return;
        }
        let Some(planner) = &self.planner else {
            return;
        };
        let n = sweep_points(planner.events.events.len()).min(64);
        self.curve = Some(Curve {
            top,
            points: sweep(planner, sweep_batches(top, n)),
        });
    }

    /// The trial whose timeline is shown: the chosen one, else the largest batch that
    /// ran with a timeline, else the last trial.
    pub fn shown_trial(&self) -> Option<&Trial> {
        let trials = &self.run.trials;
        if let Some(t) = self.selected_trial.and_then(|i| trials.get(i)) {
            return Some(t);
        }
        trials
            .iter()
            .filter(|t| t.outcome.ran() && !t.timeline.is_empty())
            .max_by_key(|t| t.batch)
            .or_else(|| trials.last())
    }

    /// "#2 gpt2 · native · b8–88" for the runs list (the full label on hover).
    pub fn short_label(&self) -> String {
        let r = &self.run;
        let mut s = format!("#{} {} · {}", self.id, r.model, r.engine.as_str());
        let lo = r.trials.iter().map(|t| t.batch).min();
        let hi = r.trials.iter().map(|t| t.batch).max();
        match (lo, hi) {
            (Some(lo), Some(hi)) if lo != hi => s.push_str(&format!(" · b{lo}–{hi}")),
            (Some(b), _) => s.push_str(&format!(" · b{b}")),
            _ => {}
        }
        if let RunSource::File(_) = self.source {
            s.push_str(" · file");
        }
        s
    }

    /// "gpt2 · amp-bf16 · native · H200 (file.json)".
    pub fn label(&self) -> String {
        match &self.source {
            RunSource::Session => self.run.title(),
            RunSource::File(f) => {
                let name = std::path::Path::new(f)
                    .file_name()
                    .map_or_else(|| f.clone(), |n| n.to_string_lossy().into_owned());
                format!("{} ({name})", self.run.title())
            }
        }
    }
}

/// The run in progress.
pub struct LiveRun {
    pub run_id: u64,
    handle: BenchHandle,
    /// Trials planned (`None` for a sweep).
    pub planned: Option<u32>,
    /// The last Progress event: trial index, batch, phase, fraction of the trial.
    pub progress: Option<(u32, u64, String, f32)>,
    /// Samples of the running trial (the timeline while it runs).
    pub samples: Vec<MemSample>,
    pub cancelling: bool,
    /// The worker was seen running (a replayed handle never is).
    saw_running: bool,
}

impl LiveRun {
    /// Fraction of the whole run done, for the progress bar (a sweep counts trials of an
    /// unknown total, so it shows the running trial's fraction).
    pub fn fraction(&self, done: usize) -> f32 {
        let f = self.progress.as_ref().map_or(0.0, |p| p.3);
        match self.planned {
            Some(n) if n > 0 => ((done as f32 + f) / n as f32).clamp(0.0, 1.0),
            _ => f,
        }
    }

    /// "trial 2/4 · batch 8 · backward" or "trial 3 · batch 37 · forward".
    pub fn status(&self, done: usize) -> String {
        let (n, batch, phase) = match &self.progress {
            Some((i, b, p, _)) => (*i as usize + 1, Some(*b), p.as_str()),
            None => (done + 1, None, "starting the engine"),
        };
        let mut s = match self.planned {
            Some(total) => format!("trial {n}/{total}"),
            None => format!("trial {n}"),
        };
        if let Some(b) = batch {
            s.push_str(&format!(" · batch {b}"));
        }
        s.push_str(&format!(" · {phase}"));
        if self.cancelling {
            s.push_str(" · cancelling…");
        }
        s
    }
}

/// The live run and the kept runs.
#[derive(Default)]
pub struct RunSession {
    pub live: Option<LiveRun>,
    /// Newest first.
    pub runs: Vec<KeptRun>,
    /// Id of the run shown.
    pub selected: Option<u64>,
    /// Why the last run could not start or failed (shown in red).
    pub error: Option<String>,
    next_id: u64,
}

impl RunSession {
    /// Starts showing a run: `skeleton` is the run record without trials (model, config,
    /// size); `planner` draws its predicted curve.
    pub fn start(&mut self, handle: BenchHandle, skeleton: Run, planner: Option<Planner>) {
        let planned = None;
        let id = self.add(KeptRun::new(0, skeleton, RunSource::Session, planner));
        self.live = Some(LiveRun {
            run_id: id,
            handle,
            planned,
            progress: None,
            samples: Vec::new(),
            cancelling: false,
            saw_running: false,
        });
        self.error = None;
    }

    /// [`Self::start`] for an inference run: `planner` (the inference planner) draws its
    /// predicted curve.
    pub fn start_infer(&mut self, handle: BenchHandle, skeleton: Run, planner: InferPlanner) {
        let run = KeptRun::new(0, skeleton, RunSource::Session, None).with_infer_planner(planner);
        let id = self.add(run);
        self.live = Some(LiveRun {
            run_id: id,
            handle,
            planned: None,
            progress: None,
            samples: Vec::new(),
            cancelling: false,
            saw_running: false,
        });
        self.error = None;
    }

    /// Adds a run (newest first, at most [`KEPT_RUNS`], the live one is never dropped),
    /// selects it and returns its id.
    pub fn add(&mut self, mut run: KeptRun) -> u64 {
        self.next_id += 1;
        run.id = self.next_id;
        run.refresh_curve();
        self.runs.insert(0, run);
        let live = self.live.as_ref().map(|l| l.run_id);
        while self.runs.len() > KEPT_RUNS {
            match self.runs.iter().rposition(|r| Some(r.id) != live) {
                Some(i) => {
                    self.runs.remove(i);
                }
                None => break,
            }
        }
        self.selected = Some(self.next_id);
        self.next_id
    }

    pub fn is_running(&self) -> bool {
        self.live.is_some()
    }

    pub fn run(&self, id: u64) -> Option<&KeptRun> {
        self.runs.iter().find(|r| r.id == id)
    }

    pub fn run_mut(&mut self, id: u64) -> Option<&mut KeptRun> {
        self.runs.iter_mut().find(|r| r.id == id)
    }

    /// The run shown (selected, else the newest).
    pub fn shown(&self) -> Option<&KeptRun> {
        self.selected
            .and_then(|id| self.run(id))
            .or_else(|| self.runs.first())
    }

    pub fn shown_mut(&mut self) -> Option<&mut KeptRun> {
        let id = self.shown()?.id;
        self.run_mut(id)
    }

    /// Asks the live run to stop (the engine checks between ops).
    pub fn cancel(&mut self) {
        if let Some(l) = &mut self.live {
            l.handle.cancel();
            l.cancelling = true;
        }
    }

    /// Applies the events that arrived; true when anything changed.
    pub fn poll(&mut self) -> bool {
        let Some(live) = &mut self.live else {
            return false;
        };
        let finished = live.handle.is_finished();
        live.saw_running |= !finished;
        let events = live.handle.poll();
        let changed = !events.is_empty();
        for e in events {
            self.apply(e);
        }
        // A worker that ended without Finished / Failed (it cannot, unless it panicked),
        // or a cancelled replay: end the run with what arrived.
        if let Some(l) = &self.live
            && finished
            && (l.saw_running || l.cancelling)
        {
            let why = if l.cancelling {
                "cancelled"
            } else {
                "the bench worker stopped without a result"
            };
            self.end(None, Some(why.to_string()));
            return true;
        }
        changed
    }

    /// Applies one event to the live run.
    pub fn apply(&mut self, event: BenchEvent) {
        let Some(live) = &mut self.live else {
            return;
        };
        let id = live.run_id;
        match event {
            BenchEvent::Started {
                engine,
                device,
                planned,
            } => {
                live.planned = planned;
                if let Some(r) = self.run_mut(id) {
                    r.run.engine = engine;
                    r.run.device = device;
                }
            }
            BenchEvent::Progress {
                trial,
                batch,
                phase,
                fraction,
            } => {
                if live.progress.as_ref().is_some_and(|p| p.0 != trial) {
                    live.samples.clear();
                }
                live.progress = Some((trial, batch, phase, fraction));
            }
            BenchEvent::Sample { trial, sample } => {
                if live.progress.as_ref().is_none_or(|p| p.0 == trial)
                    && live.samples.len() < LIVE_SAMPLES
                {
                    live.samples.push(sample);
                }
            }
            BenchEvent::TrialDone { trial } => {
                live.samples.clear();
                if let Some(r) = self.run_mut(id) {
                    r.run.trials.push(trial);
                    r.refresh_curve();
                }
            }
            BenchEvent::Finished { run } => self.end(Some(run), None),
            BenchEvent::Failed { message } => {
                self.error = Some(message.clone());
                self.end(None, Some(message));
            }
        }
    }

    /// Ends the live run; `run` replaces what was accumulated.
    fn end(&mut self, run: Option<Run>, stopped: Option<String>) {
        let Some(live) = self.live.take() else {
            return;
        };
        let Some(r) = self.run_mut(live.run_id) else {
            return;
        };
        if let Some(run) = run {
            r.run = run;
        }
        if r.run.stopped.is_none() {
            r.run.stopped = stopped;
        }
        r.refresh_curve();
        // A run that failed before any trial says nothing worth keeping.
        if r.run.trials.is_empty() && self.error.is_some() {
            let id = live.run_id;
            self.runs.retain(|r| r.id != id);
            if self.selected == Some(id) {
                self.selected = self.runs.first().map(|r| r.id);
            }
        }
    }

    /// Errors of the shown run's trials (Error outcomes) and how it stopped, for red text.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self.error.iter().cloned().collect();
        if let Some(r) = self.shown() {
            for t in &r.run.trials {
                if let Outcome::Error { message } = &t.outcome {
                    out.push(format!("batch {}: {message}", t.batch));
                }
            }
            if let Some(s) = &r.run.stopped
                && self.error.as_deref() != Some(s.as_str())
                && s != "cancelled"
            {
                out.push(format!("run stopped: {s}"));
            }
        }
        out
    }
}

/// A run record with no trials yet, for [`RunSession::start`].
pub fn skeleton(
    engine: vramlab_device::bench::EngineKind,
    model: &str,
    config: vramlab_core::plan::TrainConfig,
    size: u64,
    predicted_max_batch: Option<u64>,
) -> Run {
    Run {
        schema_version: RUN_SCHEMA_VERSION,
        engine,
        device: vramlab_device::bench::DeviceInfo::default(),
        model: model.to_string(),
        config,
        size,
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        vramlab_version: env!("CARGO_PKG_VERSION").to_string(),
        predicted_max_batch,
        trials: Vec::new(),
        stopped: None,
        inference: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_core::plan::TrainConfig;
    use vramlab_core::units::Bytes;
    use vramlab_device::bench::EngineKind;

    fn ran(index: u32, batch: u64) -> Trial {
        let mut t = Trial::failed(index, batch, Outcome::Ran);
        t.peak_allocated = Some(Bytes(batch << 28));
        t
    }

    fn skel() -> Run {
        skeleton(
            EngineKind::Native,
            "gpt2",
            TrainConfig::default(),
            1024,
            Some(12),
        )
    }

    #[test]
    fn events_build_the_run_and_finish_keeps_it() {
        let mut s = RunSession::default();
        let events = vec![
            BenchEvent::Started {
                engine: EngineKind::Native,
                device: vramlab_device::bench::DeviceInfo {
                    name: "fake".into(),
                    ..Default::default()
                },
                planned: Some(2),
            },
            BenchEvent::Progress {
                trial: 0,
                batch: 4,
                phase: "forward".into(),
                fraction: 0.5,
            },
        ];
        s.start(BenchHandle::replay(events), skel(), None);
        assert!(s.poll());
        let l = s.live.as_ref().expect("live");
        assert_eq!(l.status(0), "trial 1/2 · batch 4 · forward");
        assert!((l.fraction(0) - 0.25).abs() < 1e-6);
        // A replayed handle without Finished stays live until Cancel.
        assert!(!s.poll());
        assert!(s.is_running());
        s.apply(BenchEvent::TrialDone { trial: ran(0, 4) });
        let shown = s.shown().expect("shown");
        assert_eq!(shown.run.trials.len(), 1);
        assert_eq!(shown.run.device.name, "fake");
        assert!(shown.curve().is_some(), "gpt2 is a built-in preset");
        s.cancel();
        assert!(s.poll());
        assert!(!s.is_running());
        assert_eq!(
            s.shown().and_then(|r| r.run.stopped.as_deref()),
            Some("cancelled")
        );
    }

    #[test]
    fn a_failed_start_shows_the_error_and_keeps_nothing() {
        let mut s = RunSession::default();
        s.start(
            BenchHandle::replay(vec![BenchEvent::Failed {
                message: "no CUDA driver".into(),
            }]),
            skel(),
            None,
        );
        s.poll();
        assert!(!s.is_running());
        assert!(s.runs.is_empty());
        assert_eq!(s.problems(), vec!["no CUDA driver".to_string()]);
    }

    #[test]
    fn keeps_the_last_five() {
        let mut s = RunSession::default();
        for i in 0..8 {
            let mut r = skel();
            r.trials.push(ran(0, i + 1));
            s.add(KeptRun::new(0, r, RunSource::Session, None));
        }
        assert_eq!(s.runs.len(), KEPT_RUNS);
        assert_eq!(s.shown().map(|r| r.run.trials[0].batch), Some(8));
        assert_eq!(s.runs.last().map(|r| r.run.trials[0].batch), Some(4));
    }

    #[test]
    fn shown_trial_prefers_the_largest_that_ran_with_a_timeline() {
        let mut r = skel();
        let mut a = ran(0, 4);
        a.timeline.push(MemSample {
            t_ms: 0.0,
            event: None,
            measured: Bytes(1),
            predicted_allocated: None,
            predicted_reserved: None,
            label: String::new(),
        });
        r.trials = vec![a, ran(1, 8), Trial::failed(2, 16, Outcome::Cancelled)];
        let mut k = KeptRun::new(1, r, RunSource::Session, None);
        assert_eq!(k.shown_trial().map(|t| t.batch), Some(4));
        k.selected_trial = Some(2);
        assert_eq!(k.shown_trial().map(|t| t.batch), Some(16));
        assert_eq!(k.batch_top(), 18);
    }

    #[test]
    fn a_probe_oom_far_beyond_the_data_is_off_the_scale() {
        let oom = |i, b| {
            Trial::failed(
                i,
                b,
                Outcome::Oom {
                    message: "CUDA out of memory".into(),
                },
            )
        };
        let mut r = skel();
        r.predicted_max_batch = Some(92);
        r.trials = vec![ran(0, 8), oom(1, 100_000), ran(2, 8)];
        let k = KeptRun::new(1, r, RunSource::Session, None);
        assert!(k.off_scale(&k.run.trials[1]));
        assert!(!k.off_scale(&k.run.trials[0]));
        assert_eq!(k.batch_top(), 92 + 12);
        // An OOM at the boundary is data.
        let mut r = skel();
        r.trials = vec![ran(0, 78), oom(1, 79)];
        let k = KeptRun::new(1, r, RunSource::Session, None);
        assert!(!k.off_scale(&k.run.trials[1]));
        assert_eq!(k.batch_top(), 79 + 10);
    }
}
