//! Derived answers: the largest micro-batch that fits, accumulation for a target
//! effective batch, sweeps over batch sizes.

use serde::Serialize;

use super::eval::Peaks;
use super::{PlanError, Planner};
use crate::units::Bytes;

/// How much of the GPU a plan may use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    pub capacity: Bytes,
    /// Fraction of capacity kept free (0.05 = 5 %).
    pub margin: f64,
}

impl Budget {
    /// Bytes a plan's nvidia-smi figure may reach.
    pub fn usable(&self) -> Bytes {
        let m = self.margin.clamp(0.0, 0.95);
        Bytes((self.capacity.0 as f64 * (1.0 - m)) as u64)
    }

    /// Conservative check on peaks alone: nvidia-smi bytes within the usable memory.
    pub fn fits(&self, p: &Peaks) -> bool {
        p.nvidia_smi <= self.usable()
    }

    /// Bytes the caching allocator may reserve: usable memory minus the CUDA context.
    pub fn allocator_cap(&self, context: Bytes) -> Bytes {
        self.usable().saturating_sub(context)
    }
}

/// The bytes the simulated caching allocator may reserve for a verdict on `budget`: the
/// allocator's cap ([`Budget::allocator_cap`]) shrunk by the worst under-prediction of
/// reserved measured for the planner's mode, so that a plan fits only when the upper edge
/// of its reserved band does ([`super::band`]).
pub fn verdict_cap(planner: &Planner, budget: Budget) -> Bytes {
    planner
        .band()
        .reserved
        .cap_for_upper(budget.allocator_cap(planner.context))
}

/// [`fits`] when the uncapped peak reserved bytes are already known: when the upper edge of
/// their band is within the cap the capped simulation cannot fail, so it only runs when it
/// is not. Nor does it run when the measured step's live bytes alone pass the cap
/// ([`Planner::live_peaks`], what the bracket of [`max_batch`] presumes): allocated bytes never
/// exceed reserved, so the capped replay would fail before that point (most remedies that do
/// not fit; [`max_batch`] then searches them with the same lines).
pub fn fits_with_reserved(
    planner: &Planner,
    budget: Budget,
    batch: u64,
    reserved: Bytes,
) -> Result<bool, PlanError> {
    if planner.band().reserved.upper(reserved) <= budget.allocator_cap(planner.context) {
        return Ok(true);
    }
    if planner.live_peaks().at(batch) > verdict_cap(planner, budget) {
        return Ok(false);
    }
    fits(planner, budget, batch)
}

/// Whether `batch` runs on the budget's GPU without a CUDA OOM, at the upper edge of the
/// mode's measured reserved band: the caching allocator is simulated under
/// [`verdict_cap`], releasing cached segments before failing as PyTorch does.
///
/// When an upper bound of the uncapped peak reserved bytes is cheap to give and within the
/// cap ([`super::eval::reserved_bound`]), the capped allocator cannot reach its cap: the
/// batch fits without the replay (the make-it-fit search's seeds, expandable segments).
pub fn fits(planner: &Planner, budget: Budget, batch: u64) -> Result<bool, PlanError> {
    let cap = verdict_cap(planner, budget);
    if super::eval::reserved_bound(&planner.events, batch, planner.config.allocator)
        .is_some_and(|bound| bound <= cap)
    {
        return Ok(true);
    }
    match planner.runs_within(batch, cap) {
        Err(PlanError::Overflow(_)) => Ok(false),
        other => other,
    }
}

/// The largest batch that fits `budget` at the upper edge of the mode's measured reserved
/// band ([`verdict_cap`]), or `None` when even batch 1 does not fit. Exponential search then
/// bisection: O(log n) plans.
pub fn max_batch(planner: &Planner, budget: Budget, limit: u64) -> Result<Option<u64>, PlanError> {
    max_batch_capped(planner, verdict_cap(planner, budget), limit)
}

/// The largest batch that runs when the caching allocator may reserve at most `cap` bytes
/// (what `torch.cuda.set_per_process_memory_fraction` limits; the context is outside it),
/// as the estimator simulates it, without the error band ([`max_batch`] applies it).
pub fn max_batch_capped(
    planner: &Planner,
    cap: Bytes,
    limit: u64,
) -> Result<Option<u64>, PlanError> {
    let mut fits = |b: u64| -> Result<bool, PlanError> {
        match planner.runs_within(b, cap) {
            Err(PlanError::Overflow(_)) => Ok(false),
            other => other,
        }
    };
    max_batch_by(planner, cap, limit, &mut fits)
}

/// Batches with their uncapped peaks, as a max-batch search's replays gave them.
pub type SeenPeaks = Vec<(u64, Peaks)>;

/// [`max_batch`], with the uncapped peaks of the batches whose replay never reached the cap
/// (the same replay, [`super::eval::reserved_and_peaks_within`]): the make-it-fit search
/// takes its candidate's figures from there instead of replaying the batch again.
pub fn max_batch_seen(
    planner: &Planner,
    budget: Budget,
    limit: u64,
) -> Result<(Option<u64>, SeenPeaks), PlanError> {
    let cap = verdict_cap(planner, budget);
    let mut seen = Vec::new();
    let mut fits = |b: u64| fits_capped_seen(planner, cap, b, &mut seen);
    let max = max_batch_by(planner, cap, limit, &mut fits)?;
    Ok((max, seen))
}

/// [`fits`] by the replay that also gives the uncapped peaks when it never reached the cap
/// ([`super::eval::reserved_and_peaks_within`]), which it adds to `seen`: the make-it-fit
/// search asks a candidate's micro-batch this way, and its figures then need no replay of
/// their own. The same verdict as [`fits`] (the capped replay is [`Planner::runs_within`]'s,
/// tested; [`fits`]' bound only spares it).
pub fn fits_seen(
    planner: &Planner,
    budget: Budget,
    batch: u64,
    seen: &mut SeenPeaks,
) -> Result<bool, PlanError> {
    fits_capped_seen(planner, verdict_cap(planner, budget), batch, seen)
}

/// [`fits_seen`] under `cap`.
fn fits_capped_seen(
    planner: &Planner,
    cap: Bytes,
    batch: u64,
    seen: &mut SeenPeaks,
) -> Result<bool, PlanError> {
    match super::eval::reserved_and_peaks_within(
        &planner.events,
        batch,
        planner.config.allocator,
        cap,
        planner.context,
    ) {
        Ok((reserved, peaks)) => {
            if let Some(p) = peaks {
                seen.push((batch, p));
            }
            Ok(reserved.is_some())
        }
        Err(PlanError::Overflow(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The search of [`max_batch_capped`] with `fits` telling whether a batch runs under `cap`.
fn max_batch_by(
    planner: &Planner,
    cap: Bytes,
    limit: u64,
    fits: &mut dyn FnMut(u64) -> Result<bool, PlanError>,
) -> Result<Option<u64>, PlanError> {
    // Allocated bytes never exceed reserved, so the envelope of peak allocated gives a cheap
    // upper bound: the first batch whose live bytes alone pass the cap cannot run.
    let env = planner.live_peaks();
    let over = |b: u64| env.at(b) > cap;
    let mut hi = 1u64;
    while hi <= limit && !over(hi) {
        hi = hi.saturating_mul(2);
    }
    let mut lo = hi / 2; // 0 or a batch under the bound
    let mut bound = hi.min(limit.saturating_add(1));
    while bound - lo > 1 {
        let mid = lo + (bound - lo) / 2;
        if over(mid) {
            bound = mid;
        } else {
            lo = mid;
        }
    }
    // `bound` cannot run. Gallop down from just below it with the allocator simulation
    // (the answer is usually a few per cent below the bound), then bisect.
    let mut bad = bound;
    let mut step = 1u64;
    let good = loop {
        let candidate = bad.saturating_sub(step);
        if candidate == 0 {
            if bad > 1 && fits(1)? {
                break 1;
            }
            return Ok(None);
        }
        if fits(candidate)? {
            break candidate;
        }
        bad = candidate;
        step = step.saturating_mul(2);
    };
    Ok(Some(bisect(good, bad, fits)?))
}

/// The largest `x` in `good..bad` that fits, given that `good` fits and `bad` does not:
/// bisection, `fits` taken as monotone between them. The batch and context searches share it.
pub fn bisect(
    mut good: u64,
    mut bad: u64,
    fits: &mut dyn FnMut(u64) -> Result<bool, PlanError>,
) -> Result<u64, PlanError> {
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if fits(mid)? {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Ok(good)
}

/// Accumulation steps so that `micro_batch × steps ≥ target` (at least 1).
pub fn accumulation_for(target_effective: u64, micro_batch: u64) -> u64 {
    if micro_batch == 0 {
        return 1;
    }
    target_effective.div_ceil(micro_batch).max(1)
}

/// One point of a batch sweep.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SweepPoint {
    pub batch: u64,
    pub allocated: Bytes,
    pub reserved: Bytes,
    pub nvidia_smi: Bytes,
}

/// Peak allocated bytes for every batch in `batches` through the precomputed envelope:
/// microseconds per point, for curves over thousands of batch sizes.
pub fn sweep_allocated(
    planner: &Planner,
    batches: impl IntoIterator<Item = u64>,
) -> Vec<(u64, Bytes)> {
    let env = super::eval::PeakEnvelope::new(&planner.events);
    batches.into_iter().map(|b| (b, env.at(b))).collect()
}

/// Peaks for every batch in `batches` (stops at the first overflow).
pub fn sweep(planner: &Planner, batches: impl IntoIterator<Item = u64>) -> Vec<SweepPoint> {
    let mut out = Vec::new();
    for b in batches {
        match planner.peaks(b) {
            Ok(p) => out.push(SweepPoint {
                batch: b,
                allocated: p.allocated,
                reserved: p.reserved,
                nvidia_smi: p.nvidia_smi,
            }),
            Err(_) => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accumulation_rounds_up() {
        assert_eq!(accumulation_for(256, 64), 4);
        assert_eq!(accumulation_for(100, 64), 2);
        assert_eq!(accumulation_for(1, 64), 1);
        assert_eq!(accumulation_for(5, 0), 1);
    }

    #[test]
    fn max_batch_agrees_with_a_linear_scan() {
        let preset = crate::model::preset::find_builtin("resnet18").expect("preset");
        let cfg = crate::plan::TrainConfig {
            size: Some(64),
            ..Default::default()
        };
        let planner = Planner::new(&preset, &cfg).expect("planner");
        for cap_mib in [200u64, 400, 1000] {
            let cap = Bytes::mib(cap_mib);
            let got = max_batch_capped(&planner, cap, 4096).expect("search");
            let scan = (1..=4096u64)
                .take_while(|&b| planner.runs_within(b, cap).expect("sim"))
                .last();
            // Fragmentation can make the simulated allocator non-monotone in the batch; the
            // search returns a batch that runs while the next one does not, never less than
            // the first run of batches that all fit.
            assert!(got >= scan, "cap {cap_mib} MiB: {got:?} < {scan:?}");
            if let Some(m) = got {
                assert!(planner.runs_within(m, cap).expect("sim"));
                assert!(!planner.runs_within(m + 1, cap).expect("sim"));
            }
        }
        assert_eq!(
            max_batch_capped(&planner, Bytes::mib(10), 4096).expect("search"),
            None
        );
    }

    /// `fits` without the replay (the expandable bound within the cap) answers as the
    /// replay does, on budgets from far too small to ample.
    #[test]
    fn fits_by_the_bound_agrees_with_the_replay() {
        let preset = crate::model::preset::find_builtin("gpt2").expect("preset");
        let mut cfg = crate::plan::TrainConfig {
            size: Some(256),
            ..Default::default()
        };
        cfg.allocator.expandable_segments = true;
        let planner = Planner::new(&preset, &cfg).expect("planner");
        let mut skipped = 0;
        for gib in 1..=24u64 {
            let budget = Budget {
                capacity: Bytes::gib(gib),
                margin: 0.05,
            };
            for batch in [1, 2, 4, 8] {
                let replayed = matches!(
                    planner.runs_within(batch, verdict_cap(&planner, budget)),
                    Ok(true)
                );
                assert_eq!(fits(&planner, budget, batch).expect("fits"), replayed);
                let bound = crate::plan::eval::reserved_bound(
                    &planner.events,
                    batch,
                    planner.config.allocator,
                )
                .expect("a bound");
                assert!(bound >= planner.peaks(batch).expect("peaks").reserved);
                skipped += usize::from(bound <= verdict_cap(&planner, budget));
            }
        }
        assert!(skipped > 0, "the bound never spared a replay");
    }

    /// `fits_with_reserved` (the remedies' verdict) answers as the capped replay does, on
    /// budgets from far too small to ample, and its live-bytes check spares some replays.
    #[test]
    fn fits_with_reserved_agrees_with_the_replay() {
        let preset = crate::model::preset::find_builtin("gpt2").expect("preset");
        let cfg = crate::plan::TrainConfig {
            size: Some(256),
            ..Default::default()
        };
        let planner = Planner::new(&preset, &cfg).expect("planner");
        let mut spared = 0;
        for mib in (500..=12_000u64).step_by(250) {
            let budget = Budget {
                capacity: Bytes::mib(mib),
                margin: 0.05,
            };
            for batch in [1, 2, 4, 8, 16] {
                let cap = verdict_cap(&planner, budget);
                let replayed = matches!(planner.runs_within(batch, cap), Ok(true));
                let reserved = planner.peaks(batch).expect("peaks").reserved;
                let got = fits_with_reserved(&planner, budget, batch, reserved).expect("fits");
                assert_eq!(got, replayed, "{mib} MiB, batch {batch}");
                spared += usize::from(planner.live_peaks().at(batch) > cap);
            }
        }
        assert!(spared > 0, "the live bytes never spared a replay");
    }

    /// The max-batch replay that also gives the uncapped peaks answers as the capped replay
    /// does, and its peaks, when given, are the uncapped evaluation's.
    #[test]
    fn the_shared_replay_agrees_with_both_replays() {
        let preset = crate::model::preset::find_builtin("gpt2").expect("preset");
        let cfg = crate::plan::TrainConfig {
            size: Some(256),
            ..Default::default()
        };
        let planner = Planner::new(&preset, &cfg).expect("planner");
        let mut given = 0;
        for mib in [300u64, 1_000, 2_000, 4_000, 8_000] {
            for batch in [1, 2, 4, 8, 16] {
                let cap = Bytes::mib(mib);
                let (reserved, peaks) = crate::plan::eval::reserved_and_peaks_within(
                    &planner.events,
                    batch,
                    planner.config.allocator,
                    cap,
                    planner.context,
                )
                .expect("replay");
                assert_eq!(
                    reserved,
                    planner.reserved_within(batch, cap).expect("capped"),
                    "{mib} MiB, batch {batch}"
                );
                if let Some(p) = peaks {
                    assert_eq!(p, planner.peaks(batch).expect("peaks"));
                    given += 1;
                }
            }
        }
        assert!(given > 0, "no replay gave the uncapped peaks");
        let budget = Budget {
            capacity: Bytes::gib(4),
            margin: 0.05,
        };
        let (max, seen) = max_batch_seen(&planner, budget, 64).expect("search");
        assert_eq!(max, max_batch(&planner, budget, 64).expect("search"));
        for (b, p) in seen {
            assert_eq!(p, planner.peaks(b).expect("peaks"), "batch {b}");
        }
    }

    #[test]
    fn usable_respects_margin() {
        let b = Budget {
            capacity: Bytes::gib(10),
            margin: 0.1,
        };
        assert_eq!(b.usable(), Bytes(9 * (1 << 30)));
    }
}
