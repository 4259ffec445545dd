//! Multi-GPU answers over the planner: the host memory each rank needs for CPU offload,
//! the fewest GPUs of a card that run a configuration with a strategy, the best strategy
//! for a world, and DeepSpeed's own model-state estimators (for comparison).

use serde::Serialize;

use super::distributed::{Distributed, Offload, Strategy};
use super::optimizer::state_bytes;
use super::search::{Budget, fits, max_batch};
use super::{PlanError, Planner, TrainConfig};
use crate::model::Preset;
use crate::units::Bytes;

/// Host (CPU) memory one rank needs for what is offloaded: the optimizer state and an fp32
/// copy of the gradients it steps on (DeepSpeed's `offload_optimizer`, FSDP's
/// `CPUOffloadPolicy`), plus an fp32 master copy when the parameters train in 16 bits;
/// with parameter offload, the parameters' shard too. Pinned buffers count once.
pub fn host_bytes(planner: &Planner) -> Bytes {
    let d = planner.config.distributed;
    if d.offload == Offload::None {
        return Bytes::ZERO;
    }
    let g = &planner.graph;
    let sh = d.shards();
    let storage = d.module_precision(planner.config.precision).param_dtype();
    let mut total = 0u64;
    for p in &g.params {
        let state = state_bytes(planner.config.optimizer, p, storage).total();
        let grads = p.elems * 4;
        let master = if storage.size() < 4 { p.elems * 4 } else { 0 };
        total = total.saturating_add(sh.state.of(state + grads + master));
        if d.offload == Offload::Params {
            total = total.saturating_add(sh.params.of(p.elems * storage.size()));
        }
    }
    Bytes(total)
}

/// The fewest GPUs (one node up to 8, then nodes of `gpus_per_node`) of the budget's card
/// that run `cfg`'s micro-batch with `strategy`, with the largest micro-batch there.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FewestGpus {
    pub gpus: u64,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub strategy: Strategy,
    /// Largest micro-batch per GPU at that world.
    pub max_batch: Option<u64>,
    /// micro × accumulation × world.
    pub global_batch: u64,
}

/// Searches worlds 1, 2, …, `max_gpus` (on one node while `gpus_per_node` allows, then
/// whole nodes) for the first where `cfg.batch` fits. `None` when none does.
pub fn fewest_gpus(
    preset: &Preset,
    cfg: &TrainConfig,
    strategy: Strategy,
    gpus_per_node: u32,
    max_gpus: u64,
    budget: Budget,
) -> Result<Option<FewestGpus>, PlanError> {
    let per_node = u64::from(gpus_per_node.max(1));
    let mut worlds: Vec<u64> = (1..=per_node.min(max_gpus)).collect();
    let mut n = 2 * per_node;
    while n <= max_gpus {
        worlds.push(n);
        n += per_node;
    }
    for world in worlds {
        let (nodes, gpn) = if world <= per_node {
            (1, world)
        } else {
            (world / per_node, per_node)
        };
        let mut c = *cfg;
        c.distributed = Distributed {
            nodes: u32::try_from(nodes).unwrap_or(u32::MAX),
            gpus_per_node: u32::try_from(gpn).unwrap_or(u32::MAX),
            strategy,
            ..cfg.distributed
        };
        if c.distributed.validate().is_err() {
            continue;
        }
        let planner = Planner::new(preset, &c)?;
        if fits(&planner, budget, c.batch)? {
            return Ok(Some(FewestGpus {
                gpus: world,
                nodes: c.distributed.nodes,
                gpus_per_node: c.distributed.gpus_per_node,
                strategy,
                max_batch: max_batch(&planner, budget, super::config::MAX_BATCH)?,
                global_batch: c.global_batch(),
            }));
        }
    }
    Ok(None)
}

/// For a world of `gpus`, each multi-GPU strategy's largest micro-batch per GPU (the
/// strategies that fit nothing have `None`), in [`Strategy::MULTI`] order.
pub fn strategies_at(
    preset: &Preset,
    cfg: &TrainConfig,
    gpus: u32,
    budget: Budget,
) -> Result<Vec<(Strategy, Option<u64>)>, PlanError> {
    let mut out = Vec::new();
    for st in Strategy::MULTI {
        let mut c = *cfg;
        c.distributed = Distributed {
            gpus_per_node: gpus,
            nodes: 1,
            strategy: st,
            offload: Offload::None,
            ..cfg.distributed
        };
        let planner = Planner::new(preset, &c)?;
        out.push((st, max_batch(&planner, budget, super::config::MAX_BATCH)?));
    }
    Ok(out)
}

/// DeepSpeed's `estimate_zero2_model_states_mem_needs(total_params, num_gpus_per_node,
/// num_nodes, cpu_offload, additional_buffer_factor=1.5)` (`deepspeed/runtime/zero/
/// stage_1_and_2.py`, DeepSpeed 0.19.8): (cpu bytes, gpu bytes) of model states only —
/// 16-bit parameters whole (2 bytes per parameter), and partitioned 18 bytes per parameter:
/// 16-bit and fp32 gradients, fp32 master weights, Adam's two moments.
pub fn ds_zero2_model_states(
    total_params: u64,
    gpus_per_node: u64,
    nodes: u64,
    cpu_offload: bool,
) -> (u64, u64) {
    let total_gpus = (gpus_per_node * nodes).max(1) as f64;
    let p = total_params as f64;
    let (cpu, gpu) = if cpu_offload {
        (p * (4.0 * total_gpus).max(16.0) * 1.5, 2.0 * p)
    } else {
        (
            p * 4.0 * gpus_per_node as f64 * 1.5,
            2.0 * p + (18.0 * p / total_gpus).trunc(),
        )
    };
    (cpu as u64, gpu as u64)
}

/// DeepSpeed's `estimate_zero3_model_states_mem_needs(total_params, largest_layer_params,
/// num_gpus_per_node, num_nodes, cpu_offload, cpu_offload_params, zero_init,
/// additional_buffer_factor=1.5)` (`deepspeed/runtime/zero/stage3.py`): (cpu, gpu).
pub fn ds_zero3_model_states(
    total_params: u64,
    largest_layer_params: u64,
    gpus_per_node: u64,
    nodes: u64,
    offload: Offload,
    zero_init: bool,
) -> (u64, u64) {
    let total_gpus = (gpus_per_node * nodes).max(1) as f64;
    let gpus_factor = 1.0 / nodes.max(1) as f64;
    let p = total_params as f64;
    let largest = 4.0 * largest_layer_params as f64;
    let g = gpus_per_node as f64;
    let (cpu, gpu) = match offload {
        Offload::Params => (
            if zero_init {
                p * 18.0 * gpus_factor * 1.5
            } else {
                p * (4.0 * g).max(18.0 * gpus_factor) * 1.5
            },
            largest,
        ),
        Offload::Optimizer => (
            if zero_init {
                p * 16.0 * gpus_factor * 1.5
            } else {
                p * (4.0 * g).max(16.0 * gpus_factor) * 1.5
            },
            largest + (2.0 * p / total_gpus).trunc(),
        ),
        Offload::None => (
            if zero_init {
                largest_layer_params as f64 * 4.0 * g * 1.5
            } else {
                p * 4.0 * g * 1.5
            },
            largest + (18.0 * p / total_gpus).trunc(),
        ),
    };
    (cpu as u64, gpu as u64)
}

/// One cell of [`fit_table`]: the strategy with the largest micro-batch per GPU (ties go
/// to the simpler strategy, in [`Strategy::MULTI`] order), or `None` when nothing fits.
pub fn best_strategy(
    preset: &Preset,
    cfg: &TrainConfig,
    gpus: u32,
    budget: Budget,
) -> Result<Option<(Strategy, u64)>, PlanError> {
    if gpus <= 1 {
        let mut c = *cfg;
        c.distributed = Distributed {
            strategy: Strategy::None,
            nodes: 1,
            gpus_per_node: 1,
            offload: Offload::None,
            mixed_precision: super::distributed::FsdpMixedPrecision::None,
            ..cfg.distributed
        };
        let planner = Planner::new(preset, &c)?;
        return Ok(
            max_batch(&planner, budget, super::config::MAX_BATCH)?.map(|b| (Strategy::None, b))
        );
    }
    let mut best: Option<(Strategy, u64)> = None;
    for (st, b) in strategies_at(preset, cfg, gpus, budget)? {
        if let Some(b) = b
            && best.is_none_or(|(_, bb)| b > bb)
        {
            best = Some((st, b));
        }
    }
    Ok(best)
}

/// A markdown table: for each model and card, the best strategy and its largest
/// micro-batch per GPU on 1, 2, 4 and 8 GPUs (global batch = micro × world).
pub fn fit_table(
    models: &[Preset],
    cards: &[super::gpus::Gpu],
    worlds: &[u32],
    cfg: &TrainConfig,
    margin: f64,
) -> Result<String, PlanError> {
    let mut s = String::from("| model | card |");
    for w in worlds {
        s.push_str(&format!(" {w} × GPU |"));
    }
    s.push_str("\n|---|---|");
    for _ in worlds {
        s.push_str("---|");
    }
    s.push('\n');
    for m in models {
        for card in cards {
            let budget = Budget {
                capacity: card.memory(),
                margin,
            };
            s.push_str(&format!("| {} | {} |", m.display_name, card.name));
            for &w in worlds {
                let cell = match best_strategy(m, cfg, w, budget)? {
                    Some((st, b)) => format!(
                        " {} b{b} (global {})",
                        st.label(),
                        b.saturating_mul(u64::from(w))
                    ),
                    None => " does not fit".to_string(),
                };
                s.push_str(&cell);
                s.push_str(" |");
            }
            s.push('\n');
        }
    }
    Ok(s)
}
