//! "Make it fit": search combinations of remedies (precision, checkpointing, a smaller
//! micro-batch with accumulation keeping the effective batch, optimizer, LoRA rank and
//! targets, the loop shape, expandable segments) and return those that fit, ranked by
//! predicted time per sample.
//!
//! The search stays interactive by pruning: for every precision × fine-tuning setting the
//! leanest combination is planned first, and a combination whose micro-batch 1 does not fit
//! kills every combination that needs at least as much memory ([`axes::Knobs::needs_at_least`]);
//! candidates are then planned in order of predicted time (cheap: a graph walk), one that
//! only adds remedies to a fitting, no slower one is dropped unplanned, and at most
//! [`FitRequest::max_plans`] are planned. Batch search per candidate reuses its events
//! ([`super::search::max_batch`], bounded by the effective batch).
//!
//! On more than one GPU the strategy is an axis too ([`strategy`]): the user's strategy and
//! the others its settings allow. Strategies tie in time (no communication term), so a
//! switch is offered only where the user's strategy with no more changes does not fit; a
//! dead combination kills only its own strategy's; [`STRATEGY_RESERVE`] plans per other
//! strategy are kept back and spent, after the main pass, on each strategy that has no
//! candidate yet.

pub mod axes;
pub mod cost;
pub mod strategy;
mod window;

use std::collections::HashMap;

use serde::Serialize;

use self::axes::{Axes, Knobs, change_words, cost_words, finetune_words};
use self::cost::{CandidateTime, Speed, step_time};
use super::config::{MAX_ACCUM, TrainConfig};
use super::policy::ParamPolicy;
use super::search::{Budget, fits, max_batch};
use super::{Gpu, PlanError, Planner};
use crate::model::families::transformer::AttnImpl;
use crate::model::{Graph, Preset};
use crate::units::Bytes;

/// What to search for.
#[derive(Debug, Clone)]
pub struct FitRequest {
    pub budget: Budget,
    /// Samples per optimizer step to keep (micro-batch × accumulation); `None` = the user's.
    pub effective_batch: Option<u64>,
    /// The card (bf16 support); `None` for a bare budget.
    pub gpu: Option<Gpu>,
    pub speed: Speed,
    /// Candidates to return at most.
    pub top: usize,
    /// Plans (event generation + batch search) to run at most.
    pub max_plans: usize,
    /// Threads the search plans on, its own included ([`crate::par::threads`] by default;
    /// the GUI leaves a core to its frames). The answer is the same for any number.
    pub threads: usize,
}

impl FitRequest {
    /// A request for `gpu` at `margin` with its catalog speed, top 10, 160 plans at most.
    pub fn for_gpu(gpu: &Gpu, margin: f64) -> FitRequest {
        FitRequest {
            budget: Budget {
                capacity: gpu.memory(),
                margin,
            },
            effective_batch: None,
            gpu: Some(gpu.clone()),
            speed: Speed::catalog(gpu),
            top: 10,
            max_plans: 160,
            threads: crate::par::threads(),
        }
    }
}

/// One configuration that fits.
#[derive(Debug, Clone, Serialize)]
pub struct FitCandidate {
    /// The configuration to run (micro-batch and accumulation included).
    pub config: TrainConfig,
    /// What it changes against the user's configuration, in words (empty: the user's own).
    pub changes: Vec<String>,
    /// What the changes cost besides memory.
    pub costs: Vec<String>,
    pub micro_batch: u64,
    pub accum: u64,
    /// The largest micro-batch that fits (up to the effective batch).
    pub max_micro_batch: u64,
    pub peak_allocated: Bytes,
    /// Peak reserved on this GPU (the cache releases segments before an OOM).
    pub peak_reserved: Bytes,
    pub nvidia_smi: Bytes,
    pub trainable_params: u64,
    pub time: CandidateTime,
    /// Whether this is the user's configuration as given.
    pub is_user_config: bool,
}

impl FitCandidate {
    /// "LoRA r8 on attn · bf16 · ckpt" — the settings that tell candidates apart.
    pub fn summary(&self) -> String {
        if self.changes.is_empty() {
            return "as configured".into();
        }
        self.changes.join("; ")
    }
}

/// The answer.
#[derive(Debug, Clone, Serialize)]
pub struct FitReport {
    pub effective_batch: u64,
    /// Ranked: the user's configuration first when it fits, then by time per sample.
    pub candidates: Vec<FitCandidate>,
    /// Why nothing fits (empty list), in words.
    pub reason: Option<String>,
    /// Combinations in the search space.
    pub combinations: usize,
    /// Combinations planned (events + batch search).
    pub planned: usize,
    /// Combinations dropped without planning: dead by monotonicity.
    pub pruned_dead: usize,
    /// Combinations dropped without planning: a subset of their changes fits, no slower.
    pub dominated: usize,
    /// Where the step times come from.
    pub speed_source: String,
}

/// Graph and policy per (precision, attention, fine-tuning): what timing walks.
type GraphKey = (
    super::Precision,
    super::Attention,
    super::finetune_mode::FineTune,
);

struct Search<'a> {
    preset: &'a Preset,
    user_cfg: TrainConfig,
    user: Knobs,
    eff: u64,
    req: &'a FitRequest,
    graphs: HashMap<GraphKey, (Graph, ParamPolicy)>,
    /// Step times per graph, checkpointing and micro-batch (the optimizer, loop shape and
    /// allocator do not change them).
    times: HashMap<(GraphKey, bool, u64), CandidateTime>,
    dead: Vec<Knobs>,
    planned: usize,
    /// The leanest plan seen that did not fit: (nvidia-smi at micro-batch 1, settings,
    /// nvidia-smi at the upper edge of its mode's measured reserved band: what the verdict
    /// compares).
    closest: Option<(Bytes, Knobs, Bytes)>,
    /// Planners whose allocator twin (the same knobs, the other `expandable` setting) has
    /// not been planned yet, keyed by their knobs with `expandable` false ([`Search::planner`]).
    twins: HashMap<Knobs, Planner>,
    tuning: Tuning,
}

/// A planned combination that fits.
struct Fitting {
    knobs: Knobs,
    micro: u64,
    max_micro: u64,
    planner: Planner,
    /// Its figures as a candidate, when the pass that planned it wanted them
    /// ([`Figures::of`]).
    figures: Option<Figures>,
}

/// A candidate's memory figures, at its own micro-batch and accumulation.
#[derive(Debug, Clone, Copy)]
struct Figures {
    peaks: super::eval::Peaks,
    /// Peak reserved on the GPU (the cache releases segments before an OOM).
    reserved: Bytes,
    context: Bytes,
    trainable: u64,
}

impl Figures {
    fn of(
        t: &Task<'_>,
        knobs: &Knobs,
        micro: u64,
        planner: &Planner,
    ) -> Result<Figures, PlanError> {
        let config = t.config(knobs, micro);
        // The search planned the knobs at micro-batch 1, so with the whole effective batch
        // as accumulation; the candidate's figures are those of its own accumulation (one
        // step frees the gradients before its forward: `plan` of the candidate agrees).
        // The events depend on the accumulation only through whether it is 1 (gradients
        // freed before the forward) or more (`sim::Sim::step` runs at most two micro-steps).
        let own;
        let planner = if config.accum.min(2) == planner.config.accum.min(2) {
            planner
        } else {
            own = Planner::new(t.preset, &config)?;
            &own
        };
        let cap = t.req.budget.allocator_cap(planner.context);
        let peaks = planner.peaks(micro)?;
        let reserved = planner
            .reserved_within_given(micro, cap, peaks.reserved)?
            .unwrap_or(peaks.reserved);
        Ok(Figures {
            peaks,
            reserved,
            context: planner.context,
            trainable: planner.trainable,
        })
    }
}

impl<'a> Search<'a> {
    fn graph(&mut self, k: &Knobs) -> Result<&(Graph, ParamPolicy), PlanError> {
        let key = (k.precision, k.attention, k.finetune);
        if !self.graphs.contains_key(&key) {
            let size = self
                .user_cfg
                .size
                .unwrap_or_else(|| self.preset.default_size());
            let attn = match k.attention {
                super::Attention::Eager => AttnImpl::Eager,
                super::Attention::Sdpa => AttnImpl::Sdpa,
            };
            let g = self.preset.build_full(
                size,
                self.user_cfg.target_seq,
                attn,
                self.user_cfg.moe_imbalance,
            )?;
            let gp = super::finetune::apply(g, &k.finetune, k.precision)?;
            self.graphs.insert(key, gp);
        }
        self.graphs
            .get(&key)
            .ok_or(PlanError::Overflow("fit graph cache"))
    }

    /// Time per sample of `k` at micro-batch `micro` (accumulation to the effective batch).
    fn time(&mut self, k: &Knobs, micro: u64) -> Result<CandidateTime, PlanError> {
        let key = (
            (k.precision, k.attention, k.finetune),
            k.checkpointing,
            micro,
        );
        if let Some(t) = self.times.get(&key) {
            return Ok(*t);
        }
        let cfg = self.config(k, micro);
        let speed = self.req.speed.clone();
        let (g, p) = self.graph(k)?;
        let t = step_time(g, p, &cfg, &speed);
        self.times.insert(key, t);
        Ok(t)
    }

    fn config(&self, k: &Knobs, micro: u64) -> TrainConfig {
        self.task().config(k, micro)
    }

    /// A combination is presumed dead when it needs at least the memory of a dead one and
    /// its verdict is judged with a band at least as wide (the error band differs per
    /// fine-tuning mode and strategy, so a leaner combination in a wider band can fail where
    /// a heavier one in a narrower band fits).
    fn presumed_dead(&self, k: &Knobs) -> bool {
        self.dead
            .iter()
            .any(|d| k.needs_at_least(d) && self.band_factor(k) >= self.band_factor(d))
    }

    /// The factor from planned reserved to the upper edge of `k`'s measured band.
    fn band_factor(&self, k: &Knobs) -> f64 {
        let key = super::band::ModeKey {
            family: crate::model::hf::family_label(self.preset),
            finetune: k.finetune.mode,
            strategy: k.strategy,
        };
        super::band::ErrorBand::of(&key).reserved.upper_factor()
    }

    /// The events of `k`'s allocator twin (the same knobs, the other `expandable` setting)
    /// when that was planned and its twin has not been yet: the allocator settings do not
    /// change the events, only how they are replayed. Taken out of the cache: each key has
    /// two allocator settings, so the cache holds only plans whose twin is still to come.
    fn take_twin(&mut self, k: &Knobs) -> Option<Planner> {
        self.twins.remove(&twin_key(k))
    }

    /// Plans `k` on this thread: `None` when micro-batch 1 does not fit (recorded as dead).
    fn plan(&mut self, k: &Knobs) -> Result<Option<Fitting>, PlanError> {
        let twin = self.take_twin(k);
        let closest = self.closest.map(|(smi, _, _)| smi);
        let planned = plan_one(&self.task(), k, twin, closest)?;
        Ok(self.record(planned))
    }

    /// What [`plan_one`] needs of the search (shared with the threads of [`window`]).
    fn task(&self) -> Task<'a> {
        Task {
            preset: self.preset,
            req: self.req,
            user_cfg: self.user_cfg,
            eff: self.eff,
            stop_early: self.tuning.stop_early,
            figures: false,
            only_alive: false,
        }
    }

    /// Records what planning a combination found, in the order the combinations were
    /// planned: the plans counted, the dead, the closest miss, the twin cache.
    fn record(&mut self, p: Planned) -> Option<Fitting> {
        let Planned {
            knobs,
            outcome,
            planner,
            fresh,
        } = p;
        if matches!(outcome, Outcome::Invalid) {
            return None;
        }
        self.planned += 1;
        if fresh && let Some(pl) = &planner {
            self.twins.insert(twin_key(&knobs), pl.clone());
        }
        match outcome {
            Outcome::Invalid | Outcome::TooMuchAccum | Outcome::Alive => None,
            Outcome::Dead { closest } => {
                // Evaluated when it could beat the closest miss known when it was planned;
                // compared with the closest miss known now (at most that one).
                if let Some((smi, upper_smi)) = closest
                    && self.closest.is_none_or(|(b, _, _)| smi < b)
                {
                    self.closest = Some((smi, knobs, upper_smi));
                }
                self.dead.push(knobs);
                None
            }
            Outcome::Fits {
                micro,
                max_micro,
                figures,
            } => planner.map(|planner| Fitting {
                knobs,
                micro,
                max_micro,
                planner,
                figures,
            }),
        }
    }

    /// Puts back the twin a plan computed ahead and then not needed had taken from the cache
    /// ([`window`]): the cache is as if the plan had not been made.
    fn untake(&mut self, p: Planned) {
        if !p.fresh
            && let Some(pl) = p.planner
        {
            self.twins.insert(twin_key(&p.knobs), pl);
        }
    }

    fn candidate(&mut self, f: Fitting) -> Result<FitCandidate, PlanError> {
        let config = self.config(&f.knobs, f.micro);
        let fig = match f.figures {
            Some(fig) => fig,
            None => Figures::of(&self.task(), &f.knobs, f.micro, &f.planner)?,
        };
        let (peaks, reserved) = (fig.peaks, fig.reserved);
        let time = self.time(&f.knobs, f.micro)?;
        let mut changes = change_words(&f.knobs, &self.user);
        if config.batch != self.user_cfg.batch || config.accum != self.user_cfg.accum {
            changes.push(format!(
                "micro-batch {} × accumulation {} → {} × {} (effective batch {})",
                self.user_cfg.batch, self.user_cfg.accum, config.batch, config.accum, self.eff
            ));
        }
        let mut costs = cost_words(&f.knobs, &self.user);
        costs.extend(strategy::cost_words(
            &self.user_cfg.distributed,
            f.knobs.strategy,
        ));
        if f.knobs.checkpointing && !self.user.checkpointing && time.step_ms > 0.0 {
            costs.insert(
                0,
                crate::plan::timing::checkpointing_cost(Some(
                    time.recompute_ms / (time.step_ms - time.recompute_ms).max(1e-9),
                )),
            );
        }
        let is_user_config = changes.is_empty();
        Ok(FitCandidate {
            config,
            changes,
            costs,
            micro_batch: config.batch,
            accum: config.accum,
            max_micro_batch: f.max_micro,
            peak_allocated: peaks.allocated,
            peak_reserved: reserved,
            nvidia_smi: Bytes(reserved.0.saturating_add(fig.context.0)),
            trainable_params: fig.trainable,
            time,
            is_user_config,
        })
    }
}

/// The twin cache's key of `k`: its knobs with `expandable` false.
fn twin_key(k: &Knobs) -> Knobs {
    Knobs {
        expandable: false,
        ..*k
    }
}

/// What planning one combination needs of the search, shared by the threads that plan
/// several at once ([`window`]).
#[derive(Clone, Copy)]
struct Task<'a> {
    preset: &'a Preset,
    req: &'a FitRequest,
    user_cfg: TrainConfig,
    eff: u64,
    stop_early: bool,
    /// Whether a combination that fits gets its candidate figures where it is planned (on
    /// a worker): the passes whose plans become candidates.
    figures: bool,
    /// Whether only dead or alive is asked (the seeds): no max-batch search, no micro-batch.
    only_alive: bool,
}

impl Task<'_> {
    fn config(&self, k: &Knobs, micro: u64) -> TrainConfig {
        let mut c = k.apply(&self.user_cfg);
        c.batch = micro;
        c.accum = (self.eff / micro.max(1)).max(1);
        c
    }
}

/// What planning a combination found.
enum Outcome {
    /// Its config does not validate (free: it fails before any graph is built, so it does
    /// not count as planned).
    Invalid,
    /// Micro-batch 1 does not fit. `closest`: its nvidia-smi at micro-batch 1 and at the
    /// upper edge of its band, evaluated when it could beat the closest miss known when it
    /// was planned.
    Dead { closest: Option<(Bytes, Bytes)> },
    /// It fits, but the effective batch needs more accumulation steps than a config allows.
    TooMuchAccum,
    /// Micro-batch 1 fits (asked only whether it does: [`Task::only_alive`]).
    Alive,
    Fits {
        micro: u64,
        max_micro: u64,
        figures: Option<Figures>,
    },
}

struct Planned {
    knobs: Knobs,
    outcome: Outcome,
    /// Its planner, unless the config did not validate or the generation stopped early.
    planner: Option<Planner>,
    /// Whether the planner was built here rather than taken from the twin cache.
    fresh: bool,
}

/// Plans `k` (its events from `twin` when given) without touching the search's state, so
/// that several combinations can be planned at once; [`Search::record`] records the result.
/// `closest`: the closest miss's nvidia-smi known now.
///
/// A generation stops early ([`Planner::new_unless_above`]) once its bytes live at
/// micro-batch 1 pass both the verdict's cap and the closest miss's nvidia-smi less the
/// context: such a combination is dead as its whole plan would have shown (a replay that
/// reserves more than the cap fails under it) and its nvidia-smi is above the closest
/// miss's, so the answer is the same.
fn plan_one(
    t: &Task<'_>,
    k: &Knobs,
    twin: Option<Planner>,
    closest: Option<Bytes>,
) -> Result<Planned, PlanError> {
    let cfg = t.config(k, 1);
    let budget = t.req.budget;
    let done = |outcome, planner, fresh| Planned {
        knobs: *k,
        outcome,
        planner,
        fresh,
    };
    let (planner, fresh) = match twin {
        Some(mut twin) => {
            twin.config.allocator = cfg.allocator;
            (twin, false)
        }
        None => {
            let stop_early = t.stop_early;
            let bound = |context: Bytes, band: &super::band::ErrorBand| {
                let cap = band.reserved.cap_for_upper(budget.allocator_cap(context)).0;
                closest
                    .filter(|_| stop_early)
                    .map_or(u64::MAX, |smi| cap.max(smi.0.saturating_sub(context.0)))
            };
            match Planner::new_unless_above(t.preset, &cfg, bound) {
                Ok(Some(p)) => (p, true),
                Ok(None) => return Ok(done(Outcome::Dead { closest: None }, None, true)),
                Err(PlanError::Field { .. } | PlanError::Unknown { .. }) => {
                    return Ok(done(Outcome::Invalid, None, true));
                }
                Err(e) => return Err(e),
            }
        }
    };
    // A seed only tells dead from alive: whether micro-batch 1 fits, which is what the
    // max-batch search answers `None` to (it reaches batch 1 only when every larger batch
    // failed, or when the live bytes alone pass the cap, which makes batch 1 fail too).
    let max_micro = if t.only_alive {
        fits(&planner, budget, 1)?.then_some(1)
    } else {
        max_batch(&planner, budget, t.eff)?
    };
    let Some(max_micro) = max_micro else {
        // The closest miss, for the answer when nothing fits. The envelope plus the
        // context is a lower bound of nvidia-smi at micro-batch 1 (reserved ≥ allocated
        // ≥ the measured step's unrounded live bytes), so a plan that cannot beat the
        // closest one so far is not evaluated.
        let lower = Bytes(
            planner
                .live_peaks()
                .at(1)
                .0
                .saturating_add(planner.context.0),
        );
        let mut miss = None;
        if closest.is_none_or(|b| lower < b) {
            let p1 = planner.peaks(1)?;
            if closest.is_none_or(|b| p1.nvidia_smi < b) {
                let upper = planner.band().reserved.upper(p1.reserved);
                miss = Some((
                    p1.nvidia_smi,
                    Bytes(upper.0.saturating_add(planner.context.0)),
                ));
            }
        }
        return Ok(done(Outcome::Dead { closest: miss }, Some(planner), fresh));
    };
    if t.only_alive {
        return Ok(done(Outcome::Alive, Some(planner), fresh));
    }
    // The user's micro-batch when it fits and divides the effective batch, else the
    // largest divisor of the effective batch that fits.
    let ub = t.user_cfg.batch;
    let micro = if ub <= max_micro && t.eff.is_multiple_of(ub) {
        ub
    } else {
        let mut m = max_micro.min(t.eff);
        loop {
            if m <= 1 {
                break 1;
            }
            if t.eff.is_multiple_of(m)
                && t.eff / m <= MAX_ACCUM
                && (m == max_micro || fits(&planner, budget, m)?)
            {
                break m;
            }
            m -= 1;
        }
    };
    let outcome = if t.eff / micro > MAX_ACCUM {
        Outcome::TooMuchAccum
    } else {
        let figures = if t.figures {
            Some(Figures::of(t, k, micro, &planner)?)
        } else {
            None
        };
        Outcome::Fits {
            micro,
            max_micro,
            figures,
        }
    };
    Ok(done(outcome, Some(planner), fresh))
}

/// Searches the remedies for `user` on `req`'s GPU.
pub fn fit(preset: &Preset, user: &TrainConfig, req: &FitRequest) -> Result<FitReport, PlanError> {
    fit_with(
        preset,
        user,
        req,
        Tuning {
            width: req.threads.max(1),
            stop_early: true,
        },
    )
}

/// How the search gets its answer, not what the answer is: [`fit`] gives the same report
/// under every tuning (tested).
#[derive(Debug, Clone, Copy)]
struct Tuning {
    /// Combinations planned at a time ([`window`]): this thread and `width - 1` workers.
    width: usize,
    /// Whether a generation stops once the combination is known dead and not the closest
    /// miss ([`plan_one`]).
    stop_early: bool,
}

fn fit_with(
    preset: &Preset,
    user: &TrainConfig,
    req: &FitRequest,
    tuning: Tuning,
) -> Result<FitReport, PlanError> {
    // The workers live for the whole search ([`crate::par::Workers`]).
    std::thread::scope(|scope| {
        let workers = crate::par::Workers::new(scope, tuning.width.saturating_sub(1));
        search(preset, user, req, tuning, &workers)
    })
}

fn search<'a: 'w, 'w>(
    preset: &'a Preset,
    user: &TrainConfig,
    req: &'a FitRequest,
    tuning: Tuning,
    workers: &crate::par::Workers<'w>,
) -> Result<FitReport, PlanError> {
    user.validate()?;
    let eff = req
        .effective_batch
        .unwrap_or_else(|| user.effective_batch());
    if eff == 0 {
        return Err(PlanError::Field {
            field: "effective_batch",
            reason: "must be at least 1".into(),
        });
    }
    let mut axes = Axes::new(user, req.gpu.as_ref());
    let mut s = Search {
        preset,
        user_cfg: *user,
        user: Knobs::of(user),
        eff,
        req,
        graphs: HashMap::new(),
        times: HashMap::new(),
        dead: Vec::new(),
        planned: 0,
        closest: None,
        twins: HashMap::new(),
        tuning,
    };
    // Fine-tuning settings this model cannot take are not searched: LoRA on the attention
    // projections of a model that has none (a CNN; a model type whose module names are not
    // LoRA targets yet) fails to build, and failed the whole search before.
    let mut kept = Vec::with_capacity(axes.finetune.len());
    for ft in std::mem::take(&mut axes.finetune) {
        let k = Knobs {
            finetune: ft,
            ..s.user
        };
        match s.graph(&k) {
            Ok(_) => kept.push(ft),
            Err(PlanError::Field { .. } | PlanError::Unknown { .. }) if ft != user.finetune => {}
            Err(e) => return Err(e),
        }
    }
    axes.finetune = kept;
    let all = axes.all();
    let mut out: Vec<FitCandidate> = Vec::new();
    let mut accepted: Vec<(Knobs, f64)> = Vec::new();
    // The user's own settings first: returned first when they fit.
    let own = s.user;
    if let Some(f) = s.plan(&own)? {
        let c = s.candidate(f)?;
        accepted.push((s.user, c.time.ms_per_sample));
        out.push(c);
    }
    // On more than one GPU, plans kept back for the other strategies (at most a quarter of
    // the budget); the seeds take at most half of the rest.
    let others = axes.strategy.len().saturating_sub(1);
    let reserve = (STRATEGY_RESERVE * others).min(req.max_plans / 4);
    let main_budget = req.max_plans - reserve;
    seed_dead(&mut s, &axes, main_budget / 2, workers)?;
    let mut ranked: Vec<(f64, u32, Knobs)> = Vec::with_capacity(all.len());
    // Combinations the model cannot take (LoRA's attention targets on a convolutional
    // network) are left out, as `plan` leaves out a config that does not validate.
    let mut invalid = 0usize;
    for k in &all {
        if *k == s.user || s.presumed_dead(k) {
            continue;
        }
        let t = match s.time(k, 1) {
            Ok(t) => t.ms_per_sample,
            Err(PlanError::Field { .. } | PlanError::Unknown { .. }) => {
                invalid += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        ranked.push((t, k.changed(&s.user).count_ones(), *k));
    }
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (pruned_dead, dominated) = (all.len().saturating_sub(ranked.len() + 1 + invalid), 0usize);
    let mut main = MainPass {
        ranked: &ranked,
        top: req.top.max(1),
        budget: main_budget,
        out,
        accepted,
        pruned_dead,
        dominated,
        skipped: Vec::new(),
    };
    window::run(&mut s, &mut main, workers)?;
    let MainPass {
        mut out,
        mut accepted,
        pruned_dead,
        dominated,
        skipped,
        ..
    } = main;
    // Every other strategy that has no candidate yet gets its fastest combinations that are
    // neither dead nor dominated, up to the plans kept back (possibly past `top`: one each),
    // among those whose twin under the user's strategy is known not to fit (a switch nobody
    // needs is not offered).
    for &st in axes.strategy.iter().skip(1) {
        if out.iter().any(|c| c.config.distributed.strategy == st) {
            continue;
        }
        for &(t, k) in skipped.iter().filter(|(_, k)| k.strategy == st) {
            if s.planned >= req.max_plans {
                break;
            }
            let twin = Knobs {
                strategy: s.user.strategy,
                ..k
            };
            if s.presumed_dead(&k)
                || !s.presumed_dead(&twin)
                || is_dominated(&accepted, &k, t, &s.user)
            {
                continue;
            }
            if let Some(f) = s.plan(&k)? {
                let c = s.candidate(f)?;
                accepted.push((k, c.time.ms_per_sample));
                out.push(c);
                break;
            }
        }
    }
    // The user's configuration stays first; the rest by time per sample, fewer changes first.
    let user_first = out.first().is_some_and(|c| c.is_user_config);
    let rest = if user_first { 1 } else { 0 };
    out[rest..].sort_by(|a, b| {
        a.time
            .ms_per_sample
            .total_cmp(&b.time.ms_per_sample)
            .then(a.changes.len().cmp(&b.changes.len()))
    });
    let reason = out.is_empty().then(|| nothing_fits(&s, &axes));
    Ok(FitReport {
        effective_batch: eff,
        candidates: out,
        reason,
        combinations: all.len(),
        planned: s.planned,
        pruned_dead,
        dominated,
        speed_source: req.speed.source(),
    })
}

/// Plans kept back per other strategy on more than one GPU (out of
/// [`FitRequest::max_plans`], at most a quarter of it), so that a search whose budget goes
/// to the user's strategy still tries the others.
pub const STRATEGY_RESERVE: usize = 2;

/// Whether an accepted candidate makes a subset of `k`'s changes and is no slower than `t`.
fn is_dominated(accepted: &[(Knobs, f64)], k: &Knobs, t: f64, user: &Knobs) -> bool {
    let tol = t * 1e-9;
    accepted
        .iter()
        .any(|(a, at)| a.changes_subset_of(k, user) && *at <= t + tol)
}

/// Plans the leanest combination of every precision × attention × fine-tuning setting
/// (leanest fine-tuning first: the later modes, attention targets, small ranks) and, on more
/// than one GPU, every strategy (the user's first), so that whole groups die before any of
/// them is timed.
fn seed_dead<'a: 'w, 'w>(
    s: &mut Search<'a>,
    axes: &Axes,
    budget: usize,
    workers: &crate::par::Workers<'w>,
) -> Result<(), PlanError> {
    let mut finetunes = axes.finetune.clone();
    finetunes.sort_by_key(|ft| {
        (
            std::cmp::Reverse(axes::mode_rank(ft.mode)),
            ft.lora_targets != crate::plan::finetune::LoraTargets::Attn,
            ft.lora_rank,
        )
    });
    let mut list = Vec::new();
    for &precision in &axes.precision {
        for &attention in &axes.attention {
            for &finetune in &finetunes {
                for &strategy in &axes.strategy {
                    list.push(axes.leanest(precision, attention, finetune, strategy));
                }
            }
        }
    }
    window::run(s, &mut SeedPass { list, budget }, workers)
}

/// The seeds: each planned unless presumed dead, while the budget lasts.
struct SeedPass {
    list: Vec<Knobs>,
    budget: usize,
}

impl window::Pass for SeedPass {
    fn len(&self) -> usize {
        self.list.len()
    }

    fn knobs(&self, i: usize) -> Knobs {
        self.list[i]
    }

    fn skip(&mut self, s: &Search<'_>, i: usize, _count: bool) -> bool {
        s.presumed_dead(&self.list[i]) || s.planned >= self.budget
    }

    fn candidates(&self) -> bool {
        false
    }

    fn only_alive(&self) -> bool {
        true
    }

    fn planned(
        &mut self,
        _: &mut Search<'_>,
        _: usize,
        _: Option<Fitting>,
    ) -> Result<(), PlanError> {
        Ok(())
    }
}

/// The ranked combinations: planned fastest first until `top` fit or the budget is spent,
/// skipping the dead and the dominated.
struct MainPass<'r> {
    ranked: &'r [(f64, u32, Knobs)],
    top: usize,
    budget: usize,
    out: Vec<FitCandidate>,
    accepted: Vec<(Knobs, f64)>,
    pruned_dead: usize,
    dominated: usize,
    /// Left for want of budget (or `top` reached): the other strategies' reserve.
    skipped: Vec<(f64, Knobs)>,
}

impl window::Pass for MainPass<'_> {
    fn len(&self) -> usize {
        self.ranked.len()
    }

    fn knobs(&self, i: usize) -> Knobs {
        self.ranked[i].2
    }

    fn candidates(&self) -> bool {
        true
    }

    fn only_alive(&self) -> bool {
        false
    }

    fn skip(&mut self, s: &Search<'_>, i: usize, count: bool) -> bool {
        let (t, _, k) = self.ranked[i];
        if self.out.len() >= self.top || s.planned >= self.budget {
            if count {
                self.skipped.push((t, k));
            }
            return true;
        }
        if s.presumed_dead(&k) {
            if count {
                self.pruned_dead += 1;
            }
            return true;
        }
        if is_dominated(&self.accepted, &k, t, &s.user) {
            if count {
                self.dominated += 1;
            }
            return true;
        }
        false
    }

    fn planned(
        &mut self,
        s: &mut Search<'_>,
        i: usize,
        f: Option<Fitting>,
    ) -> Result<(), PlanError> {
        if let Some(f) = f {
            let c = s.candidate(f)?;
            self.accepted.push((self.ranked[i].2, c.time.ms_per_sample));
            self.out.push(c);
        }
        Ok(())
    }
}

fn nothing_fits(s: &Search<'_>, axes: &Axes) -> String {
    let usable = s.req.budget.usable();
    match s.closest {
        Some((smi, k, upper_smi)) => {
            let mut settings = vec![k.precision.to_string(), finetune_words(&k.finetune)];
            settings.push(format!("optimizer {}", k.optimizer));
            if k.checkpointing {
                settings.push("checkpointing".into());
            }
            if axes.strategy.len() > 1 {
                settings.push(format!(
                    "{} ×{}",
                    k.strategy.label(),
                    s.user_cfg.distributed.world()
                ));
            }
            // Within the usable memory as planned, but not at the upper edge of the band
            // the verdict is judged at: say that, not "0 B short".
            let needs = if smi <= usable {
                format!(
                    "{smi} at micro-batch 1 as planned, {upper_smi} at the upper edge of its \
                     measured error band (what the verdict compares), {} short",
                    Bytes(upper_smi.0.saturating_sub(usable.0))
                )
            } else {
                format!(
                    "{smi} at micro-batch 1, {} short",
                    Bytes(smi.0.saturating_sub(usable.0))
                )
            };
            let searched = if s.planned >= s.req.max_plans {
                format!(
                    "{} of {} combinations planned: the search stopped at its limit of {} plans, \
                     so a combination it did not reach may fit",
                    s.planned,
                    axes.all().len(),
                    s.req.max_plans
                )
            } else {
                format!(
                    "{} of {} combinations planned, the others ruled out by it",
                    s.planned,
                    axes.all().len()
                )
            };
            format!(
                "nothing fits in {usable} usable: the leanest combination searched ({}) needs \
                 {needs} ({searched})",
                settings.join(", ")
            )
        }
        None => format!(
            "nothing fits in {usable} usable (the search stopped after {} plans)",
            s.planned
        ),
    }
}

#[cfg(test)]
mod tests;
