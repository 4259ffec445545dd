//! Which batch to try next: a fixed list, or "until OOM" seeded by the planner's
//! predicted max batch, then galloping and bisection to the exact boundary in few
//! trials. Pure logic, tested in CI.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The batches a run tries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchPlan {
    /// Exactly these, in order (an OOM does not stop the list).
    List(Vec<u64>),
    /// Find the largest batch that runs: start at `seed` (the predicted max batch; 0 =
    /// let the runner predict it for the engine's device), never above `limit`.
    UntilOom { seed: u64, limit: u64 },
}

impl BatchPlan {
    /// Trials known in advance (`None` for a sweep).
    pub fn planned(&self) -> Option<u32> {
        match self {
            BatchPlan::List(l) => Some(l.len() as u32),
            BatchPlan::UntilOom { .. } => None,
        }
    }
}

/// The state of a run's batch choice.
#[derive(Debug, Clone)]
pub struct Sweep {
    plan: BatchPlan,
    next_in_list: usize,
    /// Batch → whether it ran.
    results: BTreeMap<u64, bool>,
    /// Gallop step (batch units) for the next probe beyond the known range.
    step: u64,
}

impl Sweep {
    pub fn new(plan: BatchPlan) -> Sweep {
        Sweep {
            plan,
            next_in_list: 0,
            results: BTreeMap::new(),
            step: 1,
        }
    }

    /// Largest batch known to run.
    pub fn max_ran(&self) -> Option<u64> {
        self.results
            .iter()
            .filter(|(_, ran)| **ran)
            .map(|(b, _)| *b)
            .max()
    }

    /// Smallest batch known to fail.
    pub fn first_failed(&self) -> Option<u64> {
        self.results
            .iter()
            .filter(|(_, ran)| !**ran)
            .map(|(b, _)| *b)
            .min()
    }

    /// Records the result of `batch`. A failure above a success narrows the search; a
    /// contradictory result (a smaller batch failing after a larger ran) is kept as
    /// measured — the boundary is then the lowest failure.
    pub fn record(&mut self, batch: u64, ran: bool) {
        self.results.insert(batch, ran);
    }

    /// The next batch to try, or `None` when done.
    pub fn next_batch(&mut self) -> Option<u64> {
        match &self.plan {
            BatchPlan::List(list) => {
                let b = list.get(self.next_in_list).copied();
                self.next_in_list += 1;
                b
            }
            &BatchPlan::UntilOom { seed, limit } => {
                let limit = limit.max(1);
                let seed = seed.clamp(1, limit);
                if self.results.is_empty() {
                    return Some(seed);
                }
                let lo = self.max_ran_below_first_failure();
                let hi = self.first_failed();
                match (lo, hi) {
                    // Bracketed: bisect.
                    (Some(lo), Some(hi)) => (hi > lo + 1).then(|| lo + (hi - lo) / 2),
                    // Everything so far ran: gallop up from the largest.
                    (Some(lo), None) => {
                        if lo >= limit {
                            return None;
                        }
                        let b = lo.saturating_add(self.step).min(limit);
                        self.step = self.step.saturating_mul(2);
                        Some(b)
                    }
                    // Everything so far failed: gallop down from the smallest failure.
                    (None, Some(hi)) => {
                        if hi <= 1 {
                            return None;
                        }
                        let b = hi.saturating_sub(self.step).max(1);
                        self.step = self.step.saturating_mul(2);
                        Some(b)
                    }
                    (None, None) => Some(seed),
                }
            }
        }
    }

    /// Largest success below the first failure (successes above a failure are noise
    /// and do not move the boundary up).
    fn max_ran_below_first_failure(&self) -> Option<u64> {
        let hi = self.first_failed().unwrap_or(u64::MAX);
        self.results
            .iter()
            .filter(|(b, ran)| **ran && **b < hi)
            .map(|(b, _)| *b)
            .max()
    }

    /// Number of batches tried so far.
    pub fn trials(&self) -> usize {
        self.results.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a sweep against a device where batches ≤ `cap` run.
    fn drive(seed: u64, cap: u64, limit: u64) -> (Option<u64>, Vec<u64>) {
        let mut s = Sweep::new(BatchPlan::UntilOom { seed, limit });
        let mut tried = Vec::new();
        while let Some(b) = s.next_batch() {
            assert!(!tried.contains(&b), "batch {b} tried twice: {tried:?}");
            tried.push(b);
            s.record(b, b <= cap);
            assert!(tried.len() < 100, "no termination: {tried:?}");
        }
        (s.max_ran(), tried)
    }

    #[test]
    fn exact_prediction_takes_two_trials() {
        let (max, tried) = drive(289, 289, 10_000);
        assert_eq!(max, Some(289));
        assert_eq!(tried, vec![289, 290]);
    }

    #[test]
    fn finds_the_boundary_from_any_seed() {
        for cap in [0, 1, 2, 7, 100, 289, 1000] {
            for seed in [1, 2, 50, 288, 291, 400, 5000] {
                let (max, tried) = drive(seed, cap, 8192);
                let expect = if cap == 0 { None } else { Some(cap) };
                assert_eq!(max, expect, "seed {seed} cap {cap}: {tried:?}");
                assert!(tried.len() <= 2 * 14 + 2, "{} trials", tried.len());
            }
        }
    }

    #[test]
    fn close_seed_needs_few_trials() {
        // A 1 % misprediction costs a handful of trials, not a binary search from 1.
        let (_, tried) = drive(291, 289, 8192);
        assert!(tried.len() <= 5, "{tried:?}");
        let (_, tried) = drive(286, 289, 8192);
        assert!(tried.len() <= 6, "{tried:?}");
    }

    #[test]
    fn stops_at_the_limit() {
        let (max, tried) = drive(10, 1_000_000, 64);
        assert_eq!(max, Some(64));
        assert_eq!(tried.last(), Some(&64));
    }

    #[test]
    fn list_runs_every_entry() {
        let mut s = Sweep::new(BatchPlan::List(vec![4, 8, 16]));
        let mut got = Vec::new();
        while let Some(b) = s.next_batch() {
            got.push(b);
            s.record(b, b < 16);
        }
        assert_eq!(got, vec![4, 8, 16]);
        assert_eq!(s.max_ran(), Some(8));
        assert_eq!(s.first_failed(), Some(16));
    }
}
