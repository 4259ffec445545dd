//! Step time of a candidate: [`crate::plan::timing::estimate`] on the candidate's graph,
//! less the weight-gradient GEMMs of frozen weights (LoRA: the base weights need no
//! gradient, only the input gradient flows through them), plus one more forward of every
//! checkpointed block (recomputed in backward).
//!
//! No communication term: the multi-GPU strategy does not change a candidate's time, so
//! the strategies of a multi-GPU search rank equal in time and their traffic is said in
//! words ([`super::strategy::cost_words`]); the ties go to fewer changes (the user's own
//! strategy).

use serde::Serialize;

use super::super::config::TrainConfig;
use super::super::policy::ParamPolicy;
use super::super::timing::{DeviceProfile, estimate};
use super::super::{DType, Gpu};
use crate::model::Graph;
use crate::model::work::{self, Work};

/// Where the throughput numbers come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Speed {
    pub profile: DeviceProfile,
    /// `true`: measured by `vramlab profile` on the device; `false`: the catalog's
    /// datasheet peak (optimistic: real steps reach a fraction of it).
    pub measured: bool,
}

impl Speed {
    /// The catalog card's datasheet peaks as a profile.
    pub fn catalog(gpu: &Gpu) -> Speed {
        Speed {
            profile: DeviceProfile {
                schema_version: 1,
                device: gpu.name.clone(),
                total_bytes: gpu.memory(),
                usable_bytes: gpu.memory(),
                fp32_tflops: gpu.fp32_tflops,
                tf32_tflops: gpu.fp32_tflops,
                fp16_tflops: gpu.fp16_tflops,
                bf16_tflops: gpu.bf16_tflops,
                d2d_gbps: gpu.bandwidth_gbps,
                h2d_gbps: 0.0,
                versions: Default::default(),
                measured_unix: 0,
            },
            measured: false,
        }
    }

    /// A measured profile.
    pub fn measured(profile: DeviceProfile) -> Speed {
        Speed {
            profile,
            measured: true,
        }
    }

    /// "measured profile of X" or "catalog peak of X".
    pub fn source(&self) -> String {
        if self.measured {
            format!("measured profile of {}", self.profile.device)
        } else {
            format!("datasheet peak of {} (optimistic)", self.profile.device)
        }
    }
}

/// The predicted time of one optimizer step and what checkpointing adds to it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CandidateTime {
    pub step_ms: f64,
    /// Milliseconds of the step spent recomputing checkpointed forwards.
    pub recompute_ms: f64,
    pub ms_per_sample: f64,
}

/// Step time of `cfg` at its micro-batch and accumulation on `speed`'s device.
pub fn step_time(
    g: &Graph,
    policy: &ParamPolicy,
    cfg: &TrainConfig,
    speed: &Speed,
) -> CandidateTime {
    let p = &speed.profile;
    let base = estimate(g, cfg, cfg.batch, p);
    let dtype = cfg.precision.compute_dtype();
    let rate = p.gemm_flops_per_s(dtype).max(1.0);
    let bw = (p.d2d_gbps * 1e9).max(1.0);
    let accum = cfg.accum.max(1) as f64;
    let (mut frozen_flops, mut re_flops, mut re_bytes) = (0.0, 0.0, 0.0);
    for n in &g.nodes {
        let w = work::forward(g, n, cfg.batch);
        if let Work::Gemm { gemm, weight: true } = w
            && n.params.first().is_some_and(|&q| !policy.trainable(q))
        {
            frozen_flops += gemm.flops();
        }
        if cfg.checkpointing && n.block.is_some() {
            re_flops += w.forward_flops();
            if let Work::Traffic { elems } = w {
                re_bytes += elems as f64 * elem_size(dtype) * 2.0;
            }
        }
    }
    let frozen_ms = frozen_flops * accum / rate * 1e3;
    let recompute_ms = (re_flops / rate + re_bytes / bw) * accum * 1e3;
    let step_ms = (base.step_ms - frozen_ms).max(0.0) + recompute_ms;
    let samples = cfg.effective_batch().max(1) as f64;
    CandidateTime {
        step_ms,
        recompute_ms,
        ms_per_sample: step_ms / samples,
    }
}

fn elem_size(d: DType) -> f64 {
    d.size() as f64
}
