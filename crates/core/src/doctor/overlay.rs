//! The planned allocated timeline laid over a snapshot's: the plan's one step is stretched
//! onto the trace so that the two peaks line up (the rise before the peak onto the trace's
//! rise, the fall after it onto the fall). The trace counts allocator events, the plan counts
//! its own events, so only the shape and the heights compare, not the x positions in between.

use serde::Serialize;

use super::snapshot::TimelinePoint;

/// The planned timeline in the snapshot's coordinates, and the two peaks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedOverlay {
    /// (trace entry, planned allocated bytes).
    pub points: Vec<(f64, u64)>,
    pub planned_peak_allocated_bytes: u64,
    pub snapshot_peak_allocated_bytes: u64,
    /// (planned − snapshot) / snapshot, in percent.
    pub peak_difference_percent: f64,
}

/// Lays `planned` — (event index within the step, allocated bytes) in order — over the
/// snapshot's `timeline`. `None` when either is empty.
pub fn overlay(timeline: &[TimelinePoint], planned: &[(u32, u64)]) -> Option<PlannedOverlay> {
    let (first, last) = (timeline.first()?, timeline.last()?);
    let snap_peak = timeline.iter().max_by_key(|p| p.allocated_bytes)?;
    let (&(p0, _), &(pn, _)) = (planned.first()?, planned.last()?);
    let plan_peak = planned.iter().max_by_key(|p| p.1)?;
    let (s0, sp, sn) = (
        first.event as f64,
        snap_peak.event as f64,
        last.event as f64,
    );
    let (p0, pp, pn) = (f64::from(p0), f64::from(plan_peak.0), f64::from(pn));
    // Piecewise linear: [p0, pp] → [s0, sp], [pp, pn] → [sp, sn].
    let map = |i: f64| {
        if i <= pp {
            if pp > p0 {
                s0 + (i - p0) / (pp - p0) * (sp - s0)
            } else {
                sp
            }
        } else if pn > pp {
            sp + (i - pp) / (pn - pp) * (sn - sp)
        } else {
            sp
        }
    };
    let snapshot_peak = snap_peak.allocated_bytes;
    Some(PlannedOverlay {
        points: planned
            .iter()
            .map(|&(i, b)| (map(f64::from(i)), b))
            .collect(),
        planned_peak_allocated_bytes: plan_peak.1,
        snapshot_peak_allocated_bytes: snapshot_peak,
        peak_difference_percent: if snapshot_peak == 0 {
            0.0
        } else {
            100.0 * (plan_peak.1 as f64 - snapshot_peak as f64) / snapshot_peak as f64
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(event: usize, allocated: u64) -> TimelinePoint {
        TimelinePoint {
            event,
            time_us: 0,
            allocated_bytes: allocated,
            reserved_bytes: allocated,
        }
    }

    #[test]
    fn peaks_line_up_and_ends_map_to_ends() {
        let snap = [point(10, 1), point(50, 9), point(110, 2)];
        let plan = [(0, 1), (4, 3), (8, 10), (9, 4), (12, 1)];
        let o = overlay(&snap, &plan).expect("overlay");
        let xs: Vec<f64> = o.points.iter().map(|p| p.0).collect();
        assert_eq!(xs[0], 10.0);
        assert_eq!(xs[2], 50.0); // the planned peak sits on the snapshot's
        assert_eq!(xs[1], 30.0);
        assert_eq!(xs[4], 110.0);
        assert_eq!(xs[3], 50.0 + 60.0 / 4.0);
        assert_eq!(o.planned_peak_allocated_bytes, 10);
        assert_eq!(o.snapshot_peak_allocated_bytes, 9);
        assert!((o.peak_difference_percent - 100.0 / 9.0).abs() < 1e-9);
    }

    #[test]
    fn degenerate_inputs_do_not_divide_by_zero() {
        assert!(overlay(&[], &[(0, 1)]).is_none());
        assert!(overlay(&[point(0, 1)], &[]).is_none());
        let o = overlay(&[point(3, 0)], &[(7, 5)]).expect("one point each");
        assert_eq!(o.points, vec![(3.0, 5)]);
        assert_eq!(o.peak_difference_percent, 0.0);
        // The peak is the last planned point: everything before it maps onto the rise.
        let o = overlay(&[point(0, 1), point(10, 5)], &[(0, 1), (5, 9)]).expect("overlay");
        assert_eq!(o.points, vec![(0.0, 1), (10.0, 9)]);
    }
}
