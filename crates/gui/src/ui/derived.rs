//! Runtime caches derived from [`PlannerState`]: the resolved model, the [`Planner`]
//! (rebuilt only when the model or a batch-independent setting changes), the max-batch
//! search and batch sweep (per planner and budget), the plan at the current batch, and its
//! remedies (planned on a worker, [`Derived::remedies`]). Never persisted.

use std::sync::Arc;

use vramlab_core::answer::PlanReport;
use vramlab_core::answer::remedy_planners::RemedyPlanners;
use vramlab_core::answer::report::ReportParts;
use vramlab_core::model::Preset;
use vramlab_core::model::preset::builtin_presets;
use vramlab_core::plan::remedies::Remedy;
use vramlab_core::plan::search::{Budget, SweepPoint, max_batch};
use vramlab_core::plan::{Phase, Plan, PlanError, Planner, TimelinePoint, gpus};
use vramlab_core::units::Bytes;
use vramlab_device::gpu::DetectedGpu;

use super::state::{DEFAULT_GPU, GpuChoice, PlannerState};

/// Largest batch the GUI offers and searches.
pub const BATCH_LIMIT: u64 = 65536;
/// Most points evaluated for the memory-vs-batch curves.
pub const SWEEP_POINTS: u64 = 128;
/// Fewest points of a sweep (large models, whose evaluations cost more).
pub const MIN_SWEEP_POINTS: u64 = 24;
/// Event evaluations one sweep may cost (~50 ms in a release build).
const SWEEP_EVENT_BUDGET: u64 = 300_000;

/// Points of a sweep for a planner with `events` events: the cost of a sweep is
/// points × events, so big models get fewer points and the GUI stays responsive.
pub fn sweep_points(events: usize) -> u64 {
    (SWEEP_EVENT_BUDGET / (events as u64).max(1)).clamp(MIN_SWEEP_POINTS, SWEEP_POINTS)
}
pub use super::inference::TIMELINE_POINTS;

/// Where the target GPU comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// The GPU NVML detected.
    Detected,
    /// A catalog card the user picked.
    Catalog,
    /// "Detected" was asked for but there is no GPU: the default catalog card.
    Fallback,
}

/// The GPU the plan is checked against and how much of it may be used.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuTarget {
    pub gpu: gpus::Gpu,
    pub kind: TargetKind,
    pub budget: Budget,
}

/// A run of timeline points in one phase, as plot coordinates (event index, GiB).
#[derive(Debug, Clone)]
pub struct PhaseSegment {
    pub phase: Phase,
    pub points: Vec<[f64; 2]>,
}

/// The plan at the current batch and what follows from it: the core's report, and its
/// timeline as plot segments.
#[derive(Debug, Clone)]
pub struct Answer {
    pub report: PlanReport,
    pub timeline: Vec<PhaseSegment>,
    /// Whose remedies the report holds: they are planned on a worker
    /// ([`Derived::remedies`]), so while the batch changes they may be those of an earlier
    /// batch, or none yet.
    pub remedies_of: RemediesOf,
}

/// Which batch the remedies of an [`Answer`] were planned at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemediesOf {
    /// This answer's batch.
    Current,
    /// An earlier batch of the same planner and budget (the new ones are being planned).
    Batch(u64),
    /// None yet (the report's list is empty while the first ones are planned).
    Pending,
    /// Planning them at this batch failed without an answer (a worker that panicked: a bug,
    /// reported on stderr); the list is an earlier batch's or empty. Not tried again until
    /// the batch or the configuration changes.
    Failed,
}

/// What a plan at one batch is keyed by: the planner's generation, the batch, the budget.
type AnswerKey = (u64, u64, Budget);

/// Largest batch that fits (`Ok(None)`: not even batch 1), or why the search failed.
pub type MaxBatch = Result<Option<u64>, PlanError>;
type AnswerResult = Result<Answer, String>;
/// What an answer shows: the plan's key, the remedies' (an earlier batch's while this one's
/// are planned) and whether planning this plan's remedies failed.
type ShownKey = (AnswerKey, Option<AnswerKey>, bool);

#[derive(Debug, Clone, PartialEq)]
struct ModelKey {
    preset_id: String,
    custom: Option<super::custom_doc::CustomDoc>,
}

/// Everything derived from the state; see the module docs.
pub struct Derived {
    pub presets: Vec<Preset>,
    pub presets_error: Option<String>,
    pub catalog: Vec<gpus::Gpu>,
    pub detected: Option<DetectedGpu>,
    model: Option<(ModelKey, Result<Preset, String>)>,
    planner: Option<Result<Planner, String>>,
    planner_key: Option<(Preset, vramlab_core::plan::TrainConfig)>,
    /// The model's block count, from the last planner that built for this model (kept while
    /// a setting such as `freeze_blocks` makes the planner fail, so its field stays bounded).
    blocks: Option<u32>,
    /// Bumped on every planner rebuild; keys the caches below.
    generation: u64,
    max_batch: Option<((u64, Budget), MaxBatch)>,
    /// The memory-versus-batch curve, computed on a worker ([`super::sweep_job`]).
    pub sweep: super::sweep_job::SweepJob,
    /// The answer and the key of the remedies it holds.
    answer: Option<(ShownKey, AnswerResult)>,
    /// The plan at the current batch (the answer is rebuilt from it when remedies arrive).
    plan: Option<(AnswerKey, Result<Plan, PlanError>)>,
    /// Planners of the remedy configs, per planner generation: a batch change then only
    /// re-evaluates them.
    remedy_planners: Option<(u64, Arc<RemedyPlanners>)>,
    /// The remedies at the current batch, planned on a worker: a frame that changes the batch
    /// draws the plan at once and the remedies when they arrive (each is a full plan, and a
    /// max-batch search for those that do not fit: several times the plan's own cost).
    pub remedies: super::background_job::BackgroundJob<AnswerKey, Result<Vec<Remedy>, PlanError>>,
    target: GpuTarget,
    /// The "make it fit" search (runs when the plan does not fit, or when asked for).
    pub fit: super::fit_search::FitSearch,
    /// The user asked for the search although the plan fits.
    pub fit_wanted: bool,
    /// The Inference mode's planner and answers (refreshed in that mode only).
    pub infer: super::inference::InferCache,
}

fn fallback_gpu(catalog: &[gpus::Gpu]) -> gpus::Gpu {
    catalog
        .iter()
        .find(|g| g.id == DEFAULT_GPU)
        .or_else(|| catalog.first())
        .cloned()
        .unwrap_or_else(|| gpus::Gpu::detected("24 GiB GPU", Bytes::gib(24), catalog))
}

fn resolve_target(
    state: &PlannerState,
    catalog: &[gpus::Gpu],
    detected: Option<&DetectedGpu>,
) -> GpuTarget {
    let (gpu, kind, capacity) = match (&state.gpu, detected) {
        (GpuChoice::Detected, Some(d)) => {
            let gpu = gpus::Gpu::detected(&d.name, d.total, catalog);
            let capacity = if state.use_free_memory {
                d.free
            } else {
                gpu.memory()
            };
            (gpu, TargetKind::Detected, capacity)
        }
        (GpuChoice::Detected, None) => {
            let g = fallback_gpu(catalog);
            let cap = g.memory();
            (g, TargetKind::Fallback, cap)
        }
        (GpuChoice::Catalog(id), _) => {
            let g = catalog
                .iter()
                .find(|g| &g.id == id)
                .cloned()
                .unwrap_or_else(|| fallback_gpu(catalog));
            let cap = g.memory();
            (g, TargetKind::Catalog, cap)
        }
    };
    GpuTarget {
        gpu,
        kind,
        budget: Budget {
            capacity,
            margin: state.margin(),
        },
    }
}

fn resolve_model(state: &PlannerState, presets: &[Preset]) -> Result<Preset, String> {
    match &state.custom {
        Some(doc) => Preset::from_value(doc).map_err(|e| format!("{e:#}")),
        None => presets
            .iter()
            .find(|p| p.id == state.preset_id)
            .cloned()
            .ok_or_else(|| format!("unknown preset `{}`", state.preset_id)),
    }
}

/// The batches a sweep evaluates: at most `points` (≤ [`SWEEP_POINTS`]) evenly spaced
/// in 1..=top.
pub fn sweep_batches(top: u64, points: u64) -> Vec<u64> {
    let top = top.max(2);
    let n = points.clamp(2, SWEEP_POINTS).min(top);
    let mut out: Vec<u64> = (0..n).map(|i| 1 + (top - 1) * i / (n - 1)).collect();
    out.dedup();
    out
}

/// Top of the sweep: twice the max batch (at least 16), extended to show the current batch.
pub fn sweep_top(max: Option<u64>, batch: u64) -> u64 {
    let base = max.map_or(16, |m| m.saturating_mul(2)).max(16);
    let top = if batch > base {
        batch.next_power_of_two()
    } else {
        base
    };
    top.min(2 * BATCH_LIMIT)
}

fn decimate(points: &[[f64; 2]], bucket: usize) -> Vec<[f64; 2]> {
    if bucket <= 2 {
        return points.to_vec();
    }
    let mut out = Vec::with_capacity(2 * points.len() / bucket + 2);
    for chunk in points.chunks(bucket) {
        let (mut lo, mut hi) = (0, 0);
        for (i, p) in chunk.iter().enumerate() {
            if p[1] < chunk[lo][1] {
                lo = i;
            }
            if p[1] > chunk[hi][1] {
                hi = i;
            }
        }
        let (a, b) = if lo <= hi { (lo, hi) } else { (hi, lo) };
        out.push(chunk[a]);
        if b != a {
            out.push(chunk[b]);
        }
    }
    out
}

/// Splits the timeline into phase runs (each starts at the previous run's last point so
/// the curve stays connected) and decimates it to about [`TIMELINE_POINTS`].
pub fn timeline_segments(points: &[TimelinePoint]) -> Vec<PhaseSegment> {
    let mut segs: Vec<PhaseSegment> = Vec::new();
    for p in points {
        let xy = [f64::from(p.index), p.allocated.as_gib_f64()];
        match segs.last_mut() {
            Some(s) if s.phase == p.phase => s.points.push(xy),
            _ => {
                let mut pts = Vec::new();
                if let Some(&last) = segs.last().and_then(|s| s.points.last()) {
                    pts.push(last);
                }
                pts.push(xy);
                segs.push(PhaseSegment {
                    phase: p.phase,
                    points: pts,
                });
            }
        }
    }
    let bucket = (2 * points.len()).div_ceil(TIMELINE_POINTS);
    if bucket > 2 {
        for s in &mut segs {
            s.points = decimate(&s.points, bucket);
        }
    }
    segs
}

impl Derived {
    /// Parses the built-in presets and the GPU catalog; `detected` comes from NVML.
    pub fn new(detected: Option<DetectedGpu>) -> Derived {
        let (presets, presets_error) = match builtin_presets() {
            Ok(p) => (p, None),
            Err(e) => (Vec::new(), Some(format!("{e:#}"))),
        };
        let catalog = gpus::catalog();
        let target = resolve_target(&PlannerState::default(), &catalog, detected.as_ref());
        Derived {
            presets,
            presets_error,
            catalog,
            detected,
            model: None,
            planner: None,
            planner_key: None,
            blocks: None,
            generation: 0,
            max_batch: None,
            sweep: Default::default(),
            answer: None,
            plan: None,
            remedy_planners: None,
            remedies: Default::default(),
            target,
            fit: Default::default(),
            fit_wanted: false,
            infer: Default::default(),
        }
    }

    /// Brings every cache up to date with `state`; cheap when nothing changed.
    pub fn refresh(&mut self, state: &PlannerState) {
        self.target = resolve_target(state, &self.catalog, self.detected.as_ref());
        let mkey = ModelKey {
            preset_id: state.preset_id.clone(),
            custom: state.custom.clone(),
        };
        if self.model.as_ref().map(|(k, _)| k) != Some(&mkey) {
            let resolved = resolve_model(state, &self.presets);
            self.model = Some((mkey, resolved));
            self.blocks = None;
        }
        if state.mode == super::inference::PlannerMode::Inference {
            let preset = match &self.model {
                Some((_, Ok(p))) => Ok(p),
                Some((_, Err(e))) => Err(e.as_str()),
                None => Err("no model selected"),
            };
            self.infer.refresh(preset, &state.infer, self.target.budget);
        }
        let Some((_, Ok(preset))) = &self.model else {
            self.planner = None;
            self.planner_key = None;
            return;
        };

        let mut cfg = state.config;
        cfg.batch = 1;
        let fresh = self
            .planner_key
            .as_ref()
            .is_some_and(|(p, c)| *c == cfg && p == preset);
        if !fresh {
            self.planner = Some(Planner::new(preset, &cfg).map_err(|e| format!("{e:#}")));
            self.planner_key = Some((preset.clone(), cfg));
            self.generation += 1;
        }
        let Some(Ok(planner)) = &self.planner else {
            return;
        };
        if planner.params_override.is_none() {
            self.blocks = Some(planner.graph.block_count());
        }

        let budget = self.target.budget;
        let gen_ = self.generation;
        if self.max_batch.as_ref().map(|(k, _)| *k) != Some((gen_, budget)) {
            let m = max_batch(planner, budget, BATCH_LIMIT);
            self.max_batch = Some(((gen_, budget), m));
        }
        let max = self
            .max_batch
            .as_ref()
            .and_then(|(_, m)| m.as_ref().ok().copied().flatten());
        let top = sweep_top(max, state.config.batch);
        let points = sweep_points(planner.events.events.len());
        self.sweep
            .ensure((gen_, top), planner, sweep_batches(top, points));

        let batch = state.config.batch;
        if self.remedy_planners.as_ref().map(|(g, _)| *g) != Some(gen_) {
            self.remedy_planners =
                Some((gen_, Arc::new(RemedyPlanners::new(preset, &state.config))));
        }
        let key = (gen_, batch, budget);
        if self.plan.as_ref().map(|(k, _)| *k) != Some(key) {
            self.plan = Some((key, planner.plan(batch)));
        }
        let Some((_, plan)) = &self.plan else {
            return;
        };
        // One planning of the remedies at a time: while the batch is dragged, the batch it
        // settles on is planned when the running one is done (it asks for a frame then),
        // instead of a worker per frame competing for the cores the frames need.
        if let (Ok(plan), Some((_, r))) = (plan, &self.remedy_planners)
            && self.remedies.wants(&key)
            && !self.remedies.running()
        {
            let (r, plan, cfg) = (Arc::clone(r), plan.clone(), state.config);
            // On this one worker: the other cores are the frames' and the search's.
            self.remedies
                .start(key, move || r.evaluate_on(1, &cfg, &plan, budget));
        }
        // The newest remedies of this planner and budget (of this batch once they arrive).
        let shown = self
            .remedies
            .done()
            .filter(|((g, _, b), _)| *g == gen_ && *b == budget);
        let shown_key = shown.map(|(k, _)| *k);
        let failed = self.remedies.failed() == Some(&key);
        if self.answer.as_ref().map(|(k, _)| *k) != Some((key, shown_key, failed)) {
            let max_batch = self.max_batch.as_ref().map_or(Ok(None), |(_, m)| m.clone());
            let remedies_of = match shown_key {
                Some(k) if k == key => RemediesOf::Current,
                _ if failed => RemediesOf::Failed,
                Some((_, b, _)) => RemediesOf::Batch(b),
                None => RemediesOf::Pending,
            };
            let remedies = shown.map_or(Ok(Vec::new()), |(_, r)| r.clone());
            let answer = plan
                .clone()
                .and_then(|plan| {
                    PlanReport::from_parts(ReportParts {
                        planner,
                        plan,
                        gpu: self.target.gpu.clone(),
                        budget,
                        max_batch,
                        remedies,
                    })
                })
                .map(|report| Answer {
                    timeline: timeline_segments(&report.plan.timeline),
                    report,
                    remedies_of,
                })
                .map_err(|e| format!("{e:#}"));
            self.answer = Some(((key, shown_key, failed), answer));
        }
    }

    /// Starts (or collects) the "make it fit" search when the plan does not fit or the user
    /// asked for it. Called once per frame by the planner tab (after [`Derived::refresh`]).
    pub fn refresh_fit(&mut self, state: &PlannerState) {
        let Some((_, Ok(preset))) = &self.model else {
            return;
        };
        let fits = match &self.answer {
            Some((_, Ok(a))) => a.report.fits(),
            _ => return,
        };
        if fits && !self.fit_wanted {
            return;
        }
        let gpu = self.target.gpu.clone();
        let budget = self.target.budget;
        let make = || {
            let mut req = vramlab_core::plan::fit::FitRequest::for_gpu(&gpu, budget.margin);
            req.budget = budget;
            // One core is left to the frames drawn while the search runs.
            req.threads = vramlab_core::par::threads().saturating_sub(1).max(1);
            req.speed = match vramlab_device::bench::profile::load(&gpu.name) {
                Some(p) => vramlab_core::plan::fit::cost::Speed::measured(p),
                None => vramlab_core::plan::fit::cost::Speed::catalog(&gpu),
            };
            req
        };
        self.fit
            .ensure(preset, &state.config, budget, &gpu.id, make);
    }

    /// The model being planned, or why it cannot be built.
    pub fn preset(&self) -> Result<&Preset, &str> {
        match &self.model {
            Some((_, Ok(p))) => Ok(p),
            Some((_, Err(e))) => Err(e),
            None => Err("no model selected"),
        }
    }

    /// The built-in preset the current model is (or was made from).
    pub fn base_preset(&self, state: &PlannerState) -> Option<&Preset> {
        self.presets.iter().find(|p| p.id == state.preset_id)
    }

    /// The model's block count (transformer layers), once a planner has built for it.
    pub fn block_count(&self) -> Option<u32> {
        self.blocks
    }

    pub fn planner(&self) -> Option<&Planner> {
        self.planner.as_ref().and_then(|p| p.as_ref().ok())
    }

    /// The first error on the way to a plan (model, planner, plan), if any.
    pub fn error(&self) -> Option<&str> {
        if let Err(e) = self.preset() {
            return Some(e);
        }
        if let Some(Err(e)) = &self.planner {
            return Some(e);
        }
        if let Some((_, Err(e))) = &self.answer {
            return Some(e);
        }
        None
    }

    /// The plan at the current batch, when everything built.
    pub fn answer(&self) -> Option<&Answer> {
        self.planner()?;
        match &self.answer {
            Some((_, Ok(a))) => Some(a),
            _ => None,
        }
    }

    /// Largest batch that fits (`Ok(None)`: not even batch 1).
    pub fn max_batch(&self) -> Option<&MaxBatch> {
        self.planner()?;
        self.max_batch.as_ref().map(|(_, m)| m)
    }

    /// The memory-vs-batch curve points.
    pub fn sweep(&self) -> &[SweepPoint] {
        match self.planner() {
            Some(_) => self.sweep.points(self.generation),
            None => &[],
        }
    }

    pub fn target(&self) -> &GpuTarget {
        &self.target
    }

    /// How many times the planner was rebuilt (for tests: batch changes must not rebuild).
    pub fn planner_builds(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Refreshes until the remedies' worker is done (a minute at most).
    fn settle(d: &mut Derived, state: &PlannerState) {
        let start = std::time::Instant::now();
        d.refresh(state);
        while d.remedies.running() {
            assert!(start.elapsed().as_secs() < 60, "the remedies never arrived");
            std::thread::sleep(std::time::Duration::from_millis(2));
            d.refresh(state);
        }
        d.refresh(state);
    }

    /// The remedies are planned on a worker: the frame that changes the batch shows the plan
    /// at once with none (first) or the previous batch's remedies, labelled so, and the
    /// batch's own once they arrive: the same list the core plans on the calling thread.
    #[test]
    fn remedies_arrive_from_a_worker_labelled_until_then() {
        let mut d = Derived::new(None);
        let mut state = PlannerState::default();
        state.config.batch = 4;
        d.refresh(&state);
        let a = d.answer().expect("answer");
        assert_eq!(a.remedies_of, RemediesOf::Pending);
        assert!(matches!(&a.report.remedies, Ok(l) if l.is_empty()));
        settle(&mut d, &state);
        let a = d.answer().expect("answer");
        assert_eq!(a.remedies_of, RemediesOf::Current);
        let at4 =
            serde_json::to_string(&a.report.remedies.as_ref().expect("remedies")).expect("json");
        state.config.batch = 8;
        d.refresh(&state);
        let a = d.answer().expect("answer");
        assert_eq!(a.report.plan.config.batch, 8);
        assert_eq!(a.remedies_of, RemediesOf::Batch(4));
        settle(&mut d, &state);
        let a = d.answer().expect("answer");
        assert_eq!(a.remedies_of, RemediesOf::Current);
        // What the core computes on this thread for batch 8.
        let planner = d.planner().expect("planner");
        let plan = planner.plan(8).expect("plan");
        let want = RemedyPlanners::new(d.preset().expect("preset"), &state.config)
            .evaluate(&state.config, &plan, d.target.budget)
            .expect("remedies");
        let got = a.report.remedies.as_ref().expect("remedies");
        assert_eq!(
            serde_json::to_string(got).expect("json"),
            serde_json::to_string(&want).expect("json")
        );
        assert_ne!(serde_json::to_string(got).expect("json"), at4);
    }

    #[test]
    fn sweeps_stay_small_and_cover_the_range() {
        assert_eq!(sweep_points(1), SWEEP_POINTS);
        assert_eq!(sweep_points(1_000_000), MIN_SWEEP_POINTS);
        for top in [2, 16, 100, 128, 129, 5000, 2 * BATCH_LIMIT] {
            let b = sweep_batches(top, SWEEP_POINTS);
            assert!(b.len() as u64 <= SWEEP_POINTS, "{top}: {}", b.len());
            assert_eq!(b.first(), Some(&1));
            assert_eq!(b.last(), Some(&top));
            assert!(b.windows(2).all(|w| w[0] < w[1]));
        }
    }

    #[test]
    fn sweep_top_is_twice_the_max_and_shows_the_batch() {
        assert_eq!(sweep_top(Some(12), 8), 24);
        assert_eq!(sweep_top(None, 1), 16);
        assert_eq!(sweep_top(Some(12), 100), 128);
        assert_eq!(sweep_top(Some(BATCH_LIMIT), 1), 2 * BATCH_LIMIT);
    }

    #[test]
    fn decimation_keeps_the_peak() {
        let pts: Vec<[f64; 2]> = (0..10_000)
            .map(|i| {
                [
                    f64::from(i),
                    if i == 4321 { 99.0 } else { f64::from(i % 7) },
                ]
            })
            .collect();
        let d = decimate(&pts, 10);
        assert!(d.len() <= 2 * pts.len() / 10 + 2);
        assert!(d.iter().any(|p| p[1] == 99.0));
        assert!(d.windows(2).all(|w| w[0][0] < w[1][0]));
    }
}
