//! The memory of the measured inference call over its forwards: allocated and reserved bytes
//! after every event, placed on a forward axis (0 = the prefill, `k` = decode step `k`), for
//! the GUI's memory-over-tokens timeline.

use serde::Serialize;

use super::InferPlanner;
use crate::plan::PlanError;
use crate::plan::eval;
use crate::units::Bytes;

/// One point of the timeline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TracePoint {
    /// The forward the event belongs to: 0 = the prefill, `k` = decode step `k` (the forward
    /// that produces token `k + 1`).
    pub forward: u32,
    /// `forward` plus the event's position within that forward's events (0 ≤ fraction < 1).
    pub x: f64,
    /// `torch.cuda.memory_allocated()` after the event.
    pub allocated: Bytes,
    /// `torch.cuda.memory_reserved()` after the event.
    pub reserved: Bytes,
}

impl InferPlanner {
    /// The measured call's memory at `batch`, after every event (and when it begins), thinned
    /// to about `max_points` points by keeping each stretch's lowest and highest allocated
    /// point (so the prefill spike and every decode step's top survive). Its largest allocated
    /// and reserved bytes are the plan's peaks.
    pub fn trace(&self, batch: u64, max_points: usize) -> Result<Vec<TracePoint>, PlanError> {
        let events = self.events_at(batch);
        let values = eval::memory_trace(&events, batch, self.config.allocator)?;
        let start = events.measured_start.min(events.events.len());
        let nodes: Vec<u32> = events.events[start..]
            .iter()
            .map(|e| if e.node == u32::MAX { 0 } else { e.node })
            .collect();
        // events per forward, to place each event within its forward
        let forwards = nodes.iter().copied().max().map_or(1, |m| m as usize + 1);
        let mut counts = vec![0u64; forwards];
        for &n in &nodes {
            counts[n as usize] += 1;
        }
        let mut seen = vec![0u64; forwards];
        let mut points = Vec::with_capacity(values.len());
        for (i, &(allocated, reserved)) in values.iter().enumerate() {
            // point 0 is the state before the first event: the start of the first forward
            let (forward, frac) = match i.checked_sub(1).map(|j| nodes[j]) {
                Some(n) => {
                    let k = n as usize;
                    seen[k] += 1;
                    (n, seen[k] as f64 / (counts[k] + 1) as f64)
                }
                None => (nodes.first().copied().unwrap_or(0), 0.0),
            };
            points.push(TracePoint {
                forward,
                x: f64::from(forward) + frac,
                allocated,
                reserved,
            });
        }
        Ok(thin(points, max_points))
    }
}

/// Keeps, per stretch of consecutive points, the lowest and the highest allocated point (in
/// their order), so about `max_points` remain; the last point is kept.
fn thin(points: Vec<TracePoint>, max_points: usize) -> Vec<TracePoint> {
    let bucket = (2 * points.len()).div_ceil(max_points.max(2));
    if bucket <= 2 {
        return points;
    }
    let mut out = Vec::with_capacity(2 * points.len() / bucket + 2);
    for chunk in points.chunks(bucket) {
        let (mut lo, mut hi) = (0, 0);
        for (i, p) in chunk.iter().enumerate() {
            if p.allocated < chunk[lo].allocated {
                lo = i;
            }
            if p.allocated > chunk[hi].allocated {
                hi = i;
            }
        }
        let (a, b) = if lo <= hi { (lo, hi) } else { (hi, lo) };
        out.push(chunk[a]);
        if b != a {
            out.push(chunk[b]);
        }
    }
    if let (Some(last), Some(kept)) = (points.last(), out.last())
        && kept != last
    {
        out.push(*last);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::config::{AllocatorConfig, Attention, DType};
    use crate::plan::inference::{InferConfig, InferStep, KvCache};

    fn planner(step: InferStep, new_tokens: u64) -> InferPlanner {
        let path = format!(
            "{}/../../tests/data/hf_configs/Llama-3.2-1B.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).expect("config");
        let preset = crate::model::hf::from_config_text(&text, "Llama-3.2-1B").expect("preset");
        let cfg = InferConfig {
            step,
            batch: 4,
            prompt: 300,
            new_tokens,
            dtype: DType::BF16,
            attention: Attention::Sdpa,
            kv_cache: KvCache::Dynamic,
            allocator: AllocatorConfig::default(),
        };
        InferPlanner::new(&preset, &cfg).expect("planner")
    }

    /// The trace's largest allocated and reserved bytes are the plan's peaks, thinned or not;
    /// its forwards run from the prefill (0) to the last decode step, in order.
    #[test]
    fn trace_peaks_are_the_plans() {
        let p = planner(InferStep::Generate, 6);
        let plan = p.plan(4).expect("plan");
        for max_points in [usize::MAX, 400] {
            let t = p.trace(4, max_points).expect("trace");
            assert!(t.len() <= max_points.saturating_add(2), "{}", t.len());
            let alloc = t.iter().map(|q| q.allocated).max().expect("points");
            let reserved = t.iter().map(|q| q.reserved).max().expect("points");
            assert_eq!(alloc, plan.peak_allocated_bytes, "max_points {max_points}");
            assert_eq!(
                reserved, plan.peak_reserved_bytes,
                "max_points {max_points}"
            );
            assert_eq!(t.first().map(|q| q.forward), Some(0));
            assert_eq!(
                t.last().map(|q| q.forward),
                Some(5),
                "6 tokens: 5 decode steps"
            );
            assert!(
                t.windows(2)
                    .all(|w| w[0].x <= w[1].x && w[0].forward <= w[1].forward)
            );
            assert!(t.iter().all(|q| q.x >= f64::from(q.forward)
                && q.x < f64::from(q.forward) + 1.0
                && q.reserved >= q.allocated));
        }
        let f = planner(InferStep::Prefill, 0);
        let t = f.trace(4, usize::MAX).expect("prefill trace");
        assert!(t.iter().all(|q| q.forward == 0));
        let plan = f.plan(4).expect("prefill plan");
        let alloc = t.iter().map(|q| q.allocated).max();
        assert_eq!(alloc, Some(plan.peak_allocated_bytes));
    }
}
