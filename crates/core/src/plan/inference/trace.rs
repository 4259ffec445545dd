//! The memory of the measured inference call over its forwards: allocated and reserved bytes
//! after every event, placed on a forward axis (0 = the prefill, `k` = decode step `k`), for
//! the GUI's memory-over-tokens timeline.

use serde::Serialize;

use crate::plan::PlanError;
use crate::plan::config::AllocatorConfig;
use crate::plan::eval;
use crate::plan::events::Events;
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

/// The memory of the call whose events are `events` at `batch`, after every event (and when
/// it begins), thinned to about `max_points` points (what `InferPlanner::trace` answers).
pub(super) fn of(
    events: &Events,
    batch: u64,
    allocator: AllocatorConfig,
    max_points: usize,
) -> Result<Vec<TracePoint>, PlanError> {
    let values = eval::memory_trace(events, batch, allocator)?;
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
mod tests;
