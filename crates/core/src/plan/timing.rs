//! Step-time estimates from a measured device profile: a roofline sum over the ops of
//! one training step — GEMM FLOPs at the device's measured GEMM rate for the compute
//! dtype, memory-bound ops at its measured device-to-device bandwidth.

use serde::{Deserialize, Serialize};

use super::config::{DType, TrainConfig};
use crate::model::Graph;
use crate::model::work::{self, Work};
use crate::units::Bytes;

/// What `vramlab profile` measured on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceProfile {
    pub schema_version: u32,
    pub device: String,
    pub total_bytes: Bytes,
    /// Largest sum of allocations that succeeded (chunks until OOM).
    pub usable_bytes: Bytes,
    /// Dense GEMM throughput (TFLOP/s) at the measured size.
    pub fp32_tflops: f64,
    pub tf32_tflops: f64,
    pub fp16_tflops: f64,
    pub bf16_tflops: f64,
    /// Device-to-device copy bandwidth (GB/s, read + write counted).
    pub d2d_gbps: f64,
    /// Host-to-device bandwidth from pageable memory (GB/s).
    pub h2d_gbps: f64,
    /// Driver, CUDA and cuBLAS versions.
    #[serde(default)]
    pub versions: std::collections::BTreeMap<String, String>,
    /// Unix seconds when measured.
    pub measured_unix: u64,
}

impl DeviceProfile {
    /// GEMM rate for the compute dtype (FLOP/s).
    pub fn gemm_flops_per_s(&self, dtype: DType) -> f64 {
        1e12 * match dtype {
            DType::F16 => self.fp16_tflops,
            DType::BF16 => self.bf16_tflops,
            _ => self.fp32_tflops,
        }
    }
}

/// The share of a training step's FLOPs that one forward pass is: backward costs about
/// twice the forward (the input-gradient and the weight-gradient GEMM per forward GEMM),
/// so a step is ~3 forwards and activation checkpointing, which runs every checkpointed
/// block's forward once more in backward, adds up to a third.
pub const FORWARD_SHARE_OF_STEP: f64 = 1.0 / 3.0;

/// Activation checkpointing's compute cost in words: the one place vramlab quotes it (the
/// remedies, the fit search's costs, the GUI's tooltip). `estimate`: this model's extra step
/// time as a fraction, from the timing model (`fit::cost::step_time`'s `recompute_ms`:
/// the recomputed blocks' GEMM FLOPs and elementwise traffic, so it can exceed the FLOP
/// share); without one, the FLOP share [`FORWARD_SHARE_OF_STEP`].
pub fn checkpointing_cost(estimate: Option<f64>) -> String {
    match estimate {
        Some(f) => format!(
            "checkpointing recomputes each block's forward in backward: +{:.0} % step time",
            100.0 * f
        ),
        None => format!(
            "checkpointing recomputes each block's forward in backward: one more forward pass, \
             up to +{:.0} % compute (a forward is a third of a training step's FLOPs; `vramlab \
             fit` estimates the step time per model)",
            100.0 * FORWARD_SHARE_OF_STEP
        ),
    }
}

/// An estimate of one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepTime {
    /// Forward + backward of all micro-batches, plus the optimizer update.
    pub step_ms: f64,
    pub gemm_ms: f64,
    pub memory_ms: f64,
    pub flops: f64,
}

/// Estimates the step time of `cfg` at micro-batch `batch` on `profile`'s device.
pub fn estimate(g: &Graph, cfg: &TrainConfig, batch: u64, profile: &DeviceProfile) -> StepTime {
    let dtype = cfg.precision.compute_dtype();
    let e = dtype.size() as f64;
    let rate = profile.gemm_flops_per_s(dtype).max(1.0);
    let bw = (profile.d2d_gbps * 1e9).max(1.0);
    let mut flops = 0.0;
    let mut bytes = 0.0;
    for n in &g.nodes {
        let w = work::forward(g, n, batch);
        flops += w.forward_flops() + w.backward_flops();
        if let Work::Traffic { elems } = w {
            // Forward reads and writes once; backward reads two and writes one.
            bytes += elems as f64 * e * 5.0;
        }
        if let crate::model::ir::Op::QuantLinear {
            in_features,
            out_features,
            int8,
        } = n.op
        {
            // bitsandbytes dequantizes the weight in forward and again in backward (for the
            // input gradient): read the packed weight, write a compute-dtype copy, per
            // micro-batch whatever its size.
            let packed = if int8 { 1.0 } else { 0.5 };
            bytes += 2.0 * (in_features * out_features) as f64 * (packed + e);
        }
    }
    let accum = cfg.accum.max(1) as f64;
    // The update reads and writes parameters, gradients and state (~4 tensors).
    let params = g.param_count() as f64 * cfg.precision.param_dtype().size() as f64;
    let update = params * 8.0;
    let gemm_s = flops * accum / rate;
    let mem_s = (bytes * accum + update) / bw;
    StepTime {
        step_ms: (gemm_s + mem_s) * 1e3,
        gemm_ms: gemm_s * 1e3,
        memory_ms: mem_s * 1e3,
        flops: flops * accum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::families::transformer::AttnImpl;
    use crate::model::preset::find_builtin;

    fn profile() -> DeviceProfile {
        DeviceProfile {
            schema_version: 1,
            device: "test".into(),
            total_bytes: Bytes(80 << 30),
            usable_bytes: Bytes(79 << 30),
            fp32_tflops: 50.0,
            tf32_tflops: 400.0,
            fp16_tflops: 700.0,
            bf16_tflops: 700.0,
            d2d_gbps: 3000.0,
            h2d_gbps: 20.0,
            versions: Default::default(),
            measured_unix: 0,
        }
    }

    #[test]
    fn low_precision_is_faster_and_accumulation_scales() {
        let p = find_builtin("gpt2").expect("preset");
        let g = p.build(1024, AttnImpl::Sdpa).expect("graph");
        let fp32 = TrainConfig {
            precision: super::super::Precision::Fp32,
            ..TrainConfig::default()
        };
        let bf16 = TrainConfig {
            precision: super::super::Precision::AmpBf16,
            ..TrainConfig::default()
        };
        let a = estimate(&g, &fp32, 8, &profile());
        let b = estimate(&g, &bf16, 8, &profile());
        assert!(b.step_ms < a.step_ms / 3.0, "{a:?} {b:?}");
        let acc = TrainConfig { accum: 4, ..bf16 };
        let c = estimate(&g, &acc, 8, &profile());
        assert!(c.gemm_ms > 3.9 * b.gemm_ms && c.gemm_ms < 4.1 * b.gemm_ms);
    }
}
