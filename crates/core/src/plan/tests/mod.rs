//! The planner's unit tests that need a whole [`Planner`] (the simulator's own tests in
//! `sim/` stay below it, on graphs and events): the GPT-2 preset planned under a config.

mod checkpoint;
mod eval_step;

use crate::model::preset::builtin_presets;
use crate::plan::{Planner, TrainConfig};

/// The built-in GPT-2 preset's planner under `cfg`.
fn gpt2_planner(cfg: &TrainConfig) -> Planner {
    let preset = builtin_presets()
        .expect("presets")
        .into_iter()
        .find(|p| p.id == "gpt2")
        .expect("gpt2");
    Planner::new(&preset, cfg).expect("planner")
}

/// Its peak allocated bytes at `cfg.batch`.
fn gpt2_peak(cfg: &TrainConfig) -> u64 {
    gpt2_planner(cfg)
        .plan(cfg.batch)
        .expect("plan")
        .peak_allocated_bytes
        .0
}
