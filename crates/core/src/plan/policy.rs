//! The parameter-state policy: for every parameter of a graph, whether it trains, the
//! dtype it is stored in, and the part of it this rank holds. The simulator reads only
//! this: full training, frozen layers, adapters and sharding across ranks are policies,
//! not special cases in the event walk.

use crate::model::Graph;

use super::finetune_mode::Quant;
use super::numerics::DType;
use super::numerics::Precision;

/// The fraction of a tensor one rank holds: `num / den` (1/1 unsharded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub num: u64,
    pub den: u64,
}

impl Shard {
    /// The whole tensor.
    pub const WHOLE: Shard = Shard { num: 1, den: 1 };

    /// This rank's part of `bytes`, rounded up (PyTorch pads shards to equal sizes).
    pub fn of(self, bytes: u64) -> u64 {
        if self == Shard::WHOLE || self.den == 0 {
            return bytes;
        }
        (u128::from(bytes) * u128::from(self.num))
            .div_ceil(u128::from(self.den))
            .try_into()
            .unwrap_or(u64::MAX)
    }
}

/// What one parameter costs this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamState {
    /// Gets a gradient and optimizer state (`requires_grad=True`).
    pub trainable: bool,
    /// The dtype the parameter is stored in (its gradient and state follow it).
    pub storage: DType,
    /// The part of the parameter, its gradient and its state this rank holds.
    pub shard: Shard,
    /// bitsandbytes storage of a frozen quantized weight (QLoRA); `None`: plain `storage`.
    pub quant: Option<QuantStorage>,
}

/// A bitsandbytes-quantized weight: its kind and whether the 4-bit block scales are
/// quantized again (double quantization).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct QuantStorage {
    pub quant: Quant,
    pub double_quant: bool,
}

/// The caching allocator's block granularity: each tensor of a `QuantState` is its own
/// allocation.
const BLOCK: u64 = 512;

fn block(bytes: u64) -> u64 {
    bytes.div_ceil(BLOCK) * BLOCK
}

/// bitsandbytes' 4-bit block size (`Params4bit.blocksize`, 64): one absmax per block.
pub(crate) const BNB_4BIT_BLOCK: u64 = 64;

impl QuantStorage {
    /// Bytes on the GPU of a quantized weight of `elems` elements and `rows` output
    /// features: its [`tensors`](Self::tensors), each rounded to the allocator's 512-byte
    /// blocks (summed without a list: every plan of quantized weights asks it per parameter).
    pub fn bytes(self, elems: u64, rows: u64) -> u64 {
        let (t, n) = self.parts(elems, rows);
        t[..n].iter().map(|&b| block(b)).sum()
    }

    /// The GPU tensors (bytes, unrounded) of a quantized weight of `elems` elements and `rows`
    /// output features as bitsandbytes 0.50 creates them, in the order an offloaded module's
    /// accelerate hook creates them on the GPU (accelerate 1.15 `utils/modeling.py`
    /// `set_module_tensor_to_device` → `param_cls(value, **kwargs).to(0)`, bitsandbytes 0.50.2
    /// `nn/modules.py`):
    ///
    /// - 4-bit (`quantize_4bit`, blocksize 64): `Params4bit.to` moves the `QuantState` first
    ///   (`functional.py` `QuantState.to`: the 4-bit `code`, 16 fp32 from `get_4bit_type`; the
    ///   `absmax` of each 64-element block, fp32, or with double quantization
    ///   (`quantize_blockwise(absmax - offset, blocksize=256)`) uint8, then the fp32 `offset`,
    ///   `state2.absmax` (fp32 per 256 blocks) and `state2.code` (256 fp32)), then the packed
    ///   weight (`(elems + 1) / 2` uint8);
    /// - LLM.int8 (`int8_vectorwise_quant`): `Int8Params.to` of the int8 weight (CB), then the
    ///   fp32 row scales (`fp16_statistics`, SCB) the hook passes beside it.
    pub fn tensors(self, elems: u64, rows: u64) -> Vec<u64> {
        let (t, n) = self.parts(elems, rows);
        t[..n].to_vec()
    }

    /// [`tensors`](Self::tensors) in a fixed array: the first `n` entries.
    fn parts(self, elems: u64, rows: u64) -> ([u64; 6], usize) {
        if !self.quant.is_4bit() {
            return ([elems, 4 * rows, 0, 0, 0, 0], 2);
        }
        let blocks = elems.div_ceil(BNB_4BIT_BLOCK);
        let packed = elems.div_ceil(2);
        if self.double_quant {
            let nested = 4 * blocks.div_ceil(256);
            ([16 * 4, blocks, 4, nested, 256 * 4, packed], 6)
        } else {
            ([16 * 4, 4 * blocks, packed, 0, 0, 0], 3)
        }
    }
}

/// The state of every parameter of a graph, by parameter index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamPolicy {
    states: Vec<ParamState>,
    /// Output features of each matrix parameter (1 for vectors): LLM.int8's row scales.
    rows: Vec<u64>,
}

impl ParamPolicy {
    /// Plain training on one device: every parameter trainable, stored in the precision's
    /// parameter dtype, unsharded.
    pub fn full(g: &Graph, precision: Precision) -> ParamPolicy {
        ParamPolicy {
            states: vec![
                ParamState {
                    trainable: true,
                    storage: precision.param_dtype(),
                    shard: Shard::WHOLE,
                    quant: None,
                };
                g.params.len()
            ],
            rows: g
                .params
                .iter()
                .map(|p| p.matrix.map_or(1, |(r, _)| r))
                .collect(),
        }
    }

    /// The state of parameter `p`.
    pub fn state(&self, p: usize) -> ParamState {
        self.states[p]
    }

    /// Whether parameter `p` trains.
    pub fn trainable(&self, p: usize) -> bool {
        self.states[p].trainable
    }

    /// Marks parameter `p` frozen (no gradient, no optimizer state).
    pub fn freeze(&mut self, p: usize) {
        self.states[p].trainable = false;
    }

    /// Stores parameter `p` in `dtype` (peft's fp32 adapters on a 16-bit base).
    pub fn set_storage(&mut self, p: usize, dtype: DType) {
        self.states[p].storage = dtype;
    }

    /// This rank holds `shard` of parameter `p` (ZeRO-3's persistent parameters: whole).
    pub fn set_shard(&mut self, p: usize, shard: Shard) {
        if let Some(s) = self.states.get_mut(p) {
            s.shard = shard;
        }
    }

    /// This rank holds `shard` of every parameter (FSDP2, ZeRO-3).
    pub fn shard_all(&mut self, shard: Shard) {
        for s in &mut self.states {
            s.shard = shard;
        }
    }

    /// Stores frozen parameter `p` quantized (QLoRA base weights).
    pub fn set_quant(&mut self, p: usize, q: QuantStorage) {
        self.states[p].quant = Some(q);
        self.states[p].trainable = false;
    }

    /// Bytes this rank holds of parameter `p` of `elems` elements, in its storage dtype
    /// (the size of the parameter, and of its gradient when it trains). A quantized weight
    /// is a matrix: see [`QuantStorage::bytes`] (rows taken as `elems` / 64 otherwise).
    pub fn bytes(&self, p: usize, elems: u64) -> u64 {
        let s = self.states[p];
        if let Some(q) = s.quant {
            return s.shard.of(q.bytes(elems, self.rows[p]));
        }
        s.shard.of(elems * s.storage.size())
    }

    /// Bytes of the frozen and of the trainable parameters (the breakdown's split).
    pub fn frozen_trainable_bytes(&self, g: &Graph) -> (u64, u64) {
        let (mut frozen, mut trainable) = (0u64, 0u64);
        for (i, p) in g.params.iter().enumerate() {
            let b = self.bytes(i, p.elems);
            if self.states[i].trainable {
                trainable = trainable.saturating_add(b);
            } else {
                frozen = frozen.saturating_add(b);
            }
        }
        (frozen, trainable)
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether the graph has no parameters.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Elements of the trainable parameters (the count `peft` prints as trainable).
    pub fn trainable_elems(&self, g: &Graph) -> u64 {
        g.params
            .iter()
            .zip(&self.states)
            .filter(|(_, s)| s.trainable)
            .map(|(p, _)| p.elems)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::preset::find_builtin;

    #[test]
    fn full_policy_trains_everything_unsharded() {
        let preset = find_builtin("gpt2").expect("gpt2");
        let g = preset
            .build(64, crate::model::families::transformer::AttnImpl::Sdpa)
            .expect("graph");
        let mut pol = ParamPolicy::full(&g, Precision::AmpBf16);
        assert_eq!(pol.len(), g.params.len());
        assert_eq!(pol.trainable_elems(&g), g.param_count());
        assert_eq!(pol.bytes(0, 10), 40);
        pol.freeze(0);
        assert!(!pol.trainable(0));
        assert_eq!(pol.trainable_elems(&g), g.param_count() - g.params[0].elems);
        let bf16 = ParamPolicy::full(&g, Precision::Bf16);
        assert_eq!(bf16.state(0).storage, DType::BF16);
    }

    #[test]
    fn shards_round_up() {
        let half = Shard { num: 1, den: 2 };
        assert_eq!(half.of(10), 5);
        assert_eq!(half.of(11), 6);
        assert_eq!(Shard { num: 1, den: 8 }.of(1), 1);
        assert_eq!(Shard::WHOLE.of(u64::MAX), u64::MAX);
        assert_eq!(Shard { num: 3, den: 3 }.of(u64::MAX), u64::MAX);
    }
}
