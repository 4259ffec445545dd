//! The KV cache's size: how many tokens each layer's keys and values hold (transformers 5.17
//! `cache_utils.py`), and their bytes.
//!
//! - `DynamicLayer.update`: `self.keys = torch.cat([self.keys, key_states], dim=-2)`: after
//!   the prefill and `k` decode steps a layer holds `prompt + k` tokens; `generate` with `N`
//!   new tokens runs `N − 1` decode steps, so `prompt + N − 1` at the end.
//! - `DynamicSlidingWindowLayer.update`: `full = cat(self.keys, new)`; `self.keys =
//!   full[:, :, -(window − 1):]`, a view that keeps `full`'s storage: the prefill keeps all
//!   `prompt` tokens, each decode step `min(cached, window − 1) + 1`.
//! - `StaticLayer`: zeros of `max_cache_len = prompt + N` tokens at the first update;
//!   `StaticSlidingWindowLayer`: `min(window, max_cache_len)`.

use super::setting::{InferConfig, InferStep, KvCache};
use super::shape::DecoderShape;

/// Tokens layer `window` keeps after a call over `new` tokens when `cached` tokens were seen
/// before (`DynamicCache`): the storage `torch.cat` allocated.
pub fn dynamic_tokens(window: Option<u64>, cached: u64, new: u64) -> u64 {
    match window {
        None => cached + new,
        Some(w) => cached.min(w.saturating_sub(1)) + new,
    }
}

/// Tokens a static layer is preallocated to.
pub fn static_tokens(window: Option<u64>, max_cache_len: u64) -> u64 {
    match window {
        None => max_cache_len,
        Some(w) => w.min(max_cache_len),
    }
}

/// Bytes of one layer's keys and values (both) for `tokens` tokens of one sequence.
pub fn layer_bytes_per_sequence(s: &DecoderShape, tokens: u64, dtype_bytes: u64) -> u64 {
    2 * s.kv_width() * tokens * dtype_bytes
}

/// The largest KV cache the call holds at once, in bytes (all layers, the whole batch): for a
/// dynamic cache the sum over layers of each layer's largest storage.
pub fn peak_cache_bytes(s: &DecoderShape, cfg: &InferConfig) -> u64 {
    let d = cfg.dtype.size();
    let p = cfg.prompt;
    let per_seq: u64 = s
        .windows
        .iter()
        .map(|&w| {
            let tokens = match (cfg.step, cfg.kv_cache) {
                (InferStep::Generate, KvCache::Static) => static_tokens(w, cfg.total_tokens()),
                (InferStep::Prefill, _) => dynamic_tokens(w, 0, p),
                (InferStep::Generate, KvCache::Dynamic) => {
                    let after_prefill = dynamic_tokens(w, 0, p);
                    // decode step k (1 ≤ k ≤ N − 1) sees p + k − 1 cached tokens
                    let steps = cfg.new_tokens.saturating_sub(1);
                    let last = if steps == 0 {
                        0
                    } else {
                        dynamic_tokens(w, p + steps - 1, 1)
                    };
                    after_prefill.max(last)
                }
            };
            layer_bytes_per_sequence(s, tokens, d)
        })
        .sum();
    per_seq.saturating_mul(cfg.batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::config::{AllocatorConfig, Attention, DType};

    fn shape(layers: u64, kv_heads: u64, head_dim: u64, windows: Vec<Option<u64>>) -> DecoderShape {
        DecoderShape {
            model_type: "llama".into(),
            layers,
            hidden: 4096,
            intermediate: 14336,
            heads: 32,
            kv_heads,
            head_dim,
            vocab: 128256,
            max_positions: 131072,
            windows,
            gemma: false,
            qk_norm: false,
            sandwich_norm: false,
            fused: false,
            two_rotaries: false,
            final_softcap: false,
            attn_softcap: false,
            tied: false,
            moe: None,
            fp32_product_norm: false,
            chunked_rope: false,
            sinks: false,
            rope_cat: false,
            eos: true,
        }
    }

    fn cfg(step: InferStep, kv_cache: KvCache, batch: u64, prompt: u64, new: u64) -> InferConfig {
        InferConfig {
            step,
            batch,
            prompt,
            new_tokens: new,
            dtype: DType::BF16,
            attention: Attention::Sdpa,
            kv_cache,
            allocator: AllocatorConfig::default(),
        }
    }

    /// KV bytes = 2 × layers × kv_heads × head_dim × tokens × dtype bytes × batch; the
    /// dynamic cache ends at prompt + new − 1 tokens, the static one is allocated to
    /// prompt + new.
    #[test]
    fn full_attention_cache_bytes() {
        let s = shape(32, 8, 128, vec![None; 32]);
        let dynamic = cfg(InferStep::Generate, KvCache::Dynamic, 4, 1000, 25);
        assert_eq!(
            peak_cache_bytes(&s, &dynamic),
            2 * 32 * 8 * 128 * (1000 + 24) * 2 * 4
        );
        let stat = cfg(InferStep::Generate, KvCache::Static, 4, 1000, 25);
        assert_eq!(
            peak_cache_bytes(&s, &stat),
            2 * 32 * 8 * 128 * (1000 + 25) * 2 * 4
        );
        let prefill = cfg(InferStep::Prefill, KvCache::Dynamic, 4, 1000, 0);
        assert_eq!(
            peak_cache_bytes(&s, &prefill),
            2 * 32 * 8 * 128 * 1000 * 2 * 4
        );
        let one = cfg(InferStep::Generate, KvCache::Dynamic, 1, 1000, 1);
        assert_eq!(peak_cache_bytes(&s, &one), 2 * 32 * 8 * 128 * 1000 * 2);
    }

    /// A sliding layer keeps the prompt's storage after the prefill, then at most the
    /// window; a static sliding layer is allocated to the window.
    #[test]
    fn sliding_layers_keep_the_window() {
        assert_eq!(dynamic_tokens(Some(512), 0, 3000), 3000);
        assert_eq!(dynamic_tokens(Some(512), 3000, 1), 512);
        assert_eq!(dynamic_tokens(Some(512), 100, 1), 101);
        assert_eq!(static_tokens(Some(512), 3100), 512);
        assert_eq!(static_tokens(Some(512), 300), 300);
        let s = shape(2, 1, 256, vec![Some(512), None]);
        let c = cfg(InferStep::Generate, KvCache::Dynamic, 1, 3000, 100);
        let sliding = 2 * 256 * 3000 * 2;
        let full = 2 * 256 * (3000 + 99) * 2;
        assert_eq!(peak_cache_bytes(&s, &c), sliding + full);
    }
}
