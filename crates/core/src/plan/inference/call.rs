//! The events of the measured session: the model created in its dtype (or loaded with
//! bitsandbytes-quantized linears, [`QuantModel::load`]), the prompt on the GPU, a warm-up
//! call, and the measured call (the warm-up leaves the allocator's pool as a second call
//! finds it; `reset_peak_memory_stats` sits between them).
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

use super::decoding::{Decoding, Warper};
use super::device_map::{Placement, Streams};
use super::forward::{Cache, Call, Process, forward};
use super::program::{Buf, Prog};
use super::quant::{Int8Outliers, QuantModel};
use super::setting::{InferConfig, InferStep, KvCache};
use super::shape::DecoderShape;
use crate::plan::events::{Category, Events, Phase};
use crate::plan::policy::QuantStorage;

/// The events of weights, prompt, warm-up and measured call. `params` are the parameters'
/// element counts in the order the model creates them; `buffers` the fp32 buffers'
/// (rotary `inv_freq`).
pub fn session(s: &DecoderShape, cfg: &InferConfig, params: &[u64], buffers: &[u64]) -> Events {
    session_decoding(s, cfg, &Decoding::default(), params, buffers)
}

/// [`session`] with `dec`'s token selection (greedy or multinomial sampling).
pub fn session_decoding(
    s: &DecoderShape,
    cfg: &InferConfig,
    dec: &Decoding,
    params: &[u64],
    buffers: &[u64],
) -> Events {
    session_quant(s, cfg, dec, params, buffers, None)
}

/// [`session_decoding`] of a model loaded with bitsandbytes-quantized linears (`quant`:
/// its parameters as `from_pretrained` loads them, [`QuantModel::load`]) at `cfg.batch`
/// sequences; `None`: the model created in its dtype.
pub fn session_quant(
    s: &DecoderShape,
    cfg: &InferConfig,
    dec: &Decoding,
    params: &[u64],
    buffers: &[u64],
    quant: Option<&QuantModel>,
) -> Events {
    let mut p = Prog::default();
    p.phase = Some(Phase::Setup);
    let d = cfg.dtype.size();
    if let Some(q) = quant {
        q.load(&mut p);
        for &e in buffers {
            p.alloc(0, e * 4, Category::Parameters);
        }
    } else {
        for &e in params {
            p.alloc(0, e * d, Category::Parameters);
        }
        for &e in buffers {
            p.alloc(0, e * 4, Category::Parameters);
        }
        if s.tied {
            // `nn.Linear(hidden, vocab)`'s own weight, dropped when `post_init` ties `lm_head`
            // to the embedding: its segment stays cached (reserved after the build)
            let own = p.alloc(0, s.vocab * s.hidden * d, Category::Transient);
            p.free(own);
        }
    }
    let q = quant.map(|q| (q.quant, q.outliers));
    calls(p, Process::default(), s, cfg, dec, q)
}

/// The events of a model loaded by `from_pretrained(..., device_map="auto", max_memory=...)`
/// in a fresh process and called as [`session`] calls it: transformers 5.17
/// `modeling_utils.caching_allocator_warmup` first allocates and drops one fp16 tensor of the
/// bytes of every checkpoint key mapped to GPU 0 (tied keys and buffers not counted; the
/// pool has no unused reserved memory to subtract in a fresh process; the cap of total
/// memory − 1.2 GiB is not applied), so the weights loaded next are cut from that one
/// segment; the resident tensors loaded, then
/// (when something is offloaded) `dispatch_model`'s `init_hook`s move each resident tensor to
/// its device with `set_module_tensor_to_device`, whose `empty_cache()` leaves only the
/// segments holding weights; the prompt, warm-up and measured call with the offloaded
/// modules' weights copied in as they run. The model is created on the meta device, so a
/// tied `lm_head`'s own weight never exists.
pub fn device_map_session(
    s: &DecoderShape,
    cfg: &InferConfig,
    dec: &Decoding,
    pl: &Placement,
) -> Events {
    device_map_session_quant(s, cfg, dec, pl, None)
}

/// [`device_map_session`] of a model loaded with `quantization_config` as well (`quant`,
/// placed by [`Placement::of_quant`]): the warm-up counts and the loop loads onto the GPU the
/// checkpoint keys mapped to GPU 0 ([`QuantModel::load_where`]), quantizing them there; the
/// offloaded keys are quantized on the CPU. Then the buffers, the dispatch's `empty_cache()`,
/// and the calls with the quantized projections, an offloaded module's quantized tensors
/// copied in as it runs ([`Streams`]).
pub fn device_map_session_quant(
    s: &DecoderShape,
    cfg: &InferConfig,
    dec: &Decoding,
    pl: &Placement,
    quant: Option<&QuantModel>,
) -> Events {
    let mut p = Prog::default();
    p.phase = Some(Phase::Setup);
    match quant {
        Some(q) => {
            q.load_where(&mut p, |key| !pl.device_of(key).offloaded());
            for b in pl.tensors.resident_buffers() {
                p.alloc(0, b, Category::Parameters);
            }
        }
        None => {
            let warmup = p.alloc(0, pl.resident_params().iter().sum(), Category::Transient);
            p.free(warmup);
            for b in pl.resident() {
                p.alloc(0, b, Category::Parameters);
            }
        }
    }
    let streams = Streams::of(pl);
    if streams.is_some() {
        p.empty_cache();
    }
    let proc = Process {
        streams,
        ..Process::default()
    };
    let q = quant.map(|q| (q.quant, q.outliers));
    calls(p, proc, s, cfg, dec, q)
}

/// After the model's setup events: the prompt on the GPU, the warm-up and the measured call
/// (`proc` says which modules' weights are copied in as they run; `q`: the quantized
/// linears and LLM.int8's outlier columns).
pub(super) fn calls(
    mut p: Prog,
    mut proc: Process,
    s: &DecoderShape,
    cfg: &InferConfig,
    dec: &Decoding,
    q: Option<(QuantStorage, Int8Outliers)>,
) -> Events {
    p.alloc(cfg.prompt * 8, 0, Category::Activations);
    p.phase = Some(Phase::Forward);
    one_call(&mut p, &mut proc, s, cfg, dec, q);
    p.start_measured();
    one_call(&mut p, &mut proc, s, cfg, dec, q);
    p.finish()
}

fn one_call(
    p: &mut Prog,
    proc: &mut Process,
    s: &DecoderShape,
    cfg: &InferConfig,
    dec: &Decoding,
    quant: Option<(QuantStorage, Int8Outliers)>,
) {
    let d = cfg.dtype.size();
    let call = |t: u64, keep: u64, padding_mask: bool| Call {
        t,
        keep,
        padding_mask,
        d,
        bf16: cfg.dtype == crate::plan::config::DType::BF16,
        imp: cfg.attention,
        batch: cfg.batch,
        quant: quant.map(|q| q.0),
        outliers: quant.map_or(Int8Outliers::None, |q| q.1),
        decode: false,
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
        InferStep::Generate if dec.num_beams > 1 => {
            beam_search(p, proc, s, cfg, dec.num_beams, &call);
        }
        InferStep::Generate => {
            let mut cache = Cache::new(cfg.kv_cache, cfg.total_tokens(), s.layers);
            let (mut mask, mut positions) = mask_and_positions(p, pr);
            let ids_clone = p.act(pr * 8);
            let mut logits = forward(p, proc, s, &mut cache, call(pr, 1, true));
            p.free(ids_clone);
            let (mut next_logits, mut scores) = (Buf::NONE, Buf::NONE);
            let mut ids = Buf::NONE;
            let mut probs = Buf::NONE;
            let warpers = dec.warpers(s.vocab);
            for i in 1..=cfg.new_tokens {
                if i > 1 {
                    p.forward = u16::try_from(i - 1).unwrap_or(u16::MAX);
                    let decode = Call {
                        decode: true,
                        ..call(1, 1, true)
                    };
                    logits = forward(p, proc, s, &mut cache, decode);
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
                let sc = if dec.do_sample {
                    let sc = sampled_scores(p, s, &warpers);
                    // `next_token_scores` reassigned: the last token's scores go
                    p.free(scores);
                    scores = Buf::NONE;
                    // `probs = nn.functional.softmax(next_token_scores, dim=-1)`
                    let pr = p.act(s.vocab * 4);
                    p.free(probs);
                    probs = pr;
                    multinomial(p, s);
                    sc
                } else if s.eos {
                    min_new_tokens_processor(p, s.vocab)
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
            p.free(probs);
            p.free(mask);
            p.free(positions);
            // the returned sequences, dropped by the caller
            p.free(ids);
        }
    }
}

/// generate's `attention_mask = torch.ones(...)` for a prompt of `pr` tokens and its
/// `position_ids = attention_mask.cumsum(-1) - 1`, `masked_fill(attention_mask == 0, 0)`.
fn mask_and_positions(p: &mut Prog, pr: u64) -> (Buf, Buf) {
    let mask = p.act(pr * 8);
    let cumsum = p.act(pr * 8);
    let minus = p.act(pr * 8);
    p.free(cumsum);
    let eq = p.act(pr);
    let positions = p.act(pr * 8);
    p.free(eq);
    p.free(minus);
    (mask, positions)
}

/// `MinNewTokensLengthLogitsProcessor.__call__` on `[sequences, v]` fp32 scores: `clone`, an
/// `arange(v)`, `isin`, `torch.where`; returns the processed scores (the input stays with
/// the caller).
fn min_new_tokens_processor(p: &mut Prog, v: u64) -> Buf {
    let clone = p.act(v * 4);
    let vocab = p.fixed(v * 8);
    let isin = p.fixed(v);
    let out = p.act(v * 4);
    p.free(clone);
    p.free(vocab);
    p.free(isin);
    out
}

/// `model.generate(..., num_beams=nb)` (transformers 5.17 `_beam_search`), its large
/// tensors: the prompt's ids, attention mask and position ids repeated `nb` times
/// (`_expand_inputs_for_generation`: `repeat_interleave`, each replacing the one it copies),
/// `running_sequences` and `sequences` (`[batch, nb, max_length]` int64), the prefill and
/// every decode forward over `batch × nb` sequences; per token the fp32 copy of the last
/// logits, `log_softmax`, the `min_new_tokens` processor (as greedy's), `+
/// running_beam_scores` over `[batch, nb × vocab]`, the flattened running sequences of the
/// next step, and `reorder_cache(beam_idx)`: every layer's keys and values copied by
/// `index_select` in turn. The `[batch, 2·nb]` top-k candidates, scores and masks (a few
/// bytes per beam) are not modelled.
fn beam_search(
    p: &mut Prog,
    proc: &mut Process,
    s: &DecoderShape,
    cfg: &InferConfig,
    nb: u64,
    call: &dyn Fn(u64, u64, bool) -> Call,
) {
    let pr = cfg.prompt;
    let n = cfg.new_tokens;
    let mut cache = Cache::new(cfg.kv_cache, cfg.total_tokens(), s.layers);
    // before the expansion, as greedy: the mask and the position ids
    let (mask, positions) = mask_and_positions(p, pr);
    p.per_prompt = nb;
    let ids = p.act(pr * 8);
    let mut mask = {
        let m = p.act(pr * 8);
        p.free(mask);
        m
    };
    let mut positions = {
        let m = p.act(pr * 8);
        p.free(positions);
        m
    };
    let running = p.act((pr + n) * 8);
    let sequences = p.act((pr + n) * 8);
    let with_beams = |t: u64, keep: u64, mask: bool| Call {
        batch: cfg.batch * nb,
        ..call(t, keep, mask)
    };
    let ids_clone = p.act(pr * 8);
    let mut logits = forward(p, proc, s, &mut cache, with_beams(pr, 1, true));
    p.free(ids_clone);
    let (mut logits32, mut log_probs, mut flat) = (Buf::NONE, Buf::NONE, Buf::NONE);
    let v = s.vocab;
    let row = s.kv_width() * cfg.dtype.size();
    for i in 1..=n {
        if i > 1 {
            p.forward = u16::try_from(i - 1).unwrap_or(u16::MAX);
            // `flat_running_sequences = _flatten_beam_dim(running_sequences[:, :, :cur_len])`
            let f = p.act((pr + i - 1) * 8);
            p.free(flat);
            flat = f;
            logits = forward(p, proc, s, &mut cache, with_beams(1, 1, true));
        }
        let grown = p.act((pr + i) * 8);
        p.free(positions);
        positions = grown;
        let grown = p.act((pr + i) * 8);
        p.free(mask);
        mask = grown;
        // `logits = outputs.logits[:, -1, :].to(copy=True, dtype=float32)`
        let l32 = p.act(v * 4);
        p.free(logits32);
        logits32 = l32;
        // `log_probs = log_softmax(logits)`, then the processor's output replaces it
        let lsm = p.act(v * 4);
        p.free(log_probs);
        let processed = if s.eos {
            let out = min_new_tokens_processor(p, v);
            p.free(lsm);
            out
        } else {
            lsm
        };
        // `del model_outputs`
        p.free(logits);
        // `log_probs + running_beam_scores[:, :, None]`
        let plus = p.act(v * 4);
        p.free(processed);
        log_probs = plus;
        cache.reorder(p, &s.windows, row);
    }
    cache.release(p);
    for b in [
        logits32, log_probs, flat, mask, positions, running, sequences, ids,
    ] {
        p.free(b);
    }
    p.per_prompt = 0;
}

/// `next_token_scores = logits_processor(input_ids, next_token_logits)` of a sampling call
/// (`LogitsProcessorList.__call__`: `scores = processor(input_ids, scores)`, so each
/// processor's output replaces the previous one, which is freed; the first input, the fp32
/// logits `nl`, stays with the caller). The processors as `_get_logits_processor` orders them
/// (`generation/logits_process.py`):
/// - `MinLengthLogitsProcessor` (`min_new_tokens` sets `min_length` = prompt + N; with an EOS
///   token): `arange(vocab)`, `isin`, `scores.clone()`, `torch.where` (the clone dropped when
///   `scores_processed` is reassigned, the arange and mask when it returns);
/// - `MinNewTokensLengthLogitsProcessor`: `clone`, `arange`, `isin`, `where`;
/// - the warpers ([`warp`]).
///
/// Returns the scores (`Buf::NONE` when no processor ran: the logits themselves).
fn sampled_scores(p: &mut Prog, s: &DecoderShape, warpers: &[Warper]) -> Buf {
    let v = s.vocab;
    let mut cur = Buf::NONE;
    let replace = |p: &mut Prog, cur: &mut Buf, new: Buf| {
        p.free(*cur);
        *cur = new;
    };
    if s.eos {
        // MinLengthLogitsProcessor.__call__
        let vocab = p.fixed(v * 8);
        let isin = p.fixed(v);
        let clone = p.act(v * 4);
        let out = p.act(v * 4);
        p.free(clone);
        p.free(vocab);
        p.free(isin);
        replace(p, &mut cur, out);
        let out = min_new_tokens_processor(p, v);
        replace(p, &mut cur, out);
    }
    for &w in warpers {
        let out = warp(p, v, w);
        replace(p, &mut cur, out);
    }
    cur
}

/// One logits warper's allocations (`generation/logits_process.py`, `__call__`), the input
/// scores (`[batch, vocab]` fp32) live throughout; returns its output.
/// - `TemperatureLogitsWarper`: `scores / temperature`.
/// - `TopKLogitsWarper`: `scores < torch.topk(scores, k)[0][..., -1, None]`: the top-k
///   values (fp32) and indices (int64); the tuple goes at the subscript (the indices freed),
///   the values once the comparison's bool mask exists; `scores.masked_fill(mask, -inf)`; the
///   mask freed at return.
/// - `TopPLogitsWarper`: `torch.sort(scores)` (fp32 values, int64 indices), `.softmax()` then
///   `.cumsum()` (the softmax freed by the chain), `cumulative_probs <= 1 - top_p` (bool),
///   `fill_` of the last `min_tokens_to_keep` columns (in place), `.scatter(1, sorted_indices,
///   …)` (a new bool), `masked_fill` (fp32); the locals freed at return in their order.
///
/// Not modelled: the scratch of CUDA's topk (radix select) and sort (cub segmented sort)
/// kernels inside the ops.
fn warp(p: &mut Prog, v: u64, w: Warper) -> Buf {
    match w {
        Warper::Temperature => p.act(v * 4),
        Warper::TopK(k) => {
            let values = p.act(k * 4);
            let indices = p.act(k * 8);
            p.free(indices);
            let mask = p.act(v);
            p.free(values);
            let out = p.act(v * 4);
            p.free(mask);
            out
        }
        Warper::TopP => {
            let sorted = p.act(v * 4);
            let sorted_idx = p.act(v * 8);
            let soft = p.act(v * 4);
            let cum = p.act(v * 4);
            p.free(soft);
            let remove_sorted = p.act(v);
            let remove = p.act(v);
            let out = p.act(v * 4);
            for b in [sorted, sorted_idx, cum, remove_sorted, remove] {
                p.free(b);
            }
            out
        }
    }
}

/// `torch.multinomial(probs, num_samples=1)` (PyTorch `aten/src/ATen/native/Distributions.cpp`
/// `multinomial_out`, its one-sample fast path, CPU and CUDA alike): `q =
/// at::empty_like(self).exponential_()`, `div_out(q, self, q)`, `argmax_out` — one
/// `[batch, vocab]` fp32 temporary. Its `[batch]`-sized checks (`max`, `min`, `sum(1) == 0`)
/// and the `[batch, 1]` result are not modelled (as greedy's argmax is not).
fn multinomial(p: &mut Prog, s: &DecoderShape) {
    let q = p.act(s.vocab * 4);
    p.free(q);
}
