//! The kernel calls of a capture (`"kernels"` in a `*.vramlab-graph.json`): ops whose CUDA
//! kernels allocate temporaries of their own through the caching allocator — reductions'
//! cross-block staging buffers, `roll`'s and softmax backward's extra copies, layer norm's
//! contiguous copies, the attention backward kernels' fp32 accumulators. Fake tensors do
//! not see them; `runners/capture.py` records the sizes the rules need
//! ([`crate::plan::kernel_temps`]) as `per_sample × batch + fixed` pairs.
//!
//! One call: `[event, op, phase, {feature: [per_sample, fixed] | bool}]`, the event after
//! which the kernel runs (its last output's allocation). Unknown ops are skipped (a newer
//! capture helper may record more than this version plans).

use super::checks::ModelError;

/// `per_sample × batch + fixed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lin {
    pub per_sample: u64,
    pub fixed: u64,
}

impl Lin {
    pub fn at(self, batch: u64) -> u64 {
        self.per_sample
            .saturating_mul(batch)
            .saturating_add(self.fixed)
    }
}

/// The scaled-dot-product-attention backward kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionBackend {
    Cudnn,
    Flash,
    Efficient,
}

/// What one recorded kernel needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelKind {
    /// `sum`, `mean`, `linalg_vector_norm`, `amax`, ... (ATen's `Reduce.cuh`): `outs`
    /// outputs of `ins` inputs each; whether the input's stride-1 dimension is reduced; the
    /// output vector width.
    Reduction {
        outs: Lin,
        ins: Lin,
        fast_reduced: bool,
        vec: u64,
    },
    /// A temporary of `bytes` (roll, softmax backward, layer norm's contiguous copies).
    Copy { bytes: Lin },
    /// Attention backward over `bh` = batch × heads rows of `s` queries, head size `d`.
    Attention {
        backend: AttentionBackend,
        bh: Lin,
        s: u64,
        d: u64,
    },
}

/// One recorded kernel call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelCall {
    pub after_event: usize,
    pub kind: KernelKind,
}

fn bad(field: String, reason: &str) -> ModelError {
    ModelError::Invalid {
        field,
        reason: reason.to_string(),
    }
}

fn lin(
    f: &serde_json::Map<String, serde_json::Value>,
    key: &str,
    at: &str,
) -> Result<Lin, ModelError> {
    let field = || format!("{at}.{key}");
    let v = f.get(key).ok_or_else(|| bad(field(), "missing"))?;
    if let Some(n) = v.as_u64() {
        return Ok(Lin {
            per_sample: 0,
            fixed: n,
        });
    }
    let pair = v
        .as_array()
        .filter(|a| a.len() == 2)
        .and_then(|a| Some((a[0].as_u64()?, a[1].as_u64()?)))
        .ok_or_else(|| bad(field(), "must be [per_sample, fixed] (whole numbers)"))?;
    if pair.0 > super::checks::MAX_DIM * super::checks::MAX_DIM || pair.1 > 1 << 50 {
        return Err(bad(field(), "is absurdly large"));
    }
    Ok(Lin {
        per_sample: pair.0,
        fixed: pair.1,
    })
}

/// Parses `kernels`; `n_events` bounds the event indices.
pub fn parse(
    calls: &[Vec<serde_json::Value>],
    n_events: usize,
) -> Result<Vec<KernelCall>, ModelError> {
    let mut out = Vec::with_capacity(calls.len());
    for (i, call) in calls.iter().enumerate() {
        let at = format!("kernels[{i}]");
        let event = call
            .first()
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad(format!("{at}[0]"), "must be an event index"))?
            as usize;
        if event >= n_events {
            return Err(bad(format!("{at}[0]"), "is past the last event"));
        }
        let op = call
            .get(1)
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| bad(format!("{at}[1]"), "must be an op name"))?;
        let f = call
            .get(3)
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| bad(format!("{at}[3]"), "must be an object of features"))?;
        let at = format!("{at}[3]");
        let attention = |backend| -> Result<KernelKind, ModelError> {
            Ok(KernelKind::Attention {
                backend,
                bh: lin(f, "bh", &at)?,
                s: lin(f, "s", &at)?.fixed,
                d: lin(f, "d", &at)?.fixed,
            })
        };
        let kind = match op {
            "sum" | "mean" | "linalg_vector_norm" | "norm" | "amax" | "amin" => {
                KernelKind::Reduction {
                    outs: lin(f, "outs", &at)?,
                    ins: lin(f, "ins", &at)?,
                    fast_reduced: f
                        .get("fast_reduced")
                        .and_then(serde_json::Value::as_bool)
                        .ok_or_else(|| {
                            bad(format!("{at}.fast_reduced"), "must be true or false")
                        })?,
                    vec: lin(f, "vec", &at)?.fixed.clamp(1, 16),
                }
            }
            "roll"
            | "_softmax_backward_data"
            | "native_layer_norm"
            | "native_layer_norm_backward" => KernelKind::Copy {
                bytes: lin(f, "bytes", &at)?,
            },
            "_scaled_dot_product_cudnn_attention_backward" => attention(AttentionBackend::Cudnn)?,
            "_scaled_dot_product_flash_attention_backward" => attention(AttentionBackend::Flash)?,
            "_scaled_dot_product_efficient_attention_backward" => {
                attention(AttentionBackend::Efficient)?
            }
            _ => continue,
        };
        out.push(KernelCall {
            after_event: event,
            kind,
        });
    }
    out.sort_by_key(|k| k.after_event);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(text: &str) -> Vec<Vec<serde_json::Value>> {
        serde_json::from_str(text).expect("json")
    }

    #[test]
    fn parses_known_ops_skips_unknown_ones_and_sorts() {
        let c = calls(
            r#"[[9, "roll", "f", {"bytes": [1024, 0]}],
                [3, "sum", "b", {"outs": [0, 768], "ins": [197, 0], "fast_reduced": false, "vec": 4}],
                [5, "some_future_op", "b", {}],
                [7, "_scaled_dot_product_flash_attention_backward", "b", {"bh": [4, 0], "s": 256, "d": [0, 40]}]]"#,
        );
        let k = parse(&c, 10).expect("parses");
        assert_eq!(k.len(), 3);
        assert_eq!(k[0].after_event, 3);
        assert!(matches!(
            k[1].kind,
            KernelKind::Attention { s: 256, d: 40, .. }
        ));
        assert!(matches!(k[2].kind, KernelKind::Copy { bytes } if bytes.at(2) == 2048));
    }

    #[test]
    fn malformed_calls_name_the_field() {
        for (text, field) in [
            (r#"[["x", "sum", "b", {}]]"#, "kernels[0][0]"),
            (r#"[[99, "roll", "f", {"bytes": 1}]]"#, "kernels[0][0]"),
            (r#"[[1, 5, "f", {}]]"#, "kernels[0][1]"),
            (r#"[[1, "roll", "f", 3]]"#, "kernels[0][3]"),
            (r#"[[1, "roll", "f", {}]]"#, "kernels[0][3].bytes"),
            (
                r#"[[1, "roll", "f", {"bytes": [1, -2]}]]"#,
                "kernels[0][3].bytes",
            ),
            (
                r#"[[1, "sum", "b", {"outs": 1, "ins": 2, "vec": 4}]]"#,
                "fast_reduced",
            ),
        ] {
            let e = parse(&calls(text), 10).expect_err(text).to_string();
            assert!(e.contains(field), "{text}: {e}");
        }
    }
}
