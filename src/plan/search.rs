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

/// Whether `batch` runs on the budget's GPU without a CUDA OOM: the caching allocator is
/// simulated under the cap, releasing cached segments before failing as PyTorch does.
pub fn fits(planner: &Planner, budget: Budget, batch: u64) -> Result<bool, PlanError> {
    match planner.runs_within(batch, budget.allocator_cap(planner.context)) {
        Err(PlanError::Overflow(_)) => Ok(false),
        other => other,
    }
}

/// The largest batch whose predicted nvidia-smi bytes fit `budget`, or `None` when even
/// batch 1 does not fit. Exponential search then bisection: O(log n) plans.
pub fn max_batch(planner: &Planner, budget: Budget, limit: u64) -> Result<Option<u64>, PlanError> {
    max_batch_capped(planner, budget.allocator_cap(planner.context), limit)
}

/// The largest batch that runs when the caching allocator may reserve at most `cap` bytes
/// (what `torch.cuda.set_per_process_memory_fraction` limits; the context is outside it).
pub fn max_batch_capped(planner: &Planner, cap: Bytes, limit: u64) -> Result<Option<u64>, PlanError> {
    let fits = |b: u64| -> Result<bool, PlanError> {
        match planner.runs_within(b, cap) {
            Err(PlanError::Overflow(_)) => Ok(false),
            other => other,
        }
    };
    if !fits(1)? {
        return Ok(None);
    }
    let mut lo = 1u64;
    let mut hi = 2u64;
    while hi <= limit && fits(hi)? {
        lo = hi;
        hi = hi.saturating_mul(2);
    }
    let mut hi = hi.min(limit.saturating_add(1));
    // Invariant: lo fits, hi does not (or is past the limit).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(lo))
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
    fn usable_respects_margin() {
        let b = Budget {
            capacity: Bytes::gib(10),
            margin: 0.1,
        };
        assert_eq!(b.usable(), Bytes(9 * (1 << 30)));
    }
}
