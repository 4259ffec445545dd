//! Unit tests of `trace` (the timeline of a planned call, thinned).

use super::*;
use crate::plan::config::{Attention, DType};
use crate::plan::inference::{InferConfig, InferPlanner, InferStep, KvCache};

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
