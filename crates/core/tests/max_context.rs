//! `vramlab max-context` (issue 29): the longest prompt (new tokens fixed) or the most new
//! tokens (prompt fixed) of an inference call that fits a GPU. The answer is checked by
//! planning the call at the answer (fits) and one token longer (does not), by the same rule
//! as `max-batch --step generate` ([`InferPlanner::fits`]); the cap at
//! `max_position_embeddings` and the errors name their field.

use vramlab_core::answer::max_context::{Limit, Searched, max_context};
use vramlab_core::model::{Preset, hf};
use vramlab_core::plan::config::DType;
use vramlab_core::plan::inference::{InferConfig, InferPlanner, InferStep};
use vramlab_core::plan::search::Budget;

fn preset(name: &str) -> Preset {
    let path = crate::data(&format!("hf_configs/{name}.json"));
    let text = std::fs::read_to_string(path).expect("config");
    hf::from_config_text(&text, name).expect("preset")
}

fn budget(gpu: &str) -> Budget {
    Budget {
        capacity: vramlab_words::find_gpu(gpu).expect("gpu").memory(),
        margin: 0.05,
    }
}

fn generate(batch: u64, prompt: u64, new_tokens: u64) -> InferConfig {
    InferConfig::generate(batch, prompt, new_tokens, DType::BF16)
}

/// Whether the call with `prompt` and `new` tokens fits, planned on its own.
fn fits(p: &Preset, base: &InferConfig, prompt: u64, new: u64, b: Budget) -> bool {
    let c = InferConfig {
        prompt,
        new_tokens: new,
        ..*base
    };
    InferPlanner::new(p, &c)
        .expect("planner")
        .fits(b, c.batch)
        .expect("fits")
}

/// The longest prompt of Qwen2.5-7B (bf16, 64 new tokens, batch 8) on an RTX 4090 fits and
/// one token more does not; the answer's plan is the call at that prompt.
#[test]
fn longest_prompt_fits_and_one_more_does_not() {
    let q = preset("Qwen2.5-7B");
    let b = budget("rtx-4090");
    let base = generate(8, 1, 64);
    let m = max_context(&q, &base, Searched::Prompt, b).expect("max-context");
    let l = m.max_length.expect("some prompt fits");
    assert!(fits(&q, &base, l, 64, b), "the answer {l} fits");
    assert!(!fits(&q, &base, l + 1, 64, b), "{} does not", l + 1);
    assert_eq!(m.next_length, Some(l + 1));
    assert_eq!(m.limited_by, Some(Limit::Memory));
    assert_eq!(m.length_cap, 131_072 - 64);
    let plan = m.plan.expect("plan");
    assert_eq!((plan.config.prompt, plan.config.new_tokens), (l, 64));
    assert!(plan.nvidia_smi_bytes <= b.usable());
    // the weights alone are 14.2 GiB of the 22.8 usable: thousands of tokens, not millions
    assert!((1000..131_072).contains(&l), "{l}");
}

/// With the prompt fixed the new tokens are searched: the answer fits, one more does not.
#[test]
fn most_new_tokens_fit_and_one_more_does_not() {
    let q = preset("Qwen2.5-0.5B");
    let b = budget("t4");
    let base = generate(1024, 64, 1);
    let m = max_context(&q, &base, Searched::NewTokens, b).expect("max-context");
    let n = m.max_length.expect("some new tokens fit");
    assert!(fits(&q, &base, 64, n, b), "the answer {n} fits");
    assert!(!fits(&q, &base, 64, n + 1, b), "{} does not", n + 1);
    assert_eq!(m.length_cap, 32_768 - 64);
    assert_eq!(m.limited_by, Some(Limit::Memory));
}

/// Phi-3-mini-4k (max_position_embeddings 4096) on an H200 at batch 1: the cap, not the
/// memory, stops the prompt: 4096 − 16 new tokens.
#[test]
fn max_position_embeddings_caps_the_length() {
    let phi = preset("Phi-3-mini-4k-instruct");
    let m = max_context(&phi, &generate(1, 1, 16), Searched::Prompt, budget("h200"))
        .expect("max-context");
    assert_eq!(m.max_length, Some(4096 - 16));
    assert_eq!(m.limited_by, Some(Limit::MaxPositions));
    assert_eq!(m.next_length, None);
    assert_eq!(m.max_position_embeddings, 4096);
}

/// Nothing fits: a 7B model's bf16 weights (14.2 GiB) on a 12 GiB card.
#[test]
fn nothing_fits_is_none() {
    let q = preset("Qwen2.5-7B");
    let m = max_context(&q, &generate(1, 1, 8), Searched::Prompt, budget("rtx-3060"))
        .expect("max-context");
    assert_eq!(m.max_length, None);
    assert!(m.plan.is_none() && m.limited_by.is_none());
}

/// Errors name the field: batch 0, new tokens leaving no room under
/// max_position_embeddings, a prompt likewise, a family inference does not model, new
/// tokens searched for a prefill.
#[test]
fn errors_name_the_field() {
    let phi = preset("Phi-3-mini-4k-instruct");
    let b = budget("h200");
    let e = max_context(&phi, &generate(0, 1, 16), Searched::Prompt, b).expect_err("batch 0");
    assert!(e.to_string().contains("batch"), "{e}");
    let e = max_context(&phi, &generate(1, 1, 4096), Searched::Prompt, b).expect_err("no room");
    let s = e.to_string();
    assert!(
        s.contains("new_tokens") && s.contains("4096") && s.contains("4095"),
        "{s}"
    );
    let e = max_context(&phi, &generate(1, 5000, 1), Searched::NewTokens, b).expect_err("prompt");
    assert!(e.to_string().contains("prompt"), "{e}");
    let bert = preset("bert-base-uncased");
    let e = max_context(&bert, &generate(1, 1, 16), Searched::Prompt, b).expect_err("bert");
    assert!(e.to_string().contains("model"), "{e}");
    let prefill = InferConfig {
        step: InferStep::Prefill,
        new_tokens: 0,
        ..generate(1, 100, 0)
    };
    let e = max_context(&phi, &prefill, Searched::NewTokens, b).expect_err("prefill");
    assert!(e.to_string().contains("step"), "{e}");
}
