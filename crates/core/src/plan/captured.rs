//! Planning a captured graph (`*.vramlab-graph.json`, [`crate::model::captured`]): its fitted
//! allocations become planner [`Events`], so evaluation, the caching-allocator model, the
//! max-batch search and the GPU check work as for a built model. What the capture does not
//! see — the cuBLAS workspaces PyTorch keeps per handle — comes from [`Constants`].
//! Settings that change the recorded step (precision, optimizer, loop, checkpointing,
//! accumulation, fine-tuning, input size) are refused with the re-capture to run.

use super::config::{DType, TrainConfig};
use super::error::PlanError;
use super::events::{Buffer, Category, Constants, Event, Events, Phase};
use super::kernel_temps;
use super::rules::conv_workspace_of;
use crate::model::captured::{BufferKind, CapturedGraph, ConvCall, StepPhase};

fn category(k: BufferKind) -> Category {
    match k {
        BufferKind::Parameter => Category::Parameters,
        BufferKind::Gradient => Category::Gradients,
        BufferKind::OptimizerState => Category::OptimizerState,
        BufferKind::Activation => Category::Activations,
        BufferKind::Temporary => Category::Transient,
    }
}

fn phase(p: StepPhase) -> Phase {
    match p {
        StepPhase::Setup => Phase::Setup,
        StepPhase::ZeroGrad => Phase::ZeroGrad,
        StepPhase::Forward => Phase::Forward,
        StepPhase::Backward => Phase::Backward,
        StepPhase::Optimizer => Phase::Optimizer,
    }
}

/// The event list of a capture, with the persistent workspaces of `k` allocated after the
/// warm-up step (as [`super::sim::generate`] places them), cuDNN's convolution workspaces and
/// the other kernels' own temporaries ([`super::kernel_temps`], sized exactly at `batch`).
pub fn events(c: &CapturedGraph, k: &Constants, batch: u64) -> Events {
    let mut buffers: Vec<Buffer> = c
        .buffers
        .iter()
        .map(|b| Buffer {
            side_stream: false,
            per_sample: b.per_sample,
            fixed: b.fixed,
            category: category(b.kind),
        })
        .collect();
    let mut events: Vec<Event> = Vec::with_capacity(c.events.len() + k.workspaces.len());
    let start = c.measured_start.min(c.events.len());
    let to_event = |e: &crate::model::captured::CapturedEvent| Event {
        buffer: e.buffer,
        alloc: e.alloc,
        phase: phase(e.phase),
        micro: 0,
        node: e.op,
    };
    let mut convs = c.convs.iter().peekable();
    let mut kernels = c.kernels.iter().peekable();
    let mut emit =
        |events: &mut Vec<Event>, buffers: &mut Vec<Buffer>, range: std::ops::Range<usize>| {
            for i in range {
                let Some(e) = c.events.get(i) else { break };
                events.push(to_event(e));
                while let Some(call) = convs.next_if(|x| x.after_event <= i) {
                    for (per_sample, fixed) in conv_workspaces(call) {
                        transient(events, buffers, per_sample, fixed, events[events.len() - 1]);
                    }
                }
                while let Some(call) = kernels.next_if(|x| x.after_event <= i) {
                    let (per_sample, fixed) = kernel_temps::affine_at(&call.kind, batch);
                    if per_sample > 0 || fixed > 0 {
                        transient(events, buffers, per_sample, fixed, events[events.len() - 1]);
                    }
                }
            }
        };
    emit(&mut events, &mut buffers, 0..start);
    // cuBLAS keeps one workspace per handle: the forward thread's from its first GEMM,
    // autograd's from its first GEMM in backward (and ~2 MiB of state with the first).
    let gemm_in = |p: StepPhase| {
        c.events
            .iter()
            .any(|e| e.alloc && e.phase == p && is_gemm(c.op_name(e.op)))
    };
    let [fwd, bwd, small] = k.workspaces;
    let used = match (gemm_in(StepPhase::Forward), gemm_in(StepPhase::Backward)) {
        (true, true) => [fwd, bwd, small],
        (true, false) | (false, true) => [fwd, 0, small],
        (false, false) => [0, 0, 0],
    };
    for &w in used.iter().filter(|&&w| w > 0) {
        events.push(Event {
            buffer: buffers.len() as u32,
            alloc: true,
            phase: Phase::Setup,
            micro: 0,
            node: u32::MAX,
        });
        buffers.push(Buffer {
            side_stream: false,
            per_sample: 0,
            fixed: w,
            category: Category::Transient,
        });
    }
    let measured_start = events.len();
    emit(&mut events, &mut buffers, start..c.events.len());
    Events {
        side_streams: false,
        whole_blocks: false,
        buffers,
        events,
        measured_start,
        empty_cache: Vec::new(),
        bound_at_one: None,
    }
}

/// The cuDNN workspaces of one recorded convolution ([`super::rules::conv_workspace_of`]):
/// forward, or backward's data- and filter-gradient kernels, as (per sample, fixed) bytes.
fn conv_workspaces(call: &ConvCall) -> Vec<(u64, u64)> {
    let dt = match (call.elem_bytes, call.bf16) {
        (4, _) => DType::F32,
        (_, true) => DType::BF16,
        _ => DType::F16,
    };
    let (fwd, ws) = conv_workspace_of(
        call.transposed,
        call.kernel,
        call.groups,
        call.out_channels,
        call.in_elems,
        call.out_elems,
        call.weight,
        dt,
    );
    let all = if call.backward {
        let mut v = Vec::new();
        if call.input_grad {
            v.push(ws.data);
        }
        if call.weight_grad {
            v.push(ws.filter);
        }
        v
    } else {
        vec![fwd]
    };
    all.into_iter().filter(|&(p, f)| p > 0 || f > 0).collect()
}

/// Allocates and frees a workspace right after `like` (same phase and op).
fn transient(
    events: &mut Vec<Event>,
    buffers: &mut Vec<Buffer>,
    per_sample: u64,
    fixed: u64,
    like: Event,
) {
    let buffer = buffers.len() as u32;
    buffers.push(Buffer {
        side_stream: false,
        per_sample,
        fixed,
        category: Category::Transient,
    });
    for alloc in [true, false] {
        events.push(Event {
            buffer,
            alloc,
            ..like
        });
    }
}

/// Whether an op name (`addmm@blocks.0.mlp.fc1`) is a cuBLAS GEMM.
fn is_gemm(op: &str) -> bool {
    let name = op.split('@').next().unwrap_or("");
    matches!(
        name,
        "mm" | "addmm" | "bmm" | "baddbmm" | "addbmm" | "_addmm_activation" | "mv" | "addmv"
    )
}

fn recapture(
    field: &'static str,
    c: &CapturedGraph,
    had: &str,
    want: &str,
    flag: &str,
) -> PlanError {
    PlanError::Field {
        field,
        reason: format!(
            "{} was captured with {field} {had}; the graph changes with it: re-capture with \
             `vramlab capture … {flag}` (asked: {want})",
            c.model
        ),
    }
}

/// A setting as the graph stores it: the serialized name `capture.py` writes (`amp-bf16`,
/// `adamw`), not a word a user typed.
fn stored<T: serde::de::DeserializeOwned>(field: &'static str, name: &str) -> Result<T, PlanError> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).map_err(|e| {
        PlanError::Field {
            field,
            reason: format!("the graph's settings.{field} `{name}` is not one vramlab writes: {e}"),
        }
    })
}

/// Checks that `cfg` asks for what the capture recorded.
pub fn check_settings(c: &CapturedGraph, cfg: &TrainConfig) -> Result<(), PlanError> {
    let s = &c.settings;
    let precision: super::config::Precision = stored("precision", &s.precision)?;
    if precision != cfg.precision {
        let want = cfg.precision.to_string();
        return Err(recapture(
            "precision",
            c,
            &s.precision,
            &want,
            &format!("--precision {want}"),
        ));
    }
    let optimizer: super::config::Optimizer = stored("optimizer", &s.optimizer)?;
    if optimizer != cfg.optimizer {
        let want = cfg.optimizer.to_string();
        return Err(recapture(
            "optimizer",
            c,
            &s.optimizer,
            &want,
            &format!("--optimizer {want}"),
        ));
    }
    let loop_shape: super::config::LoopShape = stored("loop", &s.loop_shape)?;
    if loop_shape != cfg.loop_shape {
        let want = cfg.loop_shape.as_str();
        return Err(recapture(
            "loop",
            c,
            &s.loop_shape,
            want,
            &format!("--loop {want}"),
        ));
    }
    if s.checkpointing != cfg.checkpointing {
        let (had, want) = if s.checkpointing {
            ("on", "off")
        } else {
            ("off", "on")
        };
        let flag = if cfg.checkpointing {
            "--checkpointing"
        } else {
            "(without --checkpointing)"
        };
        return Err(recapture("checkpointing", c, had, want, flag));
    }
    if cfg.checkpoint_reentrant {
        return Err(PlanError::Field {
            field: "checkpoint_reentrant",
            reason: format!(
                "{} was captured with non-reentrant checkpointing (runners/capture.py); \
                 reentrant checkpointing is planned for built models only",
                c.model
            ),
        });
    }
    if let Some(size) = cfg.size.filter(|&x| x != c.size) {
        let (what, flag) = if c.tokens {
            ("seq", "--seq")
        } else {
            ("image", "--image")
        };
        return Err(recapture(
            if c.tokens { "seq" } else { "image" },
            c,
            &c.size.to_string(),
            &format!("{what} {size}"),
            &format!("{flag} {size}"),
        ));
    }
    if cfg.target_seq.is_some() {
        return Err(PlanError::Field {
            field: "target_seq",
            reason: format!(
                "{}: a captured graph is not an encoder-decoder built here; its shapes are \
                 the captured ones",
                c.model
            ),
        });
    }
    if cfg.accum != 1 {
        return Err(PlanError::Field {
            field: "accum",
            reason: format!(
                "{}: a captured graph records one micro-step; gradient accumulation is not \
                 planned from captures yet (plan --accum 1)",
                c.model
            ),
        });
    }
    if !cfg.finetune.is_full() {
        return Err(PlanError::Field {
            field: "finetune",
            reason: format!(
                "{}: a captured graph trains what the capture trained; freeze or add adapters \
                 in the module and re-capture",
                c.model
            ),
        });
    }
    Ok(())
}
