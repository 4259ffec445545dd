//! The shown run's multi-GPU world: how it ran (torchrun, or rank 0 emulated) and what
//! every rank measured in the shown trial, with the max over the ranks.

use egui::{RichText, Ui};

use vramlab_core::units::Bytes;
use vramlab_device::bench::{Run, Trial};

fn gib(b: Option<Bytes>) -> String {
    b.map_or("–".into(), |b| {
        format!("{:.2} GiB", b.0 as f64 / (1u64 << 30) as f64)
    })
}

/// One line per rank of `trial`: "rank 1: allocated 3.20 GiB · reserved 3.50 GiB · nvml –".
pub fn rank_lines(trial: &Trial) -> Vec<String> {
    let mut lines: Vec<String> = trial
        .ranks
        .iter()
        .map(|r| {
            format!(
                "rank {}: allocated {} · reserved {} · nvml {}{}",
                r.rank,
                gib(r.peak_allocated),
                gib(r.peak_reserved),
                gib(r.nvml_used),
                if r.oom { " · OOM" } else { "" }
            )
        })
        .collect();
    if trial.ranks.len() > 1 {
        lines.push(format!(
            "max over {} ranks: allocated {} · reserved {}",
            trial.ranks.len(),
            gib(trial.max_rank_allocated()),
            gib(trial.max_rank_reserved())
        ));
    }
    lines
}

/// The world section of a distributed run (nothing for one GPU). `trial`: the shown one.
pub fn world_ui(run: &Run, trial: Option<&Trial>, ui: &mut Ui) {
    let d = &run.config.distributed;
    if !d.active() {
        return;
    }
    let trial = trial
        .filter(|t| !t.ranks.is_empty())
        .or_else(|| run.trials.iter().rev().find(|t| !t.ranks.is_empty()));
    let how = run
        .trials
        .iter()
        .find_map(|t| t.world.as_ref())
        .map_or_else(
            || {
                format!(
                    "world {} · {} · no trial yet",
                    d.world(),
                    d.strategy.as_str()
                )
            },
            |w| w.describe(),
        );
    ui.label(RichText::new(how).strong()).on_hover_text(
        "The headline peaks are rank 0's, the rank the planner plans; under torchrun every rank is measured",
    );
    if let Some(t) = trial {
        ui.label(RichText::new(format!("Ranks at batch {}", t.batch)).weak());
        for line in rank_lines(t) {
            ui.label(line);
        }
    }
}
