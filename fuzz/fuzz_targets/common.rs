//! The downstream path every parser feeds: plan a small batch, search a max batch, export.

use vramlab::export::{Format, render};
use vramlab::model::Preset;
use vramlab::plan::search::{Budget, max_batch_capped, sweep_allocated};
use vramlab::plan::{Planner, TrainConfig};
use vramlab::units::Bytes;

/// Plans `preset` under `cfg` at a small batch; any error is fine, a panic is a bug.
pub fn plan_small(preset: &Preset, cfg: &TrainConfig) {
    let Ok(planner) = Planner::new(preset, cfg) else {
        return;
    };
    let batch = cfg.batch.clamp(1, 8);
    if let Ok(plan) = planner.plan(batch) {
        assert!(plan.peak_reserved_bytes >= plan.peak_allocated_bytes);
        for f in Format::ALL {
            let _ = render(f, cfg, &plan, "{}");
        }
    }
    let _ = sweep_allocated(&planner, [1, 2, 1 << 20, u64::MAX]);
    let _ = max_batch_capped(&planner, Bytes::gib(24), 64);
    let budget = Budget {
        capacity: Bytes::gib(80),
        margin: 0.05,
    };
    let _ = vramlab::plan::search::fits(&planner, budget, batch);
}
