//! The state of one "make it fit" search and the planning of one combination: the graphs and
//! step times it caches, the dead and the closest miss, the allocator twins, and
//! [`plan_one`], which plans a combination without touching that state (so that several
//! can be planned at once, [`super::window`]) for [`Search::record`] to record.

use std::collections::HashMap;

use super::axes::{Knobs, change_words, cost_words};
use super::cost::{CandidateTime, step_time};
use super::report::{FitCandidate, FitRequest};
use super::strategy;
use crate::model::{Graph, Preset};
use crate::plan::config::{MAX_ACCUM, TrainConfig};
use crate::plan::policy::ParamPolicy;
use crate::plan::search::{fits, fits_seen, max_batch_seen};
use crate::plan::{PlanError, Planner};
use crate::units::Bytes;

/// Graph and policy per (precision, attention, fine-tuning): what timing walks.
type GraphKey = (
    crate::plan::Precision,
    crate::plan::Attention,
    crate::plan::finetune_mode::FineTune,
);

pub(super) struct Search<'a> {
    pub(super) preset: &'a Preset,
    pub(super) user_cfg: TrainConfig,
    pub(super) user: Knobs,
    pub(super) eff: u64,
    pub(super) req: &'a FitRequest,
    pub(super) graphs: HashMap<GraphKey, (std::sync::Arc<Graph>, ParamPolicy)>,
    /// Step times per graph, checkpointing and micro-batch (the optimizer, loop shape and
    /// allocator do not change them).
    pub(super) times: HashMap<(GraphKey, bool, u64), CandidateTime>,
    /// The dead combinations, each with its [`Search::band_factor`] (looked up once: the
    /// presumption below asks it of every dead combination for every combination classified).
    pub(super) dead: Vec<(Knobs, f64)>,
    pub(super) planned: usize,
    /// The leanest plan seen that did not fit: (nvidia-smi at micro-batch 1, settings,
    /// nvidia-smi at the upper edge of its mode's measured reserved band: what the verdict
    /// compares).
    pub(super) closest: Option<(Bytes, Knobs, Bytes)>,
    /// Planners whose allocator twin (the same knobs, the other `expandable` setting) has
    /// not been planned yet, keyed by their knobs with `expandable` false ([`Search::take_twin`]).
    pub(super) twins: HashMap<Knobs, Planner>,
    /// A planner of every combination whose events another precision generates alike (QLoRA
    /// in bf16 runs in fp32, [`TrainConfig::effective_precision`]), keyed by
    /// [`Search::events_key`]: the other precision takes its events as a twin's
    /// ([`Tuning::share_events`]).
    pub(super) same_events: HashMap<Knobs, Planner>,
    /// The seeds found alive whose events another precision generates alike, keyed by
    /// their knobs in the precision the step runs in ([`Search::alive_key`]): a seed of the
    /// other precision takes their verdict instead of their events (the twin would replay
    /// the same events under the same allocator, budget and context, [`plan_one`]), so no
    /// seed's events are kept for it.
    pub(super) alive_events: std::collections::HashSet<Knobs>,
    pub(super) tuning: Tuning,
    /// The planners' graphs, built once per graph key ([`crate::plan::GraphCache`]).
    pub(super) graph_cache: &'a crate::plan::GraphCache,
}

/// A planned combination that fits.
pub(super) struct Fitting {
    pub(super) knobs: Knobs,
    pub(super) micro: u64,
    pub(super) max_micro: u64,
    pub(super) planner: Planner,
    /// Its figures as a candidate, when the pass that planned it wanted them
    /// ([`Figures::of`]).
    pub(super) figures: Option<Figures>,
}

/// A candidate's memory figures, at its own micro-batch and accumulation.
#[derive(Debug, Clone, Copy)]
pub(super) struct Figures {
    peaks: crate::plan::eval::Peaks,
    /// Peak reserved on the GPU (the cache releases segments before an OOM).
    reserved: Bytes,
    context: Bytes,
    trainable: u64,
}

impl Figures {
    /// `known`: the uncapped peaks at `micro` when the max-batch search's replay gave them
    /// ([`crate::plan::search::max_batch_seen`]).
    fn of(
        t: &Task<'_>,
        knobs: &Knobs,
        micro: u64,
        planner: &Planner,
        known: Option<crate::plan::eval::Peaks>,
    ) -> Result<Figures, PlanError> {
        let config = t.config(knobs, micro);
        // The search planned the knobs at micro-batch 1, so with the whole effective batch
        // as accumulation; the candidate's figures are those of its own accumulation (one
        // step frees the gradients before its forward: `plan` of the candidate agrees).
        // The events depend on the accumulation only through whether it is 1 (gradients
        // freed before the forward) or more (`sim::Sim::step` runs at most two micro-steps).
        let own;
        let (planner, known) = if config.accum.min(2) == planner.config.accum.min(2) {
            (planner, known)
        } else {
            // The search's graphs and annotations (the same as a fresh build's).
            own = Planner::new_unless_above_cached(t.preset, &config, Some(t.graphs), |_, _| {
                u64::MAX
            })?
            .ok_or(PlanError::Overflow("event generation"))?;
            (&own, None)
        };
        let cap = t.req.budget.allocator_cap(planner.context);
        let peaks = match known {
            Some(p) => p,
            None => planner.peaks(micro)?,
        };
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
    pub(super) fn graph(
        &mut self,
        k: &Knobs,
    ) -> Result<&(std::sync::Arc<Graph>, ParamPolicy), PlanError> {
        let key = (k.precision, k.attention, k.finetune);
        if !self.graphs.contains_key(&key) {
            let size = self
                .user_cfg
                .size
                .unwrap_or_else(|| self.preset.default_size());
            // The planners' cache: a planner of the same graph takes it from there.
            let gp = self.graph_cache.get(
                self.preset,
                &crate::plan::GraphKey {
                    size,
                    target_seq: self.user_cfg.target_seq,
                    attention: k.attention,
                    moe_imbalance: self.user_cfg.moe_imbalance,
                    finetune: k.finetune,
                    precision: k.precision,
                },
            )?;
            self.graphs.insert(key, gp);
        }
        self.graphs
            .get(&key)
            .ok_or(PlanError::Overflow("fit graph cache"))
    }

    /// Time per sample of `k` at micro-batch `micro` (accumulation to the effective batch).
    pub(super) fn time(&mut self, k: &Knobs, micro: u64) -> Result<CandidateTime, PlanError> {
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

    pub(super) fn config(&self, k: &Knobs, micro: u64) -> TrainConfig {
        self.task().config(k, micro)
    }

    /// A combination is presumed dead when it needs at least the memory of a dead one and
    /// its verdict is judged with a band at least as wide (the error band differs per
    /// fine-tuning mode and strategy, so a leaner combination in a wider band can fail where
    /// a heavier one in a narrower band fits).
    pub(super) fn presumed_dead(&self, k: &Knobs) -> bool {
        let mut own = None;
        self.dead.iter().any(|(d, df)| {
            k.needs_at_least(d) && *own.get_or_insert_with(|| self.band_factor(k)) >= *df
        })
    }

    /// The factor from planned reserved to the upper edge of `k`'s measured band.
    pub(super) fn band_factor(&self, k: &Knobs) -> f64 {
        let key = crate::plan::band::ModeKey {
            finetune: k.finetune.mode,
            strategy: k.strategy,
            ..crate::plan::mode_key(self.preset, &self.user_cfg)
        };
        crate::plan::band::ErrorBand::of(&key)
            .reserved
            .upper_factor()
    }

    /// The events of `k`'s allocator twin (the same knobs, the other `expandable` setting)
    /// when that was planned and its twin has not been yet: the allocator settings do not
    /// change the events, only how they are replayed. Taken out of the cache: each key has
    /// two allocator settings, so the cache holds only plans whose twin is still to come.
    pub(super) fn take_twin(&mut self, k: &Knobs) -> Twin {
        match self
            .twins
            .remove(&twin_key(k))
            .or_else(|| self.same_events.get(&self.events_key(k)).cloned())
        {
            Some(p) => Twin::Planner(Box::new(p)),
            None if self.alive_events.contains(&self.alive_key(k)) => Twin::Alive,
            None => Twin::None,
        }
    }

    /// `k` with the precision the step really runs in: the seeds of two such knobs replay the
    /// same events under the same allocator settings.
    fn alive_key(&self, k: &Knobs) -> Knobs {
        Knobs {
            precision: self.config(k, 1).effective_precision(),
            ..*k
        }
    }

    /// `k`'s key among the combinations that generate the same events: its twin key with
    /// the precision the step really runs in ([`TrainConfig::effective_precision`]).
    pub(super) fn events_key(&self, k: &Knobs) -> Knobs {
        twin_key(&self.alive_key(k))
    }

    /// Whether another precision generates `k`'s events (the search shares them).
    fn shares_events(&self, k: &Knobs) -> bool {
        self.tuning.share_events && {
            let own = self.events_key(k);
            crate::plan::Precision::ALL.iter().any(|&precision| {
                precision != k.precision && self.events_key(&Knobs { precision, ..*k }) == own
            })
        }
    }

    /// Plans `k` on this thread: `None` when micro-batch 1 does not fit (recorded as dead).
    /// Its callers make a candidate of what fits: its figures are computed here, from the
    /// max-batch search's replays where they gave them ([`Task::figures`]).
    pub(super) fn plan(&mut self, k: &Knobs) -> Result<Option<Fitting>, PlanError> {
        let twin = self.take_twin(k);
        let task = Task {
            figures: true,
            ..self.task()
        };
        let planned = plan_one(&task, k, twin, self.closest_smi())?;
        Ok(self.record(planned))
    }

    /// What [`plan_one`] needs of the search (shared with the threads of [`super::window`]).
    /// The closest miss's nvidia-smi at micro-batch 1, what [`plan_one`] compares with.
    pub(super) fn closest_smi(&self) -> Option<Bytes> {
        self.closest.map(|(smi, _, _)| smi)
    }

    pub(super) fn task(&self) -> Task<'a> {
        Task {
            preset: self.preset,
            req: self.req,
            user_cfg: self.user_cfg,
            eff: self.eff,
            stop_early: self.tuning.stop_early,
            figures: false,
            only_alive: false,
            graphs: self.graph_cache,
        }
    }

    /// Records what planning a combination found, in the order the combinations were
    /// planned: the plans counted, the dead, the closest miss, the twin cache.
    pub(super) fn record(&mut self, p: Planned) -> Option<Fitting> {
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
        if let Some(pl) = planner.as_ref()
            && self.shares_events(&knobs)
        {
            if matches!(outcome, Outcome::Alive) {
                // A seed only asks alive or dead: the verdict is all the other precision
                // takes.
                self.alive_events.insert(self.alive_key(&knobs));
            } else {
                let key = self.events_key(&knobs);
                self.same_events.entry(key).or_insert_with(|| pl.clone());
            }
        }
        // The twin cache keeps the planner itself unless a candidate needs it too. A seed
        // that fits is not kept: its twin is rarely planned, and keeping every seed's events
        // made a quarter of the search's memory, each page a fault.
        let mut planner = planner;
        if fresh && !matches!(outcome, Outcome::Alive) {
            let keep = if matches!(outcome, Outcome::Fits { .. }) {
                planner.clone()
            } else {
                planner.take()
            };
            if let Some(pl) = keep {
                self.twins.insert(twin_key(&knobs), pl);
            }
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
                let factor = self.band_factor(&knobs);
                self.dead.push((knobs, factor));
                self.drop_dead_twins();
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

    /// Drops the cached planners whose twin can no longer be planned: both allocator
    /// settings of the key presumed dead (dead combinations only grow, and every pass skips
    /// a combination presumed dead before planning it). A dead combination with expandable
    /// segments presumes its twin without them dead at once, so its events were kept for
    /// nothing, every page of them a fault.
    fn drop_dead_twins(&mut self) {
        let dead: Vec<Knobs> = self
            .twins
            .keys()
            .filter(|k| self.both_dead(k))
            .copied()
            .collect();
        for k in dead {
            self.twins.remove(&k);
        }
    }

    /// Whether both allocator settings of the twin key `k` are presumed dead.
    fn both_dead(&self, k: &Knobs) -> bool {
        self.presumed_dead(k)
            && self.presumed_dead(&Knobs {
                expandable: true,
                ..*k
            })
    }

    /// Puts back the twin a plan computed ahead and then not needed had taken from the cache
    /// ([`super::window`]): the cache is as if the plan had not been made.
    pub(super) fn untake(&mut self, p: Planned) {
        let key = twin_key(&p.knobs);
        if !p.fresh
            && let Some(pl) = p.planner
            && !self.both_dead(&key)
        {
            self.twins.insert(key, pl);
        }
    }

    pub(super) fn candidate(&mut self, f: Fitting) -> Result<FitCandidate, PlanError> {
        let config = self.config(&f.knobs, f.micro);
        let fig = match f.figures {
            Some(fig) => fig,
            None => Figures::of(&self.task(), &f.knobs, f.micro, &f.planner, None)?,
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
/// several at once ([`super::window`]).
#[derive(Clone, Copy)]
pub(super) struct Task<'a> {
    pub(super) preset: &'a Preset,
    pub(super) req: &'a FitRequest,
    pub(super) user_cfg: TrainConfig,
    pub(super) eff: u64,
    pub(super) stop_early: bool,
    /// Whether a combination that fits gets its candidate figures where it is planned (on
    /// a worker): the passes whose plans become candidates.
    pub(super) figures: bool,
    /// Whether only dead or alive is asked (the seeds): no max-batch search, no micro-batch.
    pub(super) only_alive: bool,
    pub(super) graphs: &'a crate::plan::GraphCache,
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
pub(super) enum Outcome {
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

pub(super) struct Planned {
    pub(super) knobs: Knobs,
    pub(super) outcome: Outcome,
    /// Its planner, unless the config did not validate or the generation stopped early.
    pub(super) planner: Option<Planner>,
    /// Whether the planner was built here rather than taken from the twin cache.
    pub(super) fresh: bool,
}

/// What [`plan_one`] takes from the search's caches ([`Search::take_twin`]).
pub(super) enum Twin {
    None,
    /// A planner of the same events (an allocator twin, or another precision's).
    Planner(Box<Planner>),
    /// A seed of another precision with the same events and allocator settings was found
    /// alive: so is this one, when only that is asked ([`Task::only_alive`]).
    Alive,
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
pub(super) fn plan_one(
    t: &Task<'_>,
    k: &Knobs,
    twin: Twin,
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
        Twin::Planner(twin) => {
            let mut twin = *twin;
            twin.config.allocator = cfg.allocator;
            (twin, false)
        }
        // The twin's replay would have answered as the seed that left the verdict did.
        Twin::Alive if t.only_alive => return Ok(done(Outcome::Alive, None, false)),
        Twin::Alive | Twin::None => {
            let stop_early = t.stop_early;
            let bound = |context: Bytes, band: &crate::plan::band::ErrorBand| {
                let cap = band.reserved.cap_for_upper(budget.allocator_cap(context)).0;
                closest
                    .filter(|_| stop_early)
                    .map_or(u64::MAX, |smi| cap.max(smi.0.saturating_sub(context.0)))
            };
            match Planner::new_unless_above_cached(t.preset, &cfg, Some(t.graphs), bound) {
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
    let (max_micro, mut seen) = if t.only_alive {
        (fits(&planner, budget, 1)?.then_some(1), Vec::new())
    } else {
        max_batch_seen(&planner, budget, t.eff)?
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
    // largest divisor of the effective batch that fits. Where the figures are wanted, a
    // divisor is asked by the replay that also gives them ([`fits_seen`]): the figures of
    // the one chosen then replay nothing again.
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
                && (m == max_micro
                    || if t.figures {
                        fits_seen(&planner, budget, m, &mut seen)?
                    } else {
                        fits(&planner, budget, m)?
                    })
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
            let known = seen.iter().find(|(b, _)| *b == micro).map(|(_, p)| *p);
            Some(Figures::of(t, k, micro, &planner, known)?)
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

/// How the search gets its answer, not what the answer is: [`super::fit`] gives the same report
/// under every tuning (tested).
#[derive(Debug, Clone, Copy)]
pub(super) struct Tuning {
    /// Combinations planned at a time ([`super::window`]): this thread and `width - 1` workers.
    pub(super) width: usize,
    /// Whether a generation stops once the combination is known dead and not the closest
    /// miss ([`plan_one`]).
    pub(super) stop_early: bool,
    /// Whether a combination whose events another precision generated already takes them
    /// instead of generating them again ([`Search::take_twin`]).
    pub(super) share_events: bool,
    /// Whether a thread that would wait plans an entry that a result not recorded yet may
    /// make the pass skip ([`super::window`]).
    pub(super) speculate: bool,
}
