//! A captured model: the storage allocations and frees of one training step of any PyTorch
//! model, recorded by `runners/capture.py` on fake tensors at several batch sizes
//! (`model.vramlab-graph.json`). Parsing fits every allocation as `per_sample × batch + fixed`
//! from two batches and checks the fit on the others; what does not scale is refused, naming
//! the op. [`crate::plan::captured`] turns the result into planner events.
//!
//! The file (`"format": "vramlab-graph"`, `"version": 1`):
//! - `model`, `torch` (strings), `capture` (free-form: fake or real, device, seconds);
//! - `input`: `kind` (`image` | `tokens`), `size` (image side or sequence length), `shape`;
//! - `settings`: `precision`, `optimizer`, `loop`, `checkpointing` (what the step ran with:
//!   changing one needs a re-capture);
//! - `params`: `count`, `trainable`;
//! - `ops`: op names (`convolution@layer1.0.conv1`), indexed by `event_ops`;
//! - `buffers`: per buffer id, `dtype` and `category` (`p` parameter, `g` gradient,
//!   `o` optimizer state, empty: activation or temporary);
//! - `batches`: per batch size, `batch`, `measured_start` (first event of the measured step,
//!   after one warm-up step) and `events`: `[1, id, bytes, phase]` an allocation of raw
//!   (unrounded) bytes, `[0, id, 0, phase]` a free; phase `s` setup, `z` zero_grad,
//!   `f` forward, `b` backward, `o` optimizer step;
//! - `event_ops`: per event (of every batch: the structure is the same), the op index or -1;
//! - optional `convolutions` (cuDNN calls) and `kernels` (other kernels with temporaries of
//!   their own, [`super::captured_kernels`]).

use serde::Deserialize;

use super::checks::ModelError;

/// The current file version.
pub const FORMAT_VERSION: u32 = 1;
/// The file name suffix `vramlab` recognises.
pub const SUFFIX: &str = ".vramlab-graph.json";

/// What a captured buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferKind {
    Parameter,
    Gradient,
    OptimizerState,
    /// Allocated in the forward pass (or the input batch).
    Activation,
    /// Allocated in backward, the optimizer step or setup, not a parameter, grad or state.
    Temporary,
}

/// The step phase of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepPhase {
    Setup,
    ZeroGrad,
    Forward,
    Backward,
    Optimizer,
}

/// The most negative intercept accepted in a fit (bytes): see the parser.
pub const NEGATIVE_INTERCEPT_SLACK: i128 = 4096;

/// One buffer, fitted: `per_sample × batch + fixed` raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FittedBuffer {
    pub per_sample: u64,
    pub fixed: u64,
    pub kind: BufferKind,
}

/// One allocation or free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapturedEvent {
    pub buffer: u32,
    pub alloc: bool,
    pub phase: StepPhase,
    /// Index into [`CapturedGraph::ops`], or `u32::MAX`.
    pub op: u32,
}

/// The training settings the step was captured with (canonical vramlab names).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CaptureSettings {
    pub precision: String,
    pub optimizer: String,
    #[serde(rename = "loop")]
    pub loop_shape: String,
    pub checkpointing: bool,
}

/// A parsed, fitted capture.
#[derive(Debug, Clone, PartialEq)]
pub struct CapturedGraph {
    pub model: String,
    pub torch: String,
    pub tokens: bool,
    pub size: u64,
    pub settings: CaptureSettings,
    pub params: u64,
    pub trainable: u64,
    /// The batch sizes captured.
    pub batches: Vec<u64>,
    pub ops: Vec<String>,
    pub buffers: Vec<FittedBuffer>,
    pub events: Vec<CapturedEvent>,
    pub measured_start: usize,
    /// Convolution calls (cuDNN workspaces are not tensors: the planner adds them by rule).
    pub convs: Vec<ConvCall>,
    /// Other kernels with temporaries of their own ([`super::captured_kernels`]); empty in
    /// graphs captured before the helper recorded them.
    pub kernels: Vec<super::captured_kernels::KernelCall>,
}

/// One recorded convolution (forward or backward), per sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvCall {
    /// The event after which the kernel runs (its last output's allocation).
    pub after_event: usize,
    pub backward: bool,
    /// Backward: whether the input's / the weight's gradient is computed.
    pub input_grad: bool,
    pub weight_grad: bool,
    pub transposed: bool,
    pub kernel: u64,
    pub groups: u64,
    pub out_channels: u64,
    pub in_elems: u64,
    pub out_elems: u64,
    pub weight: u64,
    /// Bytes per element of the data (4, 2).
    pub elem_bytes: u64,
    pub bf16: bool,
}

impl serde::Serialize for CapturedGraph {
    /// A summary (the events stay in the graph file).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("CapturedGraph", 6)?;
        st.serialize_field("model", &self.model)?;
        st.serialize_field("torch", &self.torch)?;
        st.serialize_field("params", &self.params)?;
        st.serialize_field("batches", &self.batches)?;
        st.serialize_field("buffers", &self.buffers.len())?;
        st.serialize_field("events", &self.events.len())?;
        st.end()
    }
}

#[derive(Deserialize)]
struct Doc {
    format: String,
    version: u32,
    model: String,
    torch: String,
    input: DocInput,
    settings: CaptureSettings,
    params: DocParams,
    ops: Vec<String>,
    buffers: Vec<DocBuffer>,
    batches: Vec<DocBatch>,
    event_ops: Vec<i64>,
    #[serde(default)]
    convolutions: Option<DocConvs>,
    #[serde(default)]
    kernels: Vec<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct DocConvs {
    batch: u64,
    calls: Vec<Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct DocInput {
    kind: String,
    size: u64,
}

#[derive(Deserialize)]
struct DocParams {
    count: u64,
    trainable: u64,
}

#[derive(Deserialize)]
struct DocBuffer {
    #[allow(dead_code)]
    dtype: String,
    category: String,
}

#[derive(Deserialize)]
struct DocBatch {
    batch: u64,
    measured_start: usize,
    events: Vec<(u8, u32, u64, String)>,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> ModelError {
    ModelError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The `format` of a captured graph file.
pub const FORMAT: &str = "vramlab-graph";

/// Whether a parsed JSON document is a captured graph (its `format`).
pub fn is_graph_value(doc: &serde_json::Value) -> bool {
    doc.get("format").and_then(serde_json::Value::as_str) == Some(FORMAT)
}

/// Whether `text` looks like a graph file (its `format` key), so a `.json` path can be told
/// apart from a preset or a `config.json` before parsing it.
pub fn is_graph_text(text: &str) -> bool {
    let head = text.get(..text.len().min(512)).unwrap_or("");
    head.contains(&format!("\"{FORMAT}\""))
}

fn phase(code: &str, field: &str) -> Result<StepPhase, ModelError> {
    Ok(match code {
        "s" => StepPhase::Setup,
        "z" => StepPhase::ZeroGrad,
        "f" => StepPhase::Forward,
        "b" => StepPhase::Backward,
        "o" => StepPhase::Optimizer,
        other => {
            return Err(bad(
                field,
                format!("unknown phase `{other}` (known: s, z, f, b, o)"),
            ));
        }
    })
}

/// The largest captured file accepted: 1 Mi buffers, 4 Mi events per batch.
const MAX_BUFFERS: usize = 1 << 20;
const MAX_EVENTS: usize = 1 << 22;

impl CapturedGraph {
    /// Parses and fits a graph file; every problem names the field (or the op).
    pub fn from_json(text: &str) -> Result<CapturedGraph, ModelError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        let doc: Doc = serde_path_to_error::deserialize(de)
            .map_err(|e| bad(e.path().to_string(), e.inner().to_string()))?;
        Self::from_doc(doc)
    }

    /// As [`CapturedGraph::from_json`], from a parsed document (the GUI keeps the file's
    /// JSON as its custom model).
    pub fn from_value(v: &serde_json::Value) -> Result<CapturedGraph, ModelError> {
        let doc: Doc = serde_path_to_error::deserialize(v)
            .map_err(|e| bad(e.path().to_string(), e.inner().to_string()))?;
        Self::from_doc(doc)
    }

    fn from_doc(doc: Doc) -> Result<CapturedGraph, ModelError> {
        if doc.format != FORMAT {
            return Err(bad(
                "format",
                format!(
                    "`{}` is not a vramlab graph (expected vramlab-graph)",
                    doc.format
                ),
            ));
        }
        if doc.version != FORMAT_VERSION {
            return Err(bad(
                "version",
                format!(
                    "version {} is not supported (this vramlab reads {FORMAT_VERSION}); re-capture",
                    doc.version
                ),
            ));
        }
        let tokens = match doc.input.kind.as_str() {
            "tokens" => true,
            "image" => false,
            other => {
                return Err(bad(
                    "input.kind",
                    format!("unknown kind `{other}` (known: image, tokens)"),
                ));
            }
        };
        if doc.input.size == 0 || doc.input.size > super::checks::MAX_DIM {
            return Err(bad("input.size", "must be in 1..=1048576"));
        }
        if doc.buffers.len() > MAX_BUFFERS {
            return Err(bad("buffers", "more than 1048576 buffers"));
        }
        let (buffers, events, measured_start, batches) = fit(&doc)?;
        let convs = doc
            .convolutions
            .as_ref()
            .map(|c| conv_calls(c, events.len()))
            .transpose()?
            .unwrap_or_default();
        let kernels = super::captured_kernels::parse(&doc.kernels, events.len())?;
        Ok(CapturedGraph {
            model: doc.model,
            torch: doc.torch,
            tokens,
            size: doc.input.size,
            settings: doc.settings,
            params: doc.params.count,
            trainable: doc.params.trainable,
            batches,
            ops: doc.ops,
            buffers,
            events,
            measured_start,
            convs,
            kernels,
        })
    }

    /// The op name of an event (for messages and the peak layer).
    pub fn op_name(&self, op: u32) -> &str {
        self.ops.get(op as usize).map_or("-", String::as_str)
    }
}

type Fitted = (Vec<FittedBuffer>, Vec<CapturedEvent>, usize, Vec<u64>);

/// Fits every buffer from the first two batches and checks the others.
fn fit(doc: &Doc) -> Result<Fitted, ModelError> {
    let mut order: Vec<&DocBatch> = doc.batches.iter().collect();
    order.sort_by_key(|b| b.batch);
    let [b0, b1, ..] = order.as_slice() else {
        return Err(bad("batches", "at least two batch sizes are needed"));
    };
    if b0.batch == 0 || b0.batch == b1.batch {
        return Err(bad(
            "batches",
            "batch sizes must be distinct and at least 1",
        ));
    }
    let n = b0.events.len();
    if n > MAX_EVENTS {
        return Err(bad("batches[0].events", "more than 4194304 events"));
    }
    if doc.event_ops.len() != n {
        return Err(bad(
            "event_ops",
            format!("{} entries for {n} events", doc.event_ops.len()),
        ));
    }
    let op_of = |i: usize| -> u32 {
        doc.event_ops
            .get(i)
            .and_then(|&o| u32::try_from(o).ok())
            .filter(|&o| (o as usize) < doc.ops.len())
            .unwrap_or(u32::MAX)
    };
    let op_name = |i: usize| -> String {
        doc.ops
            .get(op_of(i) as usize)
            .cloned()
            .unwrap_or_else(|| "-".into())
    };
    for b in &order {
        if b.events.len() != n || b.measured_start != b0.measured_start {
            let at = b0
                .events
                .iter()
                .zip(&b.events)
                .position(|(x, y)| (x.0, x.1, &x.3) != (y.0, y.1, &y.3))
                .unwrap_or(n.min(b.events.len()));
            return Err(bad(
                format!("batches (batch {})", b.batch),
                format!(
                    "the allocations differ from batch {} at event {at} (op {}): the step does \
                     not scale with the batch; re-capture at the batch you train with",
                    b0.batch,
                    op_name(at)
                ),
            ));
        }
    }
    if b0.measured_start > n {
        return Err(bad("batches[0].measured_start", "past the last event"));
    }
    let nbuf = doc.buffers.len();
    let mut sizes: Vec<Option<(u64, u64)>> = vec![None; nbuf];
    let mut state = vec![0u8; nbuf];
    let mut events = Vec::with_capacity(n);
    let db = b1.batch - b0.batch;
    for i in 0..n {
        let e = &b0.events[i];
        let field = format!("batches[0].events[{i}]");
        let id = e.1 as usize;
        if id >= nbuf {
            return Err(bad(field, format!("buffer {id} but only {nbuf} buffers")));
        }
        for b in &order[1..] {
            let o = &b.events[i];
            if (o.0, o.1, &o.3) != (e.0, e.1, &e.3) {
                return Err(bad(
                    format!("batches (batch {})", b.batch),
                    format!(
                        "the allocations differ from batch {} at event {i} (op {}): the step \
                         does not scale with the batch; re-capture at the batch you train with",
                        b0.batch,
                        op_name(i)
                    ),
                ));
            }
        }
        let alloc = match e.0 {
            1 => true,
            0 => false,
            k => return Err(bad(field, format!("kind {k} (1 allocation, 0 free)"))),
        };
        match (alloc, state[id]) {
            (true, 0) => state[id] = 1,
            (false, 1) => state[id] = 2,
            _ => {
                return Err(bad(
                    field,
                    format!(
                        "buffer {id} {} twice or freed before it is allocated",
                        if alloc { "allocated" } else { "freed" }
                    ),
                ));
            }
        }
        if alloc {
            let (s0, s1) = (e.2, b1.events[i].2);
            let ps = s1.checked_sub(s0).filter(|d| d % db == 0).map(|d| d / db);
            // The intercept may be slightly negative: kernels that pad a per-sample size and
            // subtract a small header (`_efficient_attention_backward`: 978432 × batch − 24).
            let fixed = ps.map(|p| i128::from(s0) - i128::from(p) * i128::from(b0.batch));
            let (Some(ps), Some(fixed)) = (ps, fixed.filter(|&f| f >= -NEGATIVE_INTERCEPT_SLACK))
            else {
                return Err(not_affine(&op_name(i), id, &order, i));
            };
            for b in &order[2..] {
                let want = i128::from(ps) * i128::from(b.batch) + fixed;
                if want != i128::from(b.events[i].2) {
                    return Err(not_affine(&op_name(i), id, &order, i));
                }
            }
            // A negative intercept is planned as 0 (at most the slack over, per buffer).
            let fixed = u64::try_from(fixed.max(0)).unwrap_or(u64::MAX);
            sizes[id] = Some((ps, fixed));
        }
        events.push(CapturedEvent {
            buffer: e.1,
            alloc,
            phase: phase(&e.3, &field)?,
            op: op_of(i),
        });
    }
    let buffers = fitted_buffers(&sizes, &doc.buffers, &events)?;
    let batches = order.iter().map(|b| b.batch).collect();
    Ok((buffers, events, b0.measured_start, batches))
}

/// The fitted buffers with their kinds (`sizes` from the fit, by buffer id).
fn fitted_buffers(
    sizes: &[Option<(u64, u64)>],
    docs: &[DocBuffer],
    events: &[CapturedEvent],
) -> Result<Vec<FittedBuffer>, ModelError> {
    let mut buffers = Vec::with_capacity(docs.len());
    for (id, (s, d)) in sizes.iter().zip(docs).enumerate() {
        let Some((per_sample, fixed)) = *s else {
            return Err(bad(format!("buffers[{id}]"), "never allocated"));
        };
        let first = events.iter().find(|e| e.buffer as usize == id && e.alloc);
        let kind = match d.category.as_str() {
            "p" => BufferKind::Parameter,
            "g" => BufferKind::Gradient,
            "o" => BufferKind::OptimizerState,
            "" => match first.map(|e| e.phase) {
                Some(StepPhase::Forward) => BufferKind::Activation,
                _ => BufferKind::Temporary,
            },
            other => {
                return Err(bad(
                    format!("buffers[{id}].category"),
                    format!("unknown category `{other}` (known: p, g, o, or empty)"),
                ));
            }
        };
        buffers.push(FittedBuffer {
            per_sample,
            fixed,
            kind,
        });
    }
    Ok(buffers)
}

fn not_affine(op: &str, id: usize, order: &[&DocBatch], i: usize) -> ModelError {
    let seen: Vec<String> = order
        .iter()
        .map(|b| format!("{} B at batch {}", b.events[i].2, b.batch))
        .collect();
    bad(
        format!("op {op}"),
        format!(
            "buffer {id} does not scale as per_sample × batch + fixed ({}); this model cannot \
             be planned from a capture at other batches: re-capture at the batch you train with",
            seen.join(", ")
        ),
    )
}

fn dims(v: Option<&serde_json::Value>, field: &str) -> Result<Vec<u64>, ModelError> {
    v.and_then(|x| x.as_array())
        .and_then(|a| {
            a.iter()
                .map(serde_json::Value::as_u64)
                .collect::<Option<Vec<u64>>>()
        })
        .ok_or_else(|| bad(field, "must be a list of whole numbers"))
}

/// The recorded convolution calls: `[event, input shape, weight shape, stride, padding,
/// dilation, transposed, groups, dtype, phase(, outputs)]`, shapes at `batch`.
fn conv_calls(c: &DocConvs, n_events: usize) -> Result<Vec<ConvCall>, ModelError> {
    let mut out = Vec::with_capacity(c.calls.len());
    if c.batch == 0 {
        return Err(bad("convolutions.batch", "must be at least 1"));
    }
    for (i, call) in c.calls.iter().enumerate() {
        let f = |k: usize| format!("convolutions.calls[{i}][{k}]");
        let event = call
            .first()
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad(f(0), "must be an event index"))? as usize;
        let input = dims(call.get(1), &f(1))?;
        let weight = dims(call.get(2), &f(2))?;
        let stride = dims(call.get(3), &f(3))?;
        let padding = dims(call.get(4), &f(4))?;
        let dilation = dims(call.get(5), &f(5))?;
        let transposed = call
            .get(6)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        let groups = call
            .get(7)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1)
            .max(1);
        let dtype = call
            .get(8)
            .and_then(serde_json::Value::as_str)
            .unwrap_or("");
        let backward = call.get(9).and_then(serde_json::Value::as_str) == Some("backward");
        let outputs = call
            .get(10)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(1)
            .max(1);
        let mask = |k: usize| {
            call.get(11)
                .and_then(|m| m.get(k))
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(true)
        };
        let elem_bytes = match dtype {
            "float32" => 4,
            "bfloat16" | "float16" => 2,
            _ => continue,
        };
        // 2-D convolutions with square kernels only (the rules' measurements).
        if input.len() != 4 || weight.len() != 4 || weight[2] != weight[3] {
            continue;
        }
        let spatial = |k: usize| -> Option<u64> {
            let (x, s, p, d) = (
                input.get(2 + k)?,
                stride.get(k).or(stride.first())?,
                padding.get(k).or(padding.first())?,
                dilation.get(k).or(dilation.first())?,
            );
            let kk = weight[2 + k];
            if transposed {
                (x.checked_sub(1)?)
                    .checked_mul(*s)?
                    .checked_add(d.checked_mul(kk.checked_sub(1)?)?)?
                    .checked_add(1)?
                    .checked_sub(2 * p)
            } else {
                let span = d.checked_mul(kk.checked_sub(1)?)?.checked_add(1)?;
                Some((x.checked_add(2 * p)?.checked_sub(span)?) / (*s).max(1) + 1)
            }
        };
        let (Some(h), Some(w)) = (spatial(0), spatial(1)) else {
            continue;
        };
        let out_channels = if transposed {
            weight[1].saturating_mul(groups)
        } else {
            weight[0]
        };
        let per = |v: u64| v / c.batch.max(1);
        let in_total = input.iter().try_fold(1u64, |a, &x| a.checked_mul(x));
        let (Some(in_total), Some(out_total)) = (
            in_total,
            input[0]
                .checked_mul(out_channels)
                .and_then(|x| x.checked_mul(h))
                .and_then(|x| x.checked_mul(w)),
        ) else {
            continue;
        };
        let after = event.saturating_add(outputs as usize - 1);
        if after >= n_events {
            return Err(bad(f(0), format!("event {event} past the last event")));
        }
        out.push(ConvCall {
            after_event: after,
            backward,
            input_grad: !backward || mask(0),
            weight_grad: !backward || mask(1),
            transposed,
            kernel: weight[2],
            groups,
            out_channels,
            in_elems: per(in_total),
            out_elems: per(out_total),
            weight: weight.iter().product(),
            elem_bytes,
            bf16: dtype == "bfloat16",
        });
    }
    out.sort_by_key(|c| c.after_event);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-buffer step: a parameter (fixed) and an activation (per sample), at `batches`
    /// with the activation's bytes given by `act`.
    fn doc(batches: &[(u64, u64)]) -> String {
        let b: Vec<String> = batches
            .iter()
            .map(|(batch, act)| {
                format!(
                    r#"{{"batch":{batch},"measured_start":1,"events":[[1,0,4096,"s"],[1,1,{act},"f"],[0,1,0,"b"]]}}"#
                )
            })
            .collect();
        format!(
            r#"{{"format":"vramlab-graph","version":1,"model":"t","torch":"2.11",
            "input":{{"kind":"image","size":32,"shape":[3,32,32]}},
            "settings":{{"precision":"fp32","optimizer":"sgd","loop":"plain","checkpointing":false}},
            "params":{{"count":1024,"trainable":1024}},"ops":["empty","relu@act"],
            "buffers":[{{"dtype":"float32","category":"p"}},{{"dtype":"float32","category":""}}],
            "batches":[{}],"event_ops":[0,1,-1]}}"#,
            b.join(",")
        )
    }

    #[test]
    fn fits_per_sample_and_fixed() {
        let g = CapturedGraph::from_json(&doc(&[(2, 2100), (4, 4100), (6, 6100)])).expect("ok");
        assert_eq!(g.buffers[1].per_sample, 1000);
        assert_eq!(g.buffers[1].fixed, 100);
        assert_eq!(g.buffers[0].kind, BufferKind::Parameter);
        assert_eq!(g.buffers[1].kind, BufferKind::Activation);
        assert_eq!(g.op_name(g.events[1].op), "relu@act");
    }

    #[test]
    fn a_slightly_negative_intercept_is_planned_as_zero() {
        // _efficient_attention_backward on the H200: 978432 × batch − 24 bytes.
        let g = CapturedGraph::from_json(&doc(&[(2, 1956840), (4, 3913704), (6, 5870568)]))
            .expect("affine with intercept -24");
        assert_eq!(g.buffers[1].per_sample, 978432);
        assert_eq!(g.buffers[1].fixed, 0);
        // Beyond the slack it is refused.
        let e = CapturedGraph::from_json(&doc(&[(2, 1_000_000), (4, 2_010_000), (6, 3_020_000)]))
            .expect_err("intercept -10000");
        assert!(e.to_string().contains("relu@act"), "{e}");
    }

    #[test]
    fn refuses_what_does_not_scale_naming_the_op() {
        let e = CapturedGraph::from_json(&doc(&[(2, 2100), (4, 4100), (6, 7000)]))
            .expect_err("not affine");
        assert!(e.to_string().contains("relu@act"), "{e}");
        let e = CapturedGraph::from_json(&doc(&[(2, 2100)])).expect_err("one batch");
        assert!(e.to_string().contains("batches"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let text = doc(&[(2, 2100), (4, 4100)]).replace("\"version\":1", "\"version\":\"x\"");
        let e = CapturedGraph::from_json(&text).expect_err("bad version");
        assert!(e.to_string().contains("version"), "{e}");
        let text = doc(&[(2, 2100), (4, 4100)]).replace("\"f\"]", "\"q\"]");
        let e = CapturedGraph::from_json(&text).expect_err("bad phase");
        assert!(e.to_string().contains("events[1]"), "{e}");
        let text = doc(&[(2, 2100), (4, 4100)]).replace("\"kind\":\"image\"", "\"kind\":\"video\"");
        let e = CapturedGraph::from_json(&text).expect_err("bad kind");
        assert!(e.to_string().contains("input.kind"), "{e}");
        for cut in [0, 10, 100, 300] {
            let t = doc(&[(2, 2100), (4, 4100)]);
            assert!(CapturedGraph::from_json(t.get(..cut).unwrap_or("")).is_err());
        }
    }
}
