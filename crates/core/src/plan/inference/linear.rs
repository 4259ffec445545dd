//! What every forward's projections share: the call's arguments ([`Call`]), the process-wide
//! state ([`Process`]: the cuBLAS workspace, the offloaded modules whose weights accelerate's
//! hooks copy in), and `nn.Linear`'s allocation ([`linear`]).

use super::device_map::{Streams, Sub};
use super::outliers::Int8Outliers;
use super::program::{Buf, Prog};
use crate::plan::config::Attention;
use crate::plan::events::Category;
use crate::plan::policy::QuantStorage;

/// What a forward is called with.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// Query tokens per sequence.
    pub t: u64,
    /// Positions whose logits are computed (`logits_to_keep`; `t` for all).
    pub keep: u64,
    /// Whether generate's 2-D `attention_mask` and (batch, t) `position_ids` are passed:
    /// masks and the rotary embedding built from them have a batch dimension.
    pub padding_mask: bool,
    pub d: u64,
    pub bf16: bool,
    pub imp: Attention,
    /// Sequences in the batch (the bitsandbytes 4-bit kernel's choice depends on the rows).
    pub batch: u64,
    /// bitsandbytes-quantized projections ([`super::quant`]); `None`: `nn.Linear`.
    pub quant: Option<QuantStorage>,
    /// LLM.int8's outlier columns (with `quant` int8).
    pub outliers: Int8Outliers,
    /// A decode forward of generate's `_sample` loop, which runs inside
    /// `_optimize_model_for_decode` (transformers 5.17 `generation/utils.py`): on a GPU a
    /// model whose experts run `grouped_mm` is switched to `batched_mm` until the loop ends
    /// ([`super::moe`]). The prefill and a plain forward keep `grouped_mm`.
    pub decode: bool,
}

/// Process-wide state the first matmul creates, and the offloaded modules whose weights
/// accelerate's hooks copy to the GPU when they run (`device_map` with "cpu" / "disk").
#[derive(Debug, Default)]
pub struct Process {
    pub cublas_ready: bool,
    pub streams: Option<Streams>,
    /// The decoder layer running (`None` outside the layers).
    pub layer: Option<u64>,
    /// An offloaded `Linear8bitLt`'s last GPU copy of its int8 weight and row scales, held by
    /// the module's `MatMul8bitLtState` past its `post_forward` (bitsandbytes 0.50.2
    /// `Linear8bitLt.forward` → `init_8bit_state`: `self.state.CB = self.weight.CB`,
    /// `self.state.SCB = self.weight.SCB`; accelerate's `post_forward` sets only the parameter
    /// to meta), until the module's next call replaces them. Keyed by layer and projection.
    pub int8_held: std::collections::HashMap<(Option<u64>, Sub), Vec<Buf>>,
}

impl Process {
    /// An offloaded module's pre-forward: its parameters copied to the GPU.
    pub(super) fn weights_in(&self, p: &mut Prog, sub: Sub) -> Vec<Buf> {
        self.streams
            .as_ref()
            .map_or_else(Vec::new, |s| s.load(p, self.layer, sub))
    }
}

/// An offloaded module's post-forward: its GPU copies dropped (set back to meta).
pub(super) fn weights_out(p: &mut Prog, w: Vec<Buf>) {
    for b in w {
        p.free(b);
    }
}

/// The cuBLAS workspace, created by the process's first matmul and kept (one handle and
/// stream: inference runs no autograd thread; cublasLt shares it, `CUDABlasHandlePool.cpp`'s
/// unified workspaces). Measured: 32 MiB more allocated after the warm-up than after the
/// build on every row of grid29.
pub const CUBLAS_WORKSPACE: [u64; 1] = [32 << 20];

/// `sub`'s `nn.Linear` with an output of `per_sample` bytes per sequence (an offloaded one's
/// weights live from before the matmul until it returns).
pub(super) fn linear(p: &mut Prog, proc: &mut Process, sub: Sub, per_sample: u64) -> Buf {
    let w = proc.weights_in(p, sub);
    cublas(p, proc);
    let out = p.act(per_sample);
    weights_out(p, w);
    out
}

/// The cuBLAS workspace, on the process's first cuBLAS matmul.
pub(super) fn cublas(p: &mut Prog, proc: &mut Process) {
    if !proc.cublas_ready {
        proc.cublas_ready = true;
        for w in CUBLAS_WORKSPACE {
            p.alloc(0, w, Category::Transient);
        }
    }
}
