//! Multi-GPU strategies as what-if remedies: for a plan that already runs on more than one
//! GPU, the other strategies on the same GPUs, CPU offload, and FSDP2's options. A
//! one-GPU plan gets none of these (its remedies stay what they were); "the fewest GPUs
//! that fit" is [`super::multi_gpu::fewest_gpus`].

use super::config::TrainConfig;
use super::distributed::{FsdpMixedPrecision, Offload, Strategy};

/// (name, one-sentence description, changed config) for a multi-GPU `cfg`.
pub fn candidates(cfg: &TrainConfig) -> Vec<(&'static str, String, TrainConfig)> {
    let d = cfg.distributed;
    let mut out = Vec::new();
    if !d.active() || d.world() < 2 {
        return out;
    }
    let world = d.world();
    let switch = |st: Strategy| {
        let mut c = *cfg;
        c.distributed.strategy = st;
        c.distributed.offload = Offload::None;
        c
    };
    // In `Strategy::MULTI` order (DDP itself is never a saving; ZeRO-3 is FSDP2's memory).
    let zro = if d.strategy == Strategy::Ddp {
        "keep DDP, wrap the optimizer in ZeroRedundancyOptimizer (each rank holds the state of its own parameters)"
    } else {
        "DDP + ZeroRedundancyOptimizer (PyTorch's ZeRO-1: each rank holds the optimizer state of its own whole parameters; parameters and gradients replicated)"
    };
    for (st, name, what) in [
        (
            Strategy::TorchZero1,
            "ZeroRedundancyOptimizer (same GPUs)",
            zro,
        ),
        (
            Strategy::Zero1,
            "ZeRO-1 (same GPUs)",
            "partition the optimizer state (DeepSpeed stage 1)",
        ),
        (
            Strategy::Zero2,
            "ZeRO-2 (same GPUs)",
            "partition optimizer state and gradients (DeepSpeed stage 2, FSDP SHARD_GRAD_OP)",
        ),
        (
            Strategy::Fsdp2,
            "FSDP2 (same GPUs)",
            "fully_shard every block and the root: parameters, gradients and state sharded",
        ),
    ] {
        if d.strategy != st && !(st == Strategy::Fsdp2 && d.strategy == Strategy::Zero3) {
            out.push((name, format!("On {world} GPUs: {what}."), switch(st)));
        }
    }
    if d.strategy == Strategy::Fsdp2 && d.mixed_precision == FsdpMixedPrecision::None {
        let mut c = *cfg;
        c.distributed.mixed_precision = FsdpMixedPrecision::Bf16;
        out.push((
            "FSDP2 bf16 MixedPrecisionPolicy",
            "MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): bf16 gathered copies and activations, fp32 sharded state."
                .to_string(),
            c,
        ));
    }
    if d.strategy.can_offload() && d.offload == Offload::None {
        let mut c = *cfg;
        c.distributed.offload = Offload::Optimizer;
        out.push((
            "Offload optimizer to CPU",
            "Optimizer state and its step on the CPU (DeepSpeed offload_optimizer / FSDP CPUOffloadPolicy); needs host RAM per rank."
                .to_string(),
            c,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::distributed::Distributed;

    #[test]
    fn single_gpu_gets_no_strategy_remedies() {
        assert!(candidates(&TrainConfig::default()).is_empty());
        let cfg = TrainConfig {
            distributed: Distributed::new(4, Strategy::Ddp),
            ..TrainConfig::default()
        };
        let names: Vec<&str> = candidates(&cfg).iter().map(|c| c.0).collect();
        assert!(names.contains(&"FSDP2 (same GPUs)"), "{names:?}");
        assert!(!names.contains(&"Offload optimizer to CPU"));
        assert!(
            names.contains(&"ZeroRedundancyOptimizer (same GPUs)"),
            "{names:?}"
        );
        // Offered to the DeepSpeed and FSDP2 strategies too, after nothing simpler.
        let cfg3 = TrainConfig {
            distributed: Distributed::new(4, Strategy::Zero3),
            ..TrainConfig::default()
        };
        let names3: Vec<&str> = candidates(&cfg3).iter().map(|c| c.0).collect();
        assert_eq!(
            names3[..3],
            [
                "ZeroRedundancyOptimizer (same GPUs)",
                "ZeRO-1 (same GPUs)",
                "ZeRO-2 (same GPUs)"
            ],
            "{names3:?}"
        );
        // PyTorch's ZeRO-1 cannot offload: no offload remedy, every candidate valid.
        let cfg = TrainConfig {
            distributed: Distributed::new(4, Strategy::TorchZero1),
            ..TrainConfig::default()
        };
        let cands = candidates(&cfg);
        assert!(cands.iter().all(|c| c.0 != "Offload optimizer to CPU"));
        assert!(
            cands
                .iter()
                .all(|c| c.0 != "ZeroRedundancyOptimizer (same GPUs)")
        );
        for (name, _, c) in &cands {
            assert!(c.validate().is_ok(), "{name}");
        }
    }
}
