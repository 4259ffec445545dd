//! Temporaries CUDA kernels allocate for themselves through the caching allocator, which a
//! fake-tensor capture cannot see ([`crate::model::captured_kernels`]). Each rule mirrors
//! the kernel's host code in PyTorch 2.11 and was checked against the per-op measurements
//! of `lab/device/op_temps.py` on the H200 (`peak − before − outputs` around every ATen op;
//! `tests/data/op_temps.jsonl`).

use crate::model::captured_kernels::{AttentionBackend, KernelKind};

/// The device the reduction heuristics are evaluated for: the H200 every capture row was
/// measured on (132 SMs, 2048 threads per SM). Other GPUs split reductions differently;
/// the staging buffer scales with the SM count (≈ 1 MiB per SM at most for wide outputs).
const NUM_SMS: u64 = 132;
const MAX_THREADS_PER_SM: u64 = 2048;
const WARP: u64 = 32;
/// `mnt_wrapper<T>::MAX_NUM_THREADS` for every real dtype.
const MAX_NUM_THREADS: u64 = 512;
/// `sizeof(arg_t)`: float accumulation for float, bf16 and fp16 inputs.
const ACC_BYTES: u64 = 4;

/// `last_pow2` of `Reduce.cuh`: the largest power of two ≤ n (at least 1).
fn last_pow2(n: u64) -> u64 {
    if n <= 1 {
        1
    } else {
        1 << (63 - n.leading_zeros())
    }
}

/// The global-memory staging buffer (+ semaphores) of one `gpu_reduce_kernel` launch, as
/// `setReduceConfig` and `ReduceConfig::global_memory_size` compute it
/// (aten/src/ATen/native/cuda/Reduce.cuh): 0 unless the input is split across blocks.
pub fn reduction_staging(outs: u64, ins: u64, fast_reduced: bool, vec: u64) -> u64 {
    if outs == 0 || ins == 0 {
        return 0;
    }
    // Reducing along the stride-1 dimension: block.x walks the inputs ("vectorize along
    // input" when more than 128 of them); otherwise block.x walks the outputs, `vec` at a time.
    let (mut dim0, dim1, out_vec) = if fast_reduced || outs == 1 {
        (ins, outs, 1)
    } else {
        (outs / vec.max(1), ins, vec.max(1))
    };
    if (fast_reduced || outs == 1) && dim0 > 128 {
        dim0 /= 4;
    }
    let max_threads = MAX_NUM_THREADS / out_vec;
    let p0 = if dim0 < max_threads {
        last_pow2(dim0)
    } else {
        max_threads
    };
    let p1 = if dim1 < max_threads {
        last_pow2(dim1)
    } else {
        max_threads
    };
    let mut bw = p0.min(WARP);
    let bh = p1.min(max_threads / bw);
    bw = p0.min(max_threads / bh);
    let threads = bw * bh;
    let block_x_reduce = fast_reduced || outs == 1;
    let (mut step_in, mut step_out) = (1u64, 1u64);
    if block_x_reduce {
        step_in *= bw;
    } else {
        step_out *= bw;
    }
    let vpt = |s: u64| ins.div_ceil(s);
    let block_y_reduce = vpt(step_in) >= bh * 16 || vpt(step_in) >= 256;
    if block_y_reduce {
        step_in *= bh;
    } else {
        step_out *= bh;
    }
    let target_grid = NUM_SMS * (MAX_THREADS_PER_SM / threads.max(1));
    let grid = (outs / out_vec).div_ceil(step_out);
    let v = vpt(step_in);
    if !(block_y_reduce && v >= 256 && grid <= target_grid) {
        return 0;
    }
    let c1 = target_grid.div_ceil(grid.max(1));
    let c2 = v.div_ceil(16);
    let c3 = v.div_ceil(256);
    let ctas = c1.min(c2).max(c3);
    if ctas <= 1 {
        return 0;
    }
    let mut size = ACC_BYTES * outs * ctas;
    if !block_x_reduce {
        size *= bw * out_vec;
    }
    size + 4 * grid
}

/// The bytes one kernel call allocates for itself at `batch`.
pub fn bytes(kind: &KernelKind, batch: u64) -> u64 {
    match *kind {
        KernelKind::Reduction {
            outs,
            ins,
            fast_reduced,
            vec,
        } => reduction_staging(outs.at(batch), ins.at(batch), fast_reduced, vec),
        KernelKind::Copy { bytes } => bytes.at(batch),
        KernelKind::Attention { backend, bh, s, d } => {
            let bh = bh.at(batch);
            match backend {
                // cuDNN's backward: an fp32 dQ accumulator and the fp32 softmax statistics
                // (measured: B·H·S·(D + 1)·4 bytes, to the 512-byte block).
                AttentionBackend::Cudnn => bh * s * (d + 1) * 4,
                // FlashAttention-2's backward (`_flash_attn_backward`): dq_accum over
                // queries rounded to 128 and head size rounded to 32, fp32; softmax_d
                // (rounded rows); and an fp32 B·H·S·D buffer (measured exactly on two shapes).
                AttentionBackend::Flash => {
                    let sr = s.div_ceil(128) * 128;
                    bh * sr * d.div_ceil(32) * 32 * 4 + bh * s * d * 4 + bh * sr * 4
                }
                // Not measured: no capture row runs it.
                AttentionBackend::Efficient => 0,
            }
        }
    }
}

/// An affine `(per_sample, fixed)` through the call's bytes at `batch` and `2 × batch`:
/// exact at the planned batch, the local slope elsewhere (a reduction's staging stops
/// growing once the grid fills the GPU).
pub fn affine_at(kind: &KernelKind, batch: u64) -> (u64, u64) {
    let b = batch.max(1);
    let (y1, y2) = (bytes(kind, b), bytes(kind, 2 * b));
    let slope = y2.saturating_sub(y1) / b;
    match y1.checked_sub(slope * b) {
        Some(fixed) => (slope, fixed),
        None => (y1 / b, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lab/device/op_temps.py` on the H200 (PyTorch 2.11): the hidden bytes of `sum` over the
    /// leading dimension of a contiguous `[N, C]` bf16 gradient (a Linear's bias gradient)
    /// and of `linalg_vector_norm` over the two spatial dimensions of `[B, H, W, C]`
    /// (ConvNeXt-V2's GRN). Measured values include the 512-byte semaphore block.
    #[test]
    fn reduction_staging_matches_the_measured_kernels() {
        let cases: [(u64, u64, bool, u64, u64); 7] = [
            (768, 6304, false, 4, 38_928_896),
            (3072, 6304, false, 4, 138_412_544),
            (2304, 6304, false, 4, 116_785_664),
            (96, 25088, false, 4, 4_817_408),
            (192, 25088, false, 4, 38_535_680),
            (384, 1568, false, 4, 4_915_712),
            (32 * 384, 56 * 56, false, 4, 138_412_544),
        ];
        for (outs, ins, fast, vec, measured) in cases {
            let got = reduction_staging(outs, ins, fast, vec);
            let rounded = got.div_ceil(512) * 512;
            let err = rounded.abs_diff(measured) as f64 / measured as f64;
            assert!(err < 0.01, "[{ins}, {outs}]: {rounded} vs {measured}");
        }
    }

    #[test]
    fn small_and_row_reductions_need_no_staging() {
        // a loss's mean over 32 values; a softmax-like reduction over the last dimension
        assert_eq!(reduction_staging(1, 32, true, 1), 0);
        assert_eq!(reduction_staging(6304, 768, true, 1), 0);
        assert_eq!(reduction_staging(0, 10, false, 4), 0);
    }

    #[test]
    fn attention_backward_accumulators_match_the_measured_kernels() {
        use crate::model::captured_kernels::Lin;
        let fixed = |n| Lin {
            per_sample: 0,
            fixed: n,
        };
        let cudnn = KernelKind::Attention {
            backend: AttentionBackend::Cudnn,
            bh: fixed(32 * 12),
            s: 197,
            d: 64,
        };
        // (measured 512 bytes more: one small block beside the accumulator)
        assert!(bytes(&cudnn, 1).abs_diff(19_668_992) <= 512);
        let flash = |bh, s, d| KernelKind::Attention {
            backend: AttentionBackend::Flash,
            bh: fixed(bh),
            s,
            d,
        };
        assert_eq!(bytes(&flash(128 * 4, 256, 40), 1), 55_050_240);
        assert_eq!(bytes(&flash(128 * 4, 16, 64), 1), 19_136_512);
    }

    #[test]
    fn affine_is_exact_at_the_planned_batch() {
        use crate::model::captured_kernels::Lin;
        let k = KernelKind::Reduction {
            outs: Lin {
                per_sample: 0,
                fixed: 768,
            },
            ins: Lin {
                per_sample: 197,
                fixed: 0,
            },
            fast_reduced: false,
            vec: 4,
        };
        for b in [1, 8, 32, 200] {
            let (ps, f) = affine_at(&k, b);
            assert_eq!(ps * b + f, bytes(&k, b), "batch {b}");
        }
    }
}
