//! The events of the measured session: the model created in its dtype, the prompt on the
//! GPU, a warm-up call, and the measured call (the warm-up leaves the allocator's pool as a
//! second call finds it; `reset_peak_memory_stats` sits between them).
//!
//! `model.generate(input_ids, max_new_tokens=N, min_new_tokens=N, do_sample=False)`
//! (transformers 5.17 `generation/utils.py`, `_sample`):
//! - `attention_mask = torch.ones(input_ids.shape)` (int64), concatenated with a column of
//!   ones after every token;
//! - `_prefill`: `prepare_inputs_for_generation` clones `input_ids`; the forward runs with
//!   `logits_to_keep=1`;
//! - per token: `next_token_logits = outputs.logits[:, -1].to(copy=True,
//!   dtype=torch.float32)`; `MinNewTokensLengthLogitsProcessor` (`min_new_tokens` with an EOS
//!   token): `scores.clone()`, an `arange` over the vocabulary, `isin`, `torch.where`; the
//!   argmax; `input_ids = torch.cat([input_ids, next_tokens[:, None]])`; `del outputs`. The
//!   logits and scores of one token live until the next token's replace them, through the
//!   next decode forward.
//! - the `N`-th token needs no forward: `N − 1` decode steps.
//!
//! A prefill: `with torch.no_grad(): out = model(input_ids)` (every position's logits and the
//! forward's `DynamicCache`, held by `out` until `del out`).

use super::forward::{Cache, Call, Process, forward};
use super::program::{Buf, Prog};
use super::setting::{InferConfig, InferStep, KvCache};
use super::shape::DecoderShape;
use crate::plan::events::{Category, Events, Phase};

/// The events of weights, prompt, warm-up and measured call. `params` are the parameters'
/// element counts in the order the model creates them; `buffers` the fp32 buffers'
/// (rotary `inv_freq`).
pub fn session(s: &DecoderShape, cfg: &InferConfig, params: &[u64], buffers: &[u64]) -> Events {
    let mut p = Prog::default();
    p.phase = Some(Phase::Setup);
    let d = cfg.dtype.size();
    for &e in params {
        p.alloc(0, e * d, Category::Parameters);
    }
    for &e in buffers {
        p.alloc(0, e * 4, Category::Parameters);
    }
    if s.tied {
        // `nn.Linear(hidden, vocab)`'s own weight, dropped when `post_init` ties `lm_head` to
        // the embedding: its segment stays cached (reserved after the build)
        let own = p.alloc(0, s.vocab * s.hidden * d, Category::Transient);
        p.free(own);
    }
    p.alloc(cfg.prompt * 8, 0, Category::Activations);
    let mut proc = Process::default();
    p.phase = Some(Phase::Forward);
    one_call(&mut p, &mut proc, s, cfg);
    p.start_measured();
    one_call(&mut p, &mut proc, s, cfg);
    p.finish()
}

fn one_call(p: &mut Prog, proc: &mut Process, s: &DecoderShape, cfg: &InferConfig) {
    let d = cfg.dtype.size();
    let call = |t: u64, keep: u64, padding_mask: bool| Call {
        t,
        keep,
        padding_mask,
        d,
        bf16: cfg.dtype == crate::plan::config::DType::BF16,
        imp: cfg.attention,
    };
    let pr = cfg.prompt;
    p.forward = 0;
    match cfg.step {
        InferStep::Prefill => {
            let mut cache = Cache::new(KvCache::Dynamic, 0, s.layers);
            let logits = forward(p, proc, s, &mut cache, call(pr, pr, false));
            // `del out`
            p.free(logits);
            cache.release(p);
        }
        InferStep::Generate => {
            let mut cache = Cache::new(cfg.kv_cache, cfg.total_tokens(), s.layers);
            let mut mask = p.act(pr * 8);
            // position_ids = attention_mask.cumsum(-1) - 1, masked_fill(attention_mask == 0, 0)
            let cumsum = p.act(pr * 8);
            let minus = p.act(pr * 8);
            p.free(cumsum);
            let eq = p.act(pr);
            let mut positions = p.act(pr * 8);
            p.free(eq);
            p.free(minus);
            let ids_clone = p.act(pr * 8);
            let mut logits = forward(p, proc, s, &mut cache, call(pr, 1, true));
            p.free(ids_clone);
            let (mut next_logits, mut scores) = (Buf::NONE, Buf::NONE);
            let mut ids = Buf::NONE;
            for i in 1..=cfg.new_tokens {
                if i > 1 {
                    p.forward = u16::try_from(i - 1).unwrap_or(u16::MAX);
                    logits = forward(p, proc, s, &mut cache, call(1, 1, true));
                }
                // `_update_model_kwargs_for_generation`: position_ids and attention_mask
                // grow by one column (torch.cat)
                let grown = p.act((pr + i) * 8);
                p.free(positions);
                positions = grown;
                let grown = p.act((pr + i) * 8);
                p.free(mask);
                mask = grown;
                let nl = p.act(s.vocab * 4);
                p.free(next_logits);
                next_logits = nl;
                let sc = if s.eos {
                    let clone = p.act(s.vocab * 4);
                    let vocab = p.fixed(s.vocab * 8);
                    let isin = p.fixed(s.vocab);
                    let out = p.act(s.vocab * 4);
                    p.free(clone);
                    p.free(vocab);
                    p.free(isin);
                    out
                } else {
                    Buf::NONE
                };
                p.free(scores);
                scores = sc;
                let grown = p.act((pr + i) * 8);
                p.free(ids);
                ids = grown;
                p.free(logits);
            }
            cache.release(p);
            p.free(next_logits);
            p.free(scores);
            p.free(mask);
            p.free(positions);
            // the returned sequences, dropped by the caller
            p.free(ids);
        }
    }
}
