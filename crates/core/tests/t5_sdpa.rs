//! Which SDPA backend T5's attentions run, as the device observed it
//! (`tests/data/t5_sdpa_ops.jsonl`: the attention ops of a real training step, per op), and
//! whether the T5 builder plans the same: a trainable relative-position mask → PyTorch's
//! math backend (`bias_grad: true`), the zero cross-attention mask → a fused kernel.

use serde_json::Value;
use vramlab_core::model::families::transformer::AttnImpl;
use vramlab_core::model::ir::Op;

/// `[batch, heads, q, k]` of a recorded tensor.
fn shape(t: &Value) -> Vec<u64> {
    t[0].as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

#[test]
fn t5_plans_the_backend_each_attention_ran() {
    let text = std::fs::read_to_string(crate::data("t5_sdpa_ops.jsonl")).expect("trace");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert!(
        lines[0]["versions"]["device_name"].is_string(),
        "header names the device"
    );
    let ops = &lines[1..];
    let configs: std::collections::BTreeSet<String> = ops
        .iter()
        .filter_map(|o| o["config"].as_str().map(str::to_string))
        .collect();
    assert_eq!(configs.len(), 2, "an autocast and an fp32 step");
    let mut checked = 0;
    for name in &configs {
        let rows: Vec<&Value> = ops
            .iter()
            .filter(|o| o["config"] == name.as_str())
            .collect();
        let first = rows[0];
        let (batch, seq, target) = (
            first["batch"].as_u64().expect("batch"),
            first["seq"].as_u64().expect("seq"),
            first["target_seq"].as_u64().expect("target_seq"),
        );
        let model = first["model"].as_str().expect("model");
        let text = std::fs::read_to_string(crate::data("").join("../..").join(model))
            .expect("config.json");
        let preset = vramlab_core::model::hf::from_config_text(&text, "t5").expect("t5 config");
        let g = preset
            .build_full(seq, Some(target), AttnImpl::Sdpa, 1.0)
            .expect("t5 graph");
        // (q_len, kv_len) → whether the trace ran it fused / as math, in the forward.
        let fused = |q: u64, k: u64| {
            rows.iter().any(|o| {
                let (qs, ks) = (shape(&o["in"][0]), shape(&o["in"][1]));
                o["phase"] == "fwd"
                    && o["op"]
                        .as_str()
                        .is_some_and(|s| s.contains("scaled_dot_product"))
                    && qs.len() == 4
                    && (qs[0], qs[2]) == (batch, q)
                    && ks.get(2) == Some(&k)
            })
        };
        let math = |q: u64, k: u64| {
            rows.iter().any(|o| {
                o["phase"] == "fwd"
                    && o["op"] == "_safe_softmax.default"
                    && shape(&o["in"][0]).get(2..) == Some(&[q, k][..])
            })
        };
        for n in &g.nodes {
            if let Op::SdpaBias {
                q_len,
                kv_len,
                bias_grad,
                ..
            } = n.op
            {
                let (f, m) = (fused(q_len, kv_len), math(q_len, kv_len));
                assert!(
                    f != m,
                    "{name}: ({q_len}, {kv_len}) ran fused {f}, math {m}"
                );
                assert_eq!(
                    bias_grad, m,
                    "{name}: attention ({q_len}, {kv_len}) planned bias_grad={bias_grad}, the device ran math={m}"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 2 * 18,
        "every attention of both steps checked: {checked}"
    );
}
