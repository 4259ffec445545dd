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
}

/// A planned combination that fits.
struct Fitting {
    knobs: Knobs,
    micro: u64,
    max_micro: u64,
    planner: Planner,
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
        let mut c = k.apply(&self.user_cfg);
        c.batch = micro;
        c.accum = (self.eff / micro.max(1)).max(1);
        c
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

    /// The planner of `cfg`: the events of its allocator twin when that was planned (the
    /// allocator settings do not change the events, only how they are replayed), else built.
    /// A twin is taken out of the cache on its second use: each key has two allocator
    /// settings, so the cache holds only plans whose twin is still to come.
    fn planner(&mut self, k: &Knobs, cfg: &TrainConfig) -> Result<Planner, PlanError> {
        let key = Knobs {
            expandable: false,
            ..*k
        };
        if let Some(mut twin) = self.twins.remove(&key) {
            twin.config.allocator = cfg.allocator;
            return Ok(twin);
        }
        let p = Planner::new(self.preset, cfg)?;
        self.twins.insert(key, p.clone());
        Ok(p)
    }

    /// Plans `k`: `None` when micro-batch 1 does not fit (recorded as dead).
    fn plan(&mut self, k: &Knobs) -> Result<Option<Fitting>, PlanError> {
        let cfg = self.config(k, 1);
        let planner = match self.planner(k, &cfg) {
            Ok(p) => p,
            // A combination whose config does not validate is skipped (free: it fails before
            // any graph is built, so it does not count as planned).
            Err(PlanError::Field { .. } | PlanError::Unknown { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.planned += 1;
        let budget = self.req.budget;
        let Some(max_micro) = max_batch(&planner, budget, self.eff)? else {
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
            if self.closest.is_none_or(|(b, _, _)| lower < b) {
                let p1 = planner.peaks(1)?;
                if self.closest.is_none_or(|(b, _, _)| p1.nvidia_smi < b) {
                    let upper = planner.band().reserved.upper(p1.reserved);
                    let upper_smi = Bytes(upper.0.saturating_add(planner.context.0));
                    self.closest = Some((p1.nvidia_smi, *k, upper_smi));
                }
            }
            self.dead.push(*k);
            return Ok(None);
        };
        // The user's micro-batch when it fits and divides the effective batch, else the
        // largest divisor of the effective batch that fits.
        let ub = self.user_cfg.batch;
        let micro = if ub <= max_micro && self.eff.is_multiple_of(ub) {
            ub
        } else {
            let mut m = max_micro.min(self.eff);
            loop {
                if m <= 1 {
                    break 1;
                }
                if self.eff.is_multiple_of(m)
                    && self.eff / m <= MAX_ACCUM
                    && (m == max_micro || fits(&planner, budget, m)?)
                {
                    break m;
                }
                m -= 1;
            }
        };
        if self.eff / micro > MAX_ACCUM {
            // The effective batch needs more accumulation steps than a config allows.
            return Ok(None);
        }
        Ok(Some(Fitting {
            knobs: *k,
            micro,
            max_micro,
            planner,
        }))
    }

    fn candidate(&mut self, f: Fitting) -> Result<FitCandidate, PlanError> {
        let config = self.config(&f.knobs, f.micro);
        // The search planned the knobs at micro-batch 1, so with the whole effective batch
        // as accumulation; the candidate's figures are those of its own accumulation (one
        // step frees the gradients before its forward: `plan` of the candidate agrees).
        let own;
        let planner = if config.accum == f.planner.config.accum {
            &f.planner
        } else {
            own = Planner::new(self.preset, &config)?;
            &own
        };
        let cap = self.req.budget.allocator_cap(planner.context);
        let peaks = planner.peaks(f.micro)?;
        let reserved = planner
            .reserved_within(f.micro, cap)?
            .unwrap_or(peaks.reserved);
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
            nvidia_smi: Bytes(reserved.0.saturating_add(planner.context.0)),
            trainable_params: planner.trainable,
            time,
            is_user_config,
        })
    }
}

/// Searches the remedies for `user` on `req`'s GPU.
pub fn fit(preset: &Preset, user: &TrainConfig, req: &FitRequest) -> Result<FitReport, PlanError> {
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
    seed_dead(&mut s, &axes, main_budget / 2)?;
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
    let (mut pruned_dead, mut dominated) =
        (all.len().saturating_sub(ranked.len() + 1 + invalid), 0usize);
    let mut skipped: Vec<(f64, Knobs)> = Vec::new();
    for &(t, _, k) in &ranked {
        if out.len() >= req.top.max(1) || s.planned >= main_budget {
            skipped.push((t, k));
            continue;
        }
        if s.presumed_dead(&k) {
            pruned_dead += 1;
            continue;
        }
        if is_dominated(&accepted, &k, t, &s.user) {
            dominated += 1;
            continue;
        }
        if let Some(f) = s.plan(&k)? {
            let c = s.candidate(f)?;
            accepted.push((k, c.time.ms_per_sample));
            out.push(c);
        }
    }
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
fn seed_dead(s: &mut Search<'_>, axes: &Axes, budget: usize) -> Result<(), PlanError> {
    let mut finetunes = axes.finetune.clone();
    finetunes.sort_by_key(|ft| {
        (
            std::cmp::Reverse(axes::mode_rank(ft.mode)),
            ft.lora_targets != crate::plan::finetune::LoraTargets::Attn,
            ft.lora_rank,
        )
    });
    for &precision in &axes.precision {
        for &attention in &axes.attention {
            for &finetune in &finetunes {
                for &strategy in &axes.strategy {
                    let k = axes.leanest(precision, attention, finetune, strategy);
                    if s.presumed_dead(&k) || s.planned >= budget {
                        continue;
                    }
                    s.plan(&k)?;
                }
            }
        }
    }
    Ok(())
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
