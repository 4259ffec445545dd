//! The arithmetic of a training step, op by op: the GEMMs each op performs (with their
//! real shapes at a batch size) and the bytes the other ops move. The native bench
//! engine executes exactly these; step-time estimates sum them.

use super::ir::{Graph, Node, Op};

/// `count` independent products `(m × k) · (k × n)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gemm {
    pub count: u64,
    pub m: u64,
    pub k: u64,
    pub n: u64,
}

impl Gemm {
    /// Floating-point operations (2 per multiply-add).
    pub fn flops(&self) -> f64 {
        2.0 * self.count as f64 * self.m as f64 * self.k as f64 * self.n as f64
    }

    /// The input gradient `dA = dC · Bᵀ`: `(m × n) · (n × k)`.
    pub fn dgrad(&self) -> Gemm {
        Gemm {
            k: self.n,
            n: self.k,
            ..*self
        }
    }

    /// The weight gradient `dB = Aᵀ · dC`: `(k × m) · (m × n)`.
    pub fn wgrad(&self) -> Gemm {
        Gemm {
            m: self.k,
            k: self.m,
            ..*self
        }
    }
}

/// What one op computes in the forward pass at a given batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Work {
    /// Nothing runs (views, inputs, constants).
    None,
    /// A GEMM-shaped op (linear, convolution as its im2col GEMM, batched matmul).
    /// `weight`: the B operand is a parameter (its gradient is computed in backward).
    Gemm { gemm: Gemm, weight: bool },
    /// Attention: `Q·Kᵀ` then `P·V` (fused kernels do the same arithmetic).
    Attention { qk: Gemm, pv: Gemm },
    /// Memory-bound work moving about `elems` output elements (elementwise, norms,
    /// softmax, pooling, embedding gathers, depthwise convolutions, the loss).
    Traffic { elems: u64 },
}

impl Work {
    /// Forward FLOPs (0 for traffic).
    pub fn forward_flops(&self) -> f64 {
        match self {
            Work::Gemm { gemm, .. } => gemm.flops(),
            Work::Attention { qk, pv } => qk.flops() + pv.flops(),
            Work::None | Work::Traffic { .. } => 0.0,
        }
    }

    /// Backward FLOPs: input and weight gradient GEMMs; attention backward recomputes
    /// the scores and runs four products (flash-attention's backward).
    pub fn backward_flops(&self) -> f64 {
        match self {
            // Two products: dA and dB (for a weight, dB is its gradient).
            Work::Gemm { gemm, .. } => 2.0 * gemm.flops(),
            Work::Attention { qk, pv } => 2.0 * qk.flops() + 2.0 * pv.flops() + qk.flops(),
            Work::None | Work::Traffic { .. } => 0.0,
        }
    }
}

/// Channel counts below which a grouped convolution is run as memory traffic: cuBLAS
/// GEMMs with a handful of columns measure memory bandwidth, not arithmetic.
const MIN_GEMM_DIM: u64 = 8;

/// The forward work of `node` at `batch`.
pub fn forward(g: &Graph, node: &Node, batch: u64) -> Work {
    let out = &g.tensors[node.output];
    let out_elems = out
        .per_sample
        .saturating_mul(batch)
        .saturating_add(out.fixed);
    let input_per_sample = node.inputs.first().map_or(0, |&t| g.tensors[t].per_sample);
    let weight_elems = node.params.first().map_or(0, |&p| g.params[p].elems);
    match node.op {
        Op::Input | Op::View | Op::Chunk | Op::Constant => Work::None,
        Op::Linear {
            in_features,
            out_features,
        }
        | Op::QuantLinear {
            in_features,
            out_features,
            ..
        }
        | Op::GroupedMm {
            in_features,
            out_features,
        } => {
            let rows = input_per_sample / in_features.max(1);
            Work::Gemm {
                gemm: Gemm {
                    count: 1,
                    m: rows.saturating_mul(batch),
                    k: in_features,
                    n: out_features,
                },
                weight: true,
            }
        }
        Op::Conv2d {
            transposed,
            kernel,
            groups,
            out_channels,
        } => {
            let cout = out_channels.max(1);
            let groups = groups.max(1);
            if transposed {
                // Each input pixel scatters a (cout × k × k) patch: one GEMM over input pixels.
                let cin = (weight_elems / (cout * kernel * kernel).max(1)).max(1);
                let pixels = input_per_sample / cin;
                return Work::Gemm {
                    gemm: Gemm {
                        count: 1,
                        m: pixels.saturating_mul(batch),
                        k: cin,
                        n: cout * kernel * kernel,
                    },
                    weight: true,
                };
            }
            let pixels = out.per_sample / cout;
            let k = weight_elems / cout; // cin / groups × kernel²
            let n = cout / groups;
            if n < MIN_GEMM_DIM || k < MIN_GEMM_DIM {
                return Work::Traffic { elems: out_elems };
            }
            Work::Gemm {
                gemm: Gemm {
                    count: groups,
                    m: pixels.saturating_mul(batch),
                    k,
                    n,
                },
                weight: true,
            }
        }
        Op::Matmul {
            batch: per,
            m,
            k,
            n,
        } => Work::Gemm {
            gemm: Gemm {
                count: per.saturating_mul(batch),
                m,
                k,
                n,
            },
            weight: false,
        },
        Op::Sdpa {
            heads,
            head_dim,
            seq,
            ..
        } => {
            let count = heads.saturating_mul(batch);
            Work::Attention {
                qk: Gemm {
                    count,
                    m: seq,
                    k: head_dim,
                    n: seq,
                },
                pv: Gemm {
                    count,
                    m: seq,
                    k: seq,
                    n: head_dim,
                },
            }
        }
        Op::SdpaBias {
            heads,
            head_dim,
            q_len,
            kv_len,
            ..
        } => {
            let count = heads.saturating_mul(batch);
            Work::Attention {
                qk: Gemm {
                    count,
                    m: q_len,
                    k: head_dim,
                    n: kv_len,
                },
                pv: Gemm {
                    count,
                    m: q_len,
                    k: kv_len,
                    n: head_dim,
                },
            }
        }
        _ => Work::Traffic { elems: out_elems },
    }
}

/// Forward + backward FLOPs of one training step (one micro-batch) at `batch`.
pub fn step_flops(g: &Graph, batch: u64) -> f64 {
    g.nodes
        .iter()
        .map(|n| {
            let w = forward(g, n, batch);
            w.forward_flops() + w.backward_flops()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::families::transformer::AttnImpl;
    use crate::model::preset::find_builtin;

    fn graph(id: &str, size: u64) -> Graph {
        let p = find_builtin(id).expect("preset");
        p.build(size, AttnImpl::Sdpa).expect("graph")
    }

    #[test]
    fn gpt2_flops_match_6nd_rule() {
        // Training FLOPs of a decoder ≈ 6 · params · tokens + attention (12·L·s²·d per sample).
        let g = graph("gpt2", 1024);
        let tokens = 1024.0;
        let params = g.param_count() as f64;
        let attn = 12.0 * 12.0 * tokens * tokens * 768.0;
        let expect = 6.0 * params * tokens + attn;
        let got = step_flops(&g, 1);
        // Embeddings have no GEMM FLOPs, the tied LM head has (50257 × 768 counted once).
        let rel = (got - expect).abs() / expect;
        assert!(rel < 0.10, "got {got:e} expected ≈{expect:e} ({rel:.3})");
    }

    #[test]
    fn resnet50_forward_is_4_1_gflops() {
        // torchvision reports 4.09 GFLOPS (multiply-adds) for resnet50 at 224².
        let g = graph("resnet50", 224);
        let fwd: f64 = g
            .nodes
            .iter()
            .map(|n| forward(&g, n, 1).forward_flops())
            .sum();
        let gmacs = fwd / 2.0 / 1e9;
        assert!((gmacs - 4.09).abs() < 0.1, "{gmacs} GMACs");
    }

    #[test]
    fn flops_scale_linearly_with_batch() {
        let g = graph("resnet18", 224);
        let a = step_flops(&g, 1);
        let b = step_flops(&g, 8);
        assert!((b / a - 8.0).abs() < 1e-9);
    }

    #[test]
    fn depthwise_convolutions_are_traffic() {
        let g = graph("mobilenet_v3_small", 224);
        let dw = g
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::Conv2d { groups, .. } if groups > 1));
        let dw = dw.expect("a depthwise conv");
        assert!(matches!(forward(&g, dw, 2), Work::Traffic { .. }));
    }
}
