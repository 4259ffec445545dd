//! Runs `reps` cold plans (graph + events + full evaluation, as `vramlab plan` does), for
//! instruction counts: the difference between two `reps` under
//! `valgrind --tool=callgrind` is the cost of the plans alone.
//!
//! cargo run --release --example cold_plan -- Llama-2-7b-hf 10

use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::{Planner, TrainConfig};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let id = a.first().map_or("Llama-2-7b-hf", String::as_str);
    let reps: usize = a.get(1).map_or(Ok(1), |r| r.parse())?;
    let preset = find_builtin(id)?;
    let cfg = TrainConfig::default();
    for _ in 0..reps {
        std::hint::black_box(Planner::new(&preset, &cfg)?.plan(cfg.batch)?);
    }
    Ok(())
}
