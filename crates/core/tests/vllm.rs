//! vLLM's KV-cache capacity (`answer::vllm`), planned from vLLM's source (V1 engine:
//! `gpu_worker.py` `determine_available_memory`, `kv_cache_utils.py` `get_num_blocks`,
//! `get_max_concurrency_for_kv_cache_config`), not measured. The figures are computed here by
//! hand from those formulas and Llama-3.1-8B's config (32 layers, 8 KV heads of 128,
//! 8 030 261 248 parameters, vocabulary 128 256), independently of the function's arithmetic.

use vramlab_core::answer::vllm::{PLANNED_NOTE, VllmArgs, capacity};
use vramlab_core::model::{Preset, hf};
use vramlab_core::plan::DEFAULT_CUDA_CONTEXT;
use vramlab_core::units::Bytes;

fn preset(name: &str) -> Preset {
    let text =
        std::fs::read_to_string(crate::data(&format!("hf_configs/{name}.json"))).expect("config");
    hf::from_config_text(&text, name).expect("preset")
}

/// Llama-3.1-8B bf16 on an 80 GB A100 at 0.9: page per block per layer 2·16·8·128·2 =
/// 65 536 bytes; blocks = (0.9 × total − weights − activations − sampler − context) // 65 536
/// // 32; a 131 072-token request takes 8192 blocks, an 8192-token one 512.
#[test]
fn llama3_8b_on_an_80gb_card() {
    let llama = preset("Llama-3.1-8B");
    let total = vramlab_words::find_gpu("a100-80gb").expect("gpu").memory();
    assert_eq!(total, Bytes(81_920 << 20));
    let c = capacity(&llama, VllmArgs::default(), total, DEFAULT_CUDA_CONTEXT).expect("capacity");
    assert_eq!(c.note, PLANNED_NOTE);
    assert_eq!(c.page_size_bytes, 65_536);
    assert_eq!(c.num_layers, 32);
    let requested = (81_920u64 << 20) as f64 * 0.9;
    assert_eq!(c.requested_bytes.0, requested as u64);
    // bf16 weights and the rotary inv_freq / original_inv_freq buffers (2 × 64 fp32)
    assert_eq!(c.weights_bytes.0, 8_030_261_248 * 2 + 2 * 64 * 4);
    // logits of 256 rows in bf16 + two fp32 copies
    assert_eq!(c.sampler_bytes.0, 256 * 128_256 * (2 + 8));
    // the forward of 8192 tokens holds at least the MLP's gate and up outputs (bf16) and
    // less than 4 GiB
    let act = c.activation_peak_bytes.0;
    assert!((2 * 8192 * 14_336 * 2..4 << 30).contains(&act), "{act}");
    let non_kv = c.weights_bytes.0 + act + c.sampler_bytes.0 + (782 << 20);
    assert_eq!(c.non_kv_peak_bytes.0, non_kv);
    let available = requested as u64 - non_kv;
    assert_eq!(c.available_kv_bytes.0, available);
    let blocks = available / 65_536 / 32;
    assert_eq!(c.num_blocks, blocks);
    assert_eq!(c.kv_tokens, blocks * 16);
    assert_eq!(c.max_model_len, 131_072);
    assert_eq!(c.blocks_per_request, 8192);
    assert!((c.max_concurrency - blocks as f64 / 8192.0).abs() < 1e-12);
    assert!(c.starts);
    // about 55 GiB of KV cache: ~ 450 000 tokens at 128 KiB per token (32 layers × 4 KiB)
    assert!((400_000..500_000).contains(&c.kv_tokens), "{}", c.kv_tokens);
    let short = VllmArgs {
        max_model_len: Some(8192),
        ..VllmArgs::default()
    };
    let s = capacity(&llama, short, total, DEFAULT_CUDA_CONTEXT).expect("8k");
    assert_eq!(s.blocks_per_request, 512);
    assert!((s.max_concurrency - s.num_blocks as f64 / 512.0).abs() < 1e-12);
}

/// On a 24 GB card one 131 072-token request (16 GiB of KV cache) does not fit what is left
/// after 15 GiB of weights: vLLM refuses to start and estimates the longest length,
/// whole blocks of what is available.
#[test]
fn too_long_a_model_len_does_not_start() {
    let llama = preset("Llama-3.1-8B");
    let total = vramlab_words::find_gpu("rtx-4090").expect("gpu").memory();
    let c = capacity(&llama, VllmArgs::default(), total, DEFAULT_CUDA_CONTEXT).expect("capacity");
    assert!(!c.starts);
    let est = c.estimated_max_model_len.expect("estimate");
    assert_eq!(est, c.available_kv_bytes.0 / (65_536 * 32) * 16);
    assert!(est < 131_072 && est > 0, "{est}");
}

/// Errors name the field.
#[test]
fn errors_name_the_field() {
    let llama = preset("Llama-3.1-8B");
    let total = Bytes(80 << 30);
    let ctx = DEFAULT_CUDA_CONTEXT;
    let bad = |a: VllmArgs| {
        capacity(&llama, a, total, ctx)
            .expect_err("error")
            .to_string()
    };
    let d = VllmArgs::default();
    assert!(
        bad(VllmArgs {
            gpu_memory_utilization: 1.5,
            ..d
        })
        .contains("gpu_memory_utilization")
    );
    assert!(bad(VllmArgs { block_size: 0, ..d }).contains("block_size"));
    assert!(
        bad(VllmArgs {
            max_model_len: Some(200_000),
            ..d
        })
        .contains("max_model_len")
    );
    assert!(
        bad(VllmArgs {
            max_num_seqs: 0,
            ..d
        })
        .contains("max_num_seqs")
    );
    let gemma = preset("gemma-3-1b-pt");
    let e = capacity(&gemma, d, total, ctx)
        .expect_err("sliding")
        .to_string();
    assert!(e.contains("model") && e.contains("sliding"), "{e}");
    let bert = preset("bert-base-uncased");
    assert!(
        capacity(&bert, d, total, ctx)
            .expect_err("bert")
            .to_string()
            .contains("model")
    );
}
