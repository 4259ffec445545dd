//! Inference with bitsandbytes-quantized weights (issue 29): a model loaded with
//! `from_pretrained(folder, dtype=dtype, quantization_config=BitsAndBytesConfig(...))` —
//! nf4 / fp4 (`load_in_4bit`, with or without `bnb_4bit_use_double_quant`,
//! `bnb_4bit_compute_dtype=dtype`) or LLM.int8 (`load_in_8bit`) — and its forwards.
//!
//! Which modules (transformers 5.17):
//! - `quantizers/base.py` `get_keys_to_not_convert`: the tied weights, the last parameter and
//!   the output embedding keep the dtype (the decoders' `lm_head`); the embedding and the
//!   norms are no `nn.Linear`. `integrations/bitsandbytes.py` `replace_with_bnb_linear`
//!   replaces every other `nn.Linear` (q/k/v/o, gate/up/down, Phi-3's fused ones) by
//!   `bnb.nn.Linear4bit` / `bnb.nn.Linear8bitLt` (`has_fp16_weights=False`, threshold 6.0).
//!   Biases stay in the dtype.
//! - `quantizer_bnb_4bit.py` / `quantizer_bnb_8bit.py` `update_device_map`: without a
//!   `device_map` the whole model goes to the current CUDA device (`{"": 0}`); the dtype is
//!   the `dtype=` given (no `update_dtype` override), so int8 with `dtype=torch.float32` is
//!   a float32 model with int8 linears.
//!
//! What `from_pretrained` allocates ([`QuantModel::load`]): `modeling_utils.py`
//! `caching_allocator_warmup` first allocates and frees one fp16 tensor of the model's bytes
//! as `param_element_size` counts them (0.5 byte per 4-bit weight element, 1 per int8
//! one, the dtype's size for the rest; a tied weight once), so the pool starts with one
//! segment of about the quantized model; then `core_model_loading.py`
//! `convert_and_load_state_dict_in_model` loads the checkpoint's tensors one by one in
//! `dot_natural_key` order, synchronously (on-the-fly quantization uses no thread pool): each
//! tensor to the GPU in the dtype, a quantized weight then converted and its dtype copy
//! dropped:
//! - 4-bit (`Bnb4bitQuantize.convert` → `Params4bit._quantize` → `functional.quantize_4bit`,
//!   bitsandbytes 0.50.2): the CUDA `quantize_4bit` op's fp32 absmax per 64 elements and the
//!   packed weight, the 16-entry code (`get_4bit_type`); with double quantization
//!   `offset = absmax.mean()`, `absmax - offset` (a temporary), `quantize_blockwise(...,
//!   blocksize=256)` (its fp32 absmax per 256 blocks and the uint8 absmax; the 256-entry
//!   dynamic map cached once per process, `name2qmap`, and a copy per weight), then the fp32
//!   absmax dropped;
//! - int8 (`Bnb8bitQuantize.convert`: the GPU tensor copied to the CPU, `Int8Params._quantize`):
//!   an fp16 copy on the GPU, `int8_vectorwise_quant` (threshold 0: the fp32 row scales SCB,
//!   then the int8 CB), the fp16 copy dropped.
//!
//! What stays is [`QuantStorage::bytes`] per weight (`plan/policy.rs`, shared with QLoRA
//! training) plus everything else in the dtype and the rotary buffers.
//!
//! A forward's quantized projection ([`linear`]):
//! - `Linear4bit.forward` (`nn/modules.py`): the input cast to `compute_dtype` (the dtype:
//!   no copy), `bnb.matmul_4bit` without grad → the `bitsandbytes::gemm_4bit` CUDA op
//!   (`backends/cuda/ops.py`): for `M` = batch × tokens rows up to 1536, `K` a multiple of the
//!   block size and `_gemm_4bit_use_custom_cuda` (sm90: H100 / H200) the fused `cgemm_4bit`
//!   kernel, which allocates its output only; otherwise `_dequant_linear_fallback`: with
//!   double quantization the absmax dequantized (`absmax_dq`, fp32) and `absmax_dq + offset`,
//!   the whole weight dequantized to the compute dtype (`B_dq`, a transient of the weight's
//!   full size), `F.linear` (cuBLAS), the three freed when the function returns.
//! - `Linear8bitLt.forward` → `bnb.matmul` → `MatMul8bitLt.forward` (inference: no grad):
//!   `A.to(torch.float16)` (a copy unless fp16), `int8_vectorwise_quant(A16, threshold=6.0)`
//!   (fp32 row scales SCA, int8 CA, `A.abs()` fp16 then its `>= threshold` bool mask, the abs
//!   freed, `outliers.any()`; the mask freed at return), the fp16 copy freed;
//!   `int8_mixed_scaled_mm` → `int8_scaled_mm`: `int8_linear_matmul`'s int32 result,
//!   `int8_mm_dequant`'s fp16 output, `.to(A.dtype)` (a copy unless fp16), the int32 freed;
//!   CA and SCA freed when the forward returns. When some input element reaches the
//!   threshold, its columns (`outlier_cols`, [`Int8Outliers`]) take the mixed path
//!   (`int8_mixed_scaled_mm`): `outliers.any(dim=0)` and `argwhere`; `subA = A[:, cols]`;
//!   `CB[:, cols]` (int8), `int8_vectorwise_dequant` (`A * stats * (1/127)`: two fp32
//!   temporaries), `.to(A.dtype)` (`subB`); the int8 product as above; `output.addmm(subA,
//!   subB)` replaces the output; `subB` freed at return, `subA` when the forward returns.

use super::linear::{Call, Process, cublas};
use super::program::{Buf, Prog};
use crate::model::Graph;
use crate::model::ir::Op;
use crate::plan::config::DType;
use crate::plan::events::Category;
use crate::plan::finetune_mode::Quant;
// bitsandbytes' 4-bit block size, as the storage counts it.
use crate::plan::policy::BNB_4BIT_BLOCK as BLOCK;
use crate::plan::policy::QuantStorage;

/// Streaming multiprocessors of the GPU the 4-bit kernel choice is planned for: H100 SXM
/// and H200 (sm90, 132 SMs; `_gpu_dispatch_props`).
pub const SM90_SMS: u64 = 132;

/// `bitsandbytes::gemm_4bit`'s largest row count for the fused kernel on CUDA
/// (`_gemm_4bit_custom_max_m`).
const CUSTOM_MAX_M: u64 = 1536;

/// `name2qmap["dynamic"]`: the 256-entry fp32 map `quantize_blockwise` caches on the GPU once
/// per process.
const DYNAMIC_MAP: u64 = 256 * 4;

pub use super::outliers::{DEFAULT_INITIALIZER_RANGE, Int8Outliers};
#[cfg(test)]
use super::outliers::{down_proj_tail, erfc};

/// The quantization as outputs name it, e.g. `bitsandbytes nf4, double quantization`.
pub fn describe(q: QuantStorage) -> String {
    match q.quant {
        Quant::Int8 => "bitsandbytes LLM.int8".into(),
        k => format!(
            "bitsandbytes {k}{}",
            if q.double_quant {
                ", double quantization"
            } else {
                ""
            }
        ),
    }
}

/// A checkpoint tensor as `from_pretrained` loads it.
#[derive(Debug, Clone, PartialEq)]
struct Tensor {
    key: String,
    elems: u64,
    /// Output features of a quantized weight (LLM.int8's row scales).
    rows: u64,
    quantized: bool,
}

/// The parameters of a quantized model in their loading order.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantModel {
    pub quant: QuantStorage,
    pub dtype: DType,
    /// LLM.int8's outlier columns (none unless set).
    pub outliers: Int8Outliers,
    tensors: Vec<Tensor>,
}

impl QuantModel {
    /// The parameters of `g` (a decoder built by `families/decoder.rs`), each named by its
    /// module, sorted as `dot_natural_key` sorts the checkpoint's keys; every `nn.Linear`
    /// weight but `lm_head`'s quantized.
    pub fn of(g: &Graph, quant: QuantStorage, dtype: DType) -> QuantModel {
        let mut seen = vec![false; g.params.len()];
        let mut tensors = Vec::with_capacity(g.params.len());
        for node in &g.nodes {
            let name = g.name(node);
            let linear = matches!(node.op, Op::Linear { .. });
            let last = name.rsplit('.').next().unwrap_or(name);
            for (k, &pid) in node.params.iter().enumerate() {
                let i = pid;
                if seen.get(i).copied().unwrap_or(true) {
                    continue;
                }
                seen[i] = true;
                let p = &g.params[i];
                let quantized = linear && k == 0 && last != "lm_head";
                let suffix = if linear && k == 1 { "bias" } else { "weight" };
                tensors.push(Tensor {
                    key: format!("{name}.{suffix}"),
                    elems: p.elems,
                    rows: p.matrix.map_or(1, |(r, _)| r),
                    quantized,
                });
            }
        }
        tensors.sort_by(|a, b| natural_key(&a.key).cmp(&natural_key(&b.key)));
        QuantModel {
            quant,
            dtype,
            outliers: Int8Outliers::None,
            tensors,
        }
    }

    /// The `Linear4bit` / `Linear8bitLt` modules.
    pub fn quantized_modules(&self) -> usize {
        self.tensors.iter().filter(|t| t.quantized).count()
    }

    /// Bytes of the parameters on the GPU: [`QuantStorage::bytes`] per quantized weight,
    /// the dtype for the rest (the rotary buffers not included).
    pub fn weights_bytes(&self) -> u64 {
        self.weights_bytes_where(|_| true)
    }

    /// [`QuantModel::weights_bytes`] of the parameters whose checkpoint key `on_gpu` keeps
    /// (a device map's GPU 0).
    pub fn weights_bytes_where(&self, on_gpu: impl Fn(&str) -> bool) -> u64 {
        let d = self.dtype.size();
        self.tensors
            .iter()
            .filter(|t| on_gpu(&t.key))
            .map(|t| {
                if t.quantized {
                    self.quant.bytes(t.elems, t.rows)
                } else {
                    t.elems * d
                }
            })
            .sum()
    }

    /// `caching_allocator_warmup`'s tensor: `torch.empty(int(byte_count // 2),
    /// dtype=torch.float16)` of the bytes `get_total_byte_count` counts.
    pub fn warmup_bytes(&self) -> u64 {
        self.warmup_bytes_where(|_| true)
    }

    /// [`QuantModel::warmup_bytes`] over the keys `on_gpu` keeps: `caching_allocator_warmup`
    /// counts only the keys the device map puts on an accelerator.
    pub fn warmup_bytes_where(&self, on_gpu: impl Fn(&str) -> bool) -> u64 {
        let d = self.dtype.size();
        // in half bytes: a 4-bit element counts 0.5 byte
        let halves: u64 = self
            .tensors
            .iter()
            .filter(|t| on_gpu(&t.key))
            .map(|t| match (t.quantized, self.quant.quant.is_4bit()) {
                (true, true) => t.elems,
                (true, false) => 2 * t.elems,
                (false, _) => 2 * t.elems * d,
            })
            .sum();
        halves / 4 * 2
    }

    /// `from_pretrained`'s allocations (see the module's documentation); what stays is the
    /// model's parameters.
    pub fn load(&self, p: &mut Prog) {
        self.load_where(p, |_| true);
    }

    /// [`QuantModel::load`] of a device-mapped model: the warm-up counts and the loop loads
    /// onto the GPU only the keys `on_gpu` keeps; the others are materialized and quantized
    /// on the CPU (`core_model_loading.py`: `spawn_materialize` to the key's device, then
    /// `Bnb4bitQuantize.convert` → `Params4bit(...).to(value.device)`,
    /// `Bnb8bitQuantize.convert` → `Int8Params(...).to(value_device)`), no GPU memory.
    pub fn load_where(&self, p: &mut Prog, on_gpu: impl Fn(&str) -> bool) {
        let d = self.dtype.size();
        let warm = p.fixed(self.warmup_bytes_where(&on_gpu));
        p.free(warm);
        let mut dynamic_map = false;
        for t in self.tensors.iter().filter(|t| on_gpu(&t.key)) {
            if !t.quantized {
                p.alloc(0, t.elems * d, Category::Parameters);
                continue;
            }
            let w = p.fixed(t.elems * d);
            if self.quant.quant.is_4bit() {
                let dq = self.quant.double_quant;
                let blocks = t.elems.div_ceil(BLOCK);
                let absmax_kind = if dq {
                    Category::Transient
                } else {
                    Category::Parameters
                };
                let absmax = p.alloc(0, 4 * blocks, absmax_kind);
                p.alloc(0, t.elems.div_ceil(2), Category::Parameters);
                p.alloc(0, 16 * 4, Category::Parameters);
                if dq {
                    p.alloc(0, 4, Category::Parameters);
                    let shifted = p.fixed(4 * blocks);
                    if !dynamic_map {
                        dynamic_map = true;
                        p.alloc(0, DYNAMIC_MAP, Category::Parameters);
                    }
                    p.alloc(0, 4 * blocks.div_ceil(256), Category::Parameters);
                    p.alloc(0, blocks, Category::Parameters);
                    p.alloc(0, DYNAMIC_MAP, Category::Parameters);
                    p.free(shifted);
                    p.free(absmax);
                }
            } else {
                let half = p.fixed(t.elems * 2);
                p.alloc(0, 4 * t.rows, Category::Parameters);
                p.alloc(0, t.elems, Category::Parameters);
                p.free(half);
            }
            p.free(w);
        }
    }
}

/// `dot_natural_key`: the key split at dots, numbers before words and compared as numbers.
fn natural_key(key: &str) -> Vec<(u8, u64, &str)> {
    key.split('.')
        .map(|part| match part.parse::<u64>() {
            Ok(n) if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) => (0, n, ""),
            _ => (1, 0, part),
        })
        .collect()
}

/// `_gemm_4bit_use_custom_cuda` on sm90 (H100 / H200) with [`SM90_SMS`]: whether the fused
/// 4-bit kernel computes `M` rows of `A` times the `N` × `K` weight (else the weight is
/// dequantized and `F.linear` runs), for `M` in the fused range.
pub fn fused_kernel(m: u64, n: u64, k: u64, fp32: bool) -> bool {
    let sms = SM90_SMS;
    if m <= 4 {
        return true;
    }
    if fp32 {
        return m < 8;
    }
    let n_blocks = n.div_ceil(64);
    if n * k < 4 * 1024 * 1024 {
        if k * 2 < n {
            let low_wave = n_blocks * 3 < sms;
            return m <= if low_wave { 512 } else { 320 };
        }
        if n_blocks * 4 <= sms {
            return m <= 32;
        }
        if n_blocks * 2 <= sms {
            return m <= 16;
        }
        return false;
    }
    if m > 512 {
        return false;
    }
    if m < 8 {
        if m >= 6 && n_blocks >= 36 {
            let lt_75 = n_blocks * 4 < sms * 3;
            let lt_60 = n_blocks * 5 < sms * 3;
            if k > n && lt_75 {
                return false;
            }
            if k == n && lt_75 && !lt_60 {
                return false;
            }
        }
        return true;
    }
    if n_blocks >= sms * 3 {
        return m <= 64;
    }
    if n_blocks >= sms * 2 {
        return m <= 48;
    }
    if n_blocks >= sms {
        return m <= 32;
    }
    if n_blocks >= sms / 2 {
        if k >= n && n_blocks * 4 < sms * 3 {
            return false;
        }
        return m <= 16;
    }
    false
}

/// The `bitsandbytes::gemm_4bit` CUDA dispatch: the fused kernel or the dequantizing
/// fallback, for `m` rows.
pub fn gemm_4bit_fused(m: u64, n: u64, k: u64, fp32: bool) -> bool {
    m <= CUSTOM_MAX_M && k.is_multiple_of(BLOCK) && fused_kernel(m, n, k, fp32)
}

/// One quantized projection of `k` to `n` features over the call's `c.t` tokens per
/// sequence (`c.batch` sequences); returns its output (`c.t × n` in the dtype). `outliers`:
/// LLM.int8's outlier columns of the input.
pub fn linear(
    p: &mut Prog,
    proc: &mut Process,
    q: QuantStorage,
    c: &Call,
    (k, n): (u64, u64),
    outliers: u64,
) -> Buf {
    let (t, d) = (c.t, c.d);
    if q.quant.is_4bit() {
        let m = c.batch.saturating_mul(t);
        if gemm_4bit_fused(m, n, k, d == 4) {
            return p.act(t * n * d);
        }
        cublas(p, proc);
        let blocks = (n * k).div_ceil(BLOCK);
        let (absmax_dq, absmax) = if q.double_quant {
            (p.fixed(4 * blocks), p.fixed(4 * blocks))
        } else {
            (Buf::NONE, Buf::NONE)
        };
        let b_dq = p.fixed(n * k * d);
        let out = p.act(t * n * d);
        p.free(absmax);
        p.free(absmax_dq);
        p.free(b_dq);
        return out;
    }
    let fp16 = d == 2 && !c.bf16;
    let a16 = if fp16 { Buf::NONE } else { p.act(t * k * 2) };
    let row_stats = p.act(t * 4);
    let ca = p.act(t * k);
    let abs = p.act(t * k * 2);
    let mask = p.act(t * k);
    p.free(abs);
    p.scratch(0, 1);
    let cols = if outliers > 0 {
        // outlier_cols = torch.argwhere(outliers.any(dim=0)).view(-1)
        let any = p.fixed(k);
        let cols = p.fixed(outliers * 8);
        p.free(any);
        cols
    } else {
        Buf::NONE
    };
    p.free(mask);
    p.free(a16);
    let (sub_a, sub_b) = if outliers > 0 {
        let sub_a = p.act(t * outliers * d);
        let cb = p.fixed(n * outliers);
        let scaled = p.fixed(n * outliers * 4);
        let dequant = p.fixed(n * outliers * 4);
        p.free(scaled);
        p.free(cb);
        let sub_b = if d == 4 {
            dequant
        } else {
            let b = p.fixed(n * outliers * d);
            p.free(dequant);
            b
        };
        (sub_a, sub_b)
    } else {
        (Buf::NONE, Buf::NONE)
    };
    let i32 = p.act(t * n * 4);
    let f16 = p.act(t * n * 2);
    let mut out = if fp16 {
        f16
    } else {
        let o = p.act(t * n * d);
        p.free(f16);
        o
    };
    p.free(i32);
    if outliers > 0 {
        // output = output.addmm(subA, subB)
        let added = p.act(t * n * d);
        p.free(out);
        out = added;
    }
    p.free(sub_b);
    p.free(ca);
    p.free(row_stats);
    p.free(cols);
    p.free(sub_a);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::families::transformer::AttnImpl;
    use crate::plan::events::Events;

    fn preset(name: &str) -> crate::model::Preset {
        let path = format!(
            "{}/../../tests/data/hf_configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(path).expect("config");
        crate::model::hf::from_config_text(&text, name).expect("preset")
    }

    fn model(name: &str, quant: Quant, double_quant: bool) -> QuantModel {
        let g = preset(name).build(1, AttnImpl::Sdpa).expect("graph");
        QuantModel::of(
            &g,
            QuantStorage {
                quant,
                double_quant,
            },
            DType::BF16,
        )
    }

    fn loaded(m: &QuantModel) -> Events {
        let mut p = Prog::default();
        m.load(&mut p);
        p.finish()
    }

    /// Every linear but lm_head is quantized; the keys load in natural order (layer 2
    /// before layer 10, `down_proj` before `q_proj`, `lm_head` first).
    #[test]
    fn every_linear_but_lm_head_is_quantized_in_natural_order() {
        let m = model("Llama-3.2-1B", Quant::Nf4, true);
        assert_eq!(m.quantized_modules(), 16 * 7);
        let keys: Vec<&str> = m.tensors.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys[0], "model.embed_tokens.weight", "{keys:?}");
        let pos = |k: &str| keys.iter().position(|x| *x == k).expect(k);
        assert!(
            pos("model.layers.2.mlp.down_proj.weight")
                < pos("model.layers.10.mlp.down_proj.weight")
        );
        assert!(
            pos("model.layers.0.mlp.down_proj.weight")
                < pos("model.layers.0.self_attn.q_proj.weight")
        );
        let untied = model("Qwen2.5-7B", Quant::Int8, false);
        assert_eq!(untied.tensors[0].key, "lm_head.weight");
        assert!(!untied.tensors[0].quantized);
        // q/k/v biases stay in the dtype
        assert!(
            untied
                .tensors
                .iter()
                .any(|t| t.key.ends_with("q_proj.bias") && !t.quantized)
        );
    }

    /// The load leaves exactly `QuantStorage::bytes` per quantized weight (the storage model
    /// of QLoRA training) plus the dtype for the rest, and the process's dynamic map once.
    #[test]
    fn load_leaves_the_quant_storage() {
        for (quant, dq) in [
            (Quant::Nf4, true),
            (Quant::Nf4, false),
            (Quant::Int8, false),
        ] {
            let m = model("Qwen3-0.6B", quant, dq);
            let ev = loaded(&m);
            let mut live = vec![false; ev.buffers.len()];
            for e in &ev.events {
                live[e.buffer as usize] = e.alloc;
            }
            let left: u64 = ev
                .buffers
                .iter()
                .zip(&live)
                .filter(|(_, l)| **l)
                .map(|(b, _)| b.fixed.div_ceil(512) * 512)
                .sum();
            let small = m
                .tensors
                .iter()
                .filter(|t| !t.quantized)
                .map(|t| (t.elems * 2).div_ceil(512) * 512 - t.elems * 2)
                .sum::<u64>();
            let map = if dq { DYNAMIC_MAP } else { 0 };
            assert_eq!(left, m.weights_bytes() + small + map, "{quant:?} {dq}");
        }
    }

    /// The warm-up tensor counts 0.5 byte per 4-bit element, 1 per int8 one.
    #[test]
    fn warmup_counts_param_element_size() {
        let nf4 = model("Llama-3.2-1B", Quant::Nf4, true);
        let int8 = model("Llama-3.2-1B", Quant::Int8, false);
        let lin: u64 = nf4
            .tensors
            .iter()
            .filter(|t| t.quantized)
            .map(|t| t.elems)
            .sum();
        let rest: u64 = nf4
            .tensors
            .iter()
            .filter(|t| !t.quantized)
            .map(|t| t.elems)
            .sum();
        assert_eq!(nf4.warmup_bytes(), (lin / 2 + rest * 2) / 2 * 2);
        assert_eq!(int8.warmup_bytes(), (lin + rest * 2) / 2 * 2);
    }

    /// The random-init outlier probability against a Monte-Carlo estimate (4 M samples of
    /// `act(g) · u`, numpy): Llama-3.1-8B's `down_proj` input (SiLU, s = 0.02 √4096) 3.39e-3,
    /// Gemma-2B's (tanh GELU, s = 0.02 √2048) 8.35e-5; Qwen3-0.6B's (√1024) under 1e-6.
    #[test]
    fn random_init_outlier_tail() {
        let close = |got: f64, want: f64, tol: f64| {
            assert!((got - want).abs() <= tol * want, "{got:e} vs {want:e}");
        };
        close(down_proj_tail(0.02 * 64.0, false), 3.39e-3, 0.03);
        close(down_proj_tail(0.02 * 2048f64.sqrt(), true), 8.35e-5, 0.05);
        // (one sample of 4 M reached it: an upper bound)
        assert!(down_proj_tail(0.02 * 32.0, false) < 1e-6);
        let o = Int8Outliers::RandomInit { std: 0.02 };
        // Llama-3.1-8B's prefill of 4 × 111 rows: most of the 14336 columns
        let cols = o.down_proj_columns(4096, false, 444, 14336);
        assert!((11_000..11_400).contains(&cols), "{cols}");
        assert_eq!(
            Int8Outliers::None.down_proj_columns(4096, false, 444, 14336),
            0
        );
        assert!((erfc(0.0) - 1.0).abs() < 1e-6 && (erfc(1.0) - 0.157_299_2).abs() < 1e-6);
    }

    /// The sm90 choice of `gemm_4bit`: one to four rows always fused; a prefill's thousands
    /// of rows dequantize; fp32 fuses only below 8 rows.
    #[test]
    fn gemm_4bit_dispatch() {
        assert!(gemm_4bit_fused(1, 4096, 4096, false));
        assert!(gemm_4bit_fused(4, 14336, 4096, true));
        assert!(!gemm_4bit_fused(8, 896, 896, true));
        assert!(!gemm_4bit_fused(2752, 14336, 4096, false));
        assert!(!gemm_4bit_fused(1537, 896, 896, false));
        // Qwen2.5-0.5B at batch 32: k_proj (128 × 896, under 4 Mi elements, a quarter wave)
        // fused up to 32 rows; gate (4864 × 896) and down (896 × 4864) dequantized past 16
        assert!(gemm_4bit_fused(32, 128, 896, false));
        assert!(!gemm_4bit_fused(33, 128, 896, false));
        assert!(gemm_4bit_fused(16, 4864, 896, false));
        assert!(!gemm_4bit_fused(32, 4864, 896, false));
        assert!(!gemm_4bit_fused(32, 896, 4864, false));
        // K not a multiple of the block size: the fallback
        assert!(!gemm_4bit_fused(1, 64, 100, false));
    }
}
