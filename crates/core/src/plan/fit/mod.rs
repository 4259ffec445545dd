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
mod report;
mod search;
pub mod strategy;
mod window;

pub use self::report::{FitCandidate, FitReport, FitRequest};

use std::collections::HashMap;

use self::axes::{Axes, Knobs, finetune_words};
use self::search::{Fitting, Search, Tuning};
use super::PlanError;
use super::config::TrainConfig;
use crate::model::Preset;
use crate::units::Bytes;

/// Searches the remedies for `user` on `req`'s GPU.
pub fn fit(preset: &Preset, user: &TrainConfig, req: &FitRequest) -> Result<FitReport, PlanError> {
    fit_with(
        preset,
        user,
        req,
        Tuning {
            width: req.threads.max(1),
            stop_early: true,
            share_events: true,
            speculate: true,
        },
    )
}

fn fit_with(
    preset: &Preset,
    user: &TrainConfig,
    req: &FitRequest,
    tuning: Tuning,
) -> Result<FitReport, PlanError> {
    // The graphs the combinations share, built once for the whole search.
    let graphs = crate::plan::GraphCache::default();
    // The workers live for the whole search ([`crate::par::Workers`]).
    std::thread::scope(|scope| {
        let workers = crate::par::Workers::new(scope, tuning.width.saturating_sub(1));
        search(preset, user, req, tuning, &workers, &graphs)
    })
}

fn search<'a: 'w, 'w>(
    preset: &'a Preset,
    user: &TrainConfig,
    req: &'a FitRequest,
    tuning: Tuning,
    workers: &crate::par::Workers<'w>,
    graph_cache: &'a crate::plan::GraphCache,
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
        same_events: HashMap::new(),
        alive_events: std::collections::HashSet::new(),
        tuning,
        graph_cache,
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
    // The seeds share their events across precisions; the ranked pass seldom plans a
    // combination whose events another precision made: their memory goes.
    s.same_events.clear();
    s.alive_events.clear();
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
        last_fit: false,
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
    window::run(
        s,
        &mut SeedPass {
            list,
            budget,
            last_alive: true,
        },
        workers,
    )
}

/// The seeds: each planned unless presumed dead, while the budget lasts.
struct SeedPass {
    list: Vec<Knobs>,
    budget: usize,
    /// Whether the last seed recorded was alive ([`window::Pass::likely_skips`]).
    last_alive: bool,
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

    fn may_skip_after(&self, _: &Search<'_>, u: usize, j: usize) -> bool {
        self.list[j].needs_at_least(&self.list[u])
    }

    /// Seeds alike run in streaks of life and death: a seed is guessed to end as the last
    /// one recorded did (dead, it skips what [`window::Pass::may_skip_after`] says it may).
    fn likely_skips(&self, s: &Search<'_>, u: usize, j: usize) -> bool {
        !self.last_alive && self.may_skip_after(s, u, j)
    }

    fn headroom(&self, s: &Search<'_>) -> usize {
        self.budget.saturating_sub(s.planned)
    }

    fn planned(
        &mut self,
        s: &mut Search<'_>,
        i: usize,
        _: Option<Fitting>,
    ) -> Result<(), PlanError> {
        self.last_alive = !s.presumed_dead(&self.list[i]);
        // The events kept for the other precisions go once no seed after this one can take
        // them (a seed presumed dead stays skipped; one planned ahead took them already).
        let keys: Vec<Knobs> = s.same_events.keys().copied().collect();
        for key in keys {
            let wanted = self.list[i + 1..]
                .iter()
                .any(|k| s.events_key(k) == key && !s.presumed_dead(k));
            if !wanted {
                s.same_events.remove(&key);
            }
        }
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
    /// Whether the last combination recorded fits ([`window::Pass::likely_skips`]).
    last_fit: bool,
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

    fn may_skip_after(&self, s: &Search<'_>, u: usize, j: usize) -> bool {
        let (ku, kj) = (self.ranked[u].2, self.ranked[j].2);
        kj.needs_at_least(&ku) || ku.changes_subset_of(&kj, &s.user)
    }

    /// Neighbours in the ranking fit or die in streaks: a combination is guessed to end as
    /// the last one recorded did (fitting, it dominates the combinations that add to its
    /// changes; dead, it kills those that need at least its memory).
    fn likely_skips(&self, s: &Search<'_>, u: usize, j: usize) -> bool {
        let (ku, kj) = (self.ranked[u].2, self.ranked[j].2);
        if self.last_fit {
            ku.changes_subset_of(&kj, &s.user)
        } else {
            kj.needs_at_least(&ku)
        }
    }

    fn headroom(&self, s: &Search<'_>) -> usize {
        self.budget
            .saturating_sub(s.planned)
            .min(self.top.saturating_sub(self.out.len()))
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
        self.last_fit = f.is_some();
        if let Some(f) = f {
            let c = s.candidate(f)?;
            self.accepted.push((self.ranked[i].2, c.time.ms_per_sample));
            self.out.push(c);
            drop_settled_twins(s, &self.accepted);
        }
        Ok(())
    }
}

/// Drops the cached allocator twins neither of whose settings can be planned any more: each
/// presumed dead or dominated by an accepted candidate (both only grow, and this pass and
/// the strategies' pass after it skip such a combination before planning it). A candidate
/// without expandable segments usually dominates its twin with them (the same time, one
/// change more), whose events it kept for nothing, every page of them a fault.
fn drop_settled_twins(s: &mut Search<'_>, accepted: &[(Knobs, f64)]) {
    let keys: Vec<Knobs> = s.twins.keys().copied().collect();
    for key in keys {
        let settled = [false, true].into_iter().all(|expandable| {
            let k = Knobs { expandable, ..key };
            s.presumed_dead(&k)
                || s.time(&k, 1)
                    .is_ok_and(|t| is_dominated(accepted, &k, t.ms_per_sample, &s.user))
        });
        if settled {
            s.twins.remove(&key);
        }
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
