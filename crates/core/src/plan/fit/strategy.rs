//! The strategy axis of "make it fit": for a plan on more than one GPU, the other
//! multi-GPU strategies on the same GPUs that the user's other multi-GPU settings allow, and
//! the words for what a switch changes and costs. A one-GPU plan's axis is its own strategy
//! alone (the search is unchanged).
//!
//! Step time does not depend on the strategy: the planner's timing has no communication
//! term and this module invents no bandwidth, so every strategy ranks equal in time and the
//! communication a switch adds is said in words ([`cost_words`]).

use super::super::distributed::{Distributed, FsdpMixedPrecision, Offload, Strategy};

/// The strategies the search tries for `d`: `d`'s own first, then, when it runs on more
/// than one GPU, every other [`Strategy::MULTI`] strategy that [`allows`] accepts.
pub fn strategies(d: &Distributed) -> Vec<Strategy> {
    let mut out = vec![d.strategy];
    if d.world() < 2 || !d.active() {
        return out;
    }
    for st in Strategy::MULTI {
        if !out.contains(&st) && allows(d, st) {
            out.push(st);
        }
    }
    out
}

/// Whether `d`'s settings other than its strategy hold under `st` (what the CLI and the
/// measurement rows reject otherwise): CPU offload only where state is sharded outside
/// `ZeroRedundancyOptimizer` (parameter offload only where parameters are sharded), FSDP2's
/// `reshard_after_forward` and `MixedPrecisionPolicy` only under FSDP2, DDP's reducer
/// knobs only under DDP and PyTorch's ZeRO-1, DeepSpeed's knobs only under ZeRO-1/2/3 (the
/// stage-3 ones under ZeRO-3, `allgather_bucket_size` under stages 1/2).
pub fn allows(d: &Distributed, st: Strategy) -> bool {
    let def = Distributed::default();
    let offload_ok = match d.offload {
        Offload::None => true,
        Offload::Optimizer => st.can_offload(),
        Offload::Params => st.can_offload() && st.shards_params(),
    };
    let fsdp_set = !d.reshard_after_forward || d.mixed_precision != FsdpMixedPrecision::None;
    let ddp_set = d.bucket_cap_mb != def.bucket_cap_mb
        || d.gradient_as_bucket_view != def.gradient_as_bucket_view;
    let stage3_set = d.prefetch_elems != def.prefetch_elems
        || d.max_live_params != def.max_live_params
        || d.persistence_threshold != def.persistence_threshold
        || d.max_reuse_distance.is_some();
    offload_ok
        && (!fsdp_set || st == Strategy::Fsdp2)
        && (!ddp_set || st.uses_ddp())
        && (!d.deepspeed_knobs_set() || st.is_deepspeed())
        && (!stage3_set || st == Strategy::Zero3)
        && (d.allgather_bucket_elems.is_none() || matches!(st, Strategy::Zero1 | Strategy::Zero2))
}

/// "strategy ddp → zero3 (DeepSpeed ZeRO-3)".
pub fn change_word(user: Strategy, k: Strategy) -> String {
    let what = match k {
        Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => format!("DeepSpeed {}", k.label()),
        _ => k.label().to_string(),
    };
    format!("strategy {user} → {k} ({what})")
}

/// What running `k` instead of `user` costs in communication per step and in code, in
/// words. Volumes per rank per step, in units of the (trainable) parameter bytes Ψ, ring
/// collectives: DDP all-reduces the gradients (2Ψ); DeepSpeed ZeRO-1/2 reduce-scatter the
/// gradients and all-gather the updated parameters (2Ψ, DDP's); PyTorch's
/// `ZeroRedundancyOptimizer` keeps DDP's all-reduce and broadcasts every updated parameter
/// from its owner after the step (+Ψ); ZeRO-3 and FSDP2 all-gather the parameters in forward
/// and again in backward and reduce-scatter the gradients (3Ψ; FSDP2 without
/// `reshard_after_forward` skips the backward gather: 2Ψ).
pub fn cost_words(user: &Distributed, k: Strategy) -> Vec<String> {
    if k == user.strategy {
        return Vec::new();
    }
    let keeps_gathered = k == Strategy::Fsdp2 && !user.reshard_after_forward;
    let traffic = match k {
        Strategy::Ddp => "gradients all-reduced in buckets during backward".to_string(),
        Strategy::TorchZero1 => "DDP's gradient all-reduce, then every updated parameter \
                                 broadcast from the rank that owns it after the step: about \
                                 1.5× DDP's traffic"
            .to_string(),
        Strategy::Zero1 | Strategy::Zero2 => "gradients reduce-scattered, updated parameters \
                                              all-gathered after the step: the same traffic as \
                                              DDP's all-reduce"
            .to_string(),
        Strategy::Fsdp2 if keeps_gathered => "parameters all-gathered per block in forward and \
                                              kept for backward (reshard_after_forward=False), \
                                              gradients reduce-scattered: the same traffic as \
                                              DDP's all-reduce"
            .to_string(),
        Strategy::Zero3 | Strategy::Fsdp2 => "parameters all-gathered per block in forward and \
                                              again in backward, gradients reduce-scattered: \
                                              about 1.5× DDP's traffic, and the gathers sit on \
                                              the critical path unless prefetched"
            .to_string(),
        Strategy::None => "no communication".to_string(),
    };
    let code = match k {
        Strategy::Ddp => "code: DistributedDataParallel(model) under torchrun".to_string(),
        Strategy::TorchZero1 => "code: keep DDP, wrap the optimizer in \
                                 ZeroRedundancyOptimizer(params, optimizer_class=...)"
            .to_string(),
        Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => format!(
            "code: a DeepSpeed config with zero_optimization.stage {} (vramlab export \
             --format deepspeed), deepspeed.initialize in place of the optimizer loop",
            k.zero_stage()
        ),
        Strategy::Fsdp2 => "code: fully_shard(block) for every block, then fully_shard(model) \
                            (vramlab export --format fsdp2)"
            .to_string(),
        Strategy::None => "code: one process".to_string(),
    };
    vec![
        format!(
            "{}: {traffic} (step time here counts no communication)",
            k.label()
        ),
        code,
    ]
}
