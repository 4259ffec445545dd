//! The native engine's program for one batch, computed without a GPU (and tested in CI):
//! the planner's allocation events replayed through the caching-allocator model, so
//! every block the plan allocates has a real segment and offset, and each op's kernels
//! placed where the op runs — GEMMs of the op's real shapes (convolutions as their
//! im2col GEMM split into one GEMM per kernel tap), copies for memory-bound ops, fills
//! for the optimizer update — reading and writing the op's own buffers.
//!
//! Segments are what a PyTorch process gets from `cudaMalloc`; blocks inside them are
//! free to be reused, exactly as the caching allocator does. Every operand range lies
//! inside a segment that stays allocated for the whole step (the allocator only returns
//! segments on OOM), so kernels always touch valid device memory.

use std::ops::Range;

use vramlab_core::model::ir::Op;
use vramlab_core::model::work::{self, Gemm, Work};
use vramlab_core::plan::allocator::CachingAllocator;
use vramlab_core::plan::events::{Category, Phase};
use vramlab_core::plan::{DType, PlanError, Planner};

/// Bytes `[offset, offset + len)` of segment `segment`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub segment: u32,
    pub offset: u64,
    pub len: u64,
}

impl Span {
    fn skip(self, bytes: u64) -> Span {
        let bytes = bytes.min(self.len);
        Span {
            segment: self.segment,
            offset: self.offset + bytes,
            len: self.len - bytes,
        }
    }
}

/// A GEMM operand: a span read as `count` matrices `stride` elements apart (stride 0:
/// the same matrix every time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    pub span: Span,
    pub stride: u64,
}

/// One kernel of the program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kernel {
    /// Row-major `C = A · B`, `count` times: `A` is `m × k`, `B` is `k × n`, `C` is `m × n`.
    Gemm {
        dtype: DType,
        count: u32,
        m: u32,
        k: u32,
        n: u32,
        a: Operand,
        b: Operand,
        c: Operand,
    },
    /// Device-to-device copy of `min(src.len, dst.len)` bytes (memory-bound ops).
    Copy { src: Span, dst: Span },
    /// Memset of `dst` (the optimizer's update of parameters and state).
    Fill { dst: Span },
}

impl Kernel {
    /// FLOPs this kernel executes.
    pub fn flops(&self) -> f64 {
        match *self {
            Kernel::Gemm { count, m, k, n, .. } => {
                2.0 * f64::from(count) * f64::from(m) * f64::from(k) * f64::from(n)
            }
            _ => 0.0,
        }
    }

    /// Bytes this kernel moves (reads + writes, operands counted once).
    pub fn bytes(&self) -> u64 {
        match *self {
            Kernel::Gemm {
                dtype,
                count,
                m,
                k,
                n,
                ..
            } => {
                let e = dtype.size();
                u64::from(count)
                    * (u64::from(m) * u64::from(k)
                        + u64::from(k) * u64::from(n)
                        + u64::from(m) * u64::from(n))
                    * e
            }
            Kernel::Copy { src, dst } => 2 * src.len.min(dst.len),
            Kernel::Fill { dst } => dst.len,
        }
    }
}

/// One step of the program, in order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// `cudaMalloc` the next segment (index = segments allocated so far).
    Segment { bytes: u64 },
    /// `cudaFree` segment `i`: PyTorch releases cached segments that hold no live block
    /// when `cudaMalloc` fails, then retries (replayed when the schedule has a cap).
    Release(u32),
    /// Launch `kernels[i]`.
    Kernel(u32),
    /// Read device memory here (`probes[i]` says what the plan expects).
    Probe(u32),
}

/// A point of the measured step where device memory is read.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// Event index within the measured step.
    pub event: u32,
    /// Planned allocated and reserved bytes at this point.
    pub allocated: u64,
    pub reserved: u64,
    pub label: String,
}

/// The program for one batch.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub batch: u64,
    pub dtype: DType,
    /// Segment sizes in allocation order.
    pub segments: Vec<u64>,
    pub kernels: Vec<Kernel>,
    pub steps: Vec<Step>,
    pub probes: Vec<Probe>,
    /// The kernels of the measured (steady-state) step: the timed loop runs these.
    pub step_kernels: Range<usize>,
    /// FLOPs of one measured step as executed, and as the model's shapes demand (they
    /// differ only where an operand had to be clamped to its buffer).
    pub flops_executed: f64,
    pub flops_model: f64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
}

/// Why a schedule cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(
        "the native engine replays the default caching allocator; expandable_segments has no \
         fixed segments to replay (use the PyTorch engine for it)"
    )]
    Expandable,
}

/// Compute dtype of the GEMMs for a precision mode.
fn gemm_dtype(planner: &Planner) -> DType {
    planner.config.precision.compute_dtype()
}

struct Builder {
    /// Segments already returned to the device: kernels never touch them.
    released: Vec<bool>,
    dtype: DType,
    kernels: Vec<Kernel>,
    steps: Vec<Step>,
    model_flops: f64,
}

impl Builder {
    fn push(&mut self, k: Kernel) {
        let gone = |s: Span| {
            self.released
                .get(s.segment as usize)
                .copied()
                .unwrap_or(false)
        };
        let stale = match k {
            Kernel::Gemm { a, b, c, .. } => gone(a.span) || gone(b.span) || gone(c.span),
            Kernel::Copy { src, dst } => gone(src) || gone(dst),
            Kernel::Fill { dst } => gone(dst),
        };
        if stale {
            return;
        }
        self.steps.push(Step::Kernel(self.kernels.len() as u32));
        self.kernels.push(k);
    }

    /// Adds `gemm` reading `a`, `b` and writing `c`, shrunk where an operand's span is
    /// smaller than the shape needs.
    fn gemm(&mut self, g: Gemm, a: Span, b: Span, c: Span) {
        self.model_flops += g.flops();
        if let Some(k) = fit(self.dtype, g, a, b, c) {
            self.push(k);
        }
    }

    /// A convolution's GEMM as one GEMM per kernel tap (shift-and-add), each reading its
    /// operand shifted by one pixel: the im2col product without an im2col buffer. `axis`
    /// is the dimension that holds `cin/groups × taps` (k forward, n for the input
    /// gradient, m for the weight gradient).
    fn conv(&mut self, g: Gemm, taps: u64, axis: Axis, a: Span, b: Span, c: Span) {
        let dim = match axis {
            Axis::M => g.m,
            Axis::K => g.k,
            Axis::N => g.n,
        };
        if taps <= 1 || dim % taps != 0 {
            return self.gemm(g, a, b, c);
        }
        let per = dim / taps;
        let sub = match axis {
            Axis::M => Gemm { m: per, ..g },
            Axis::K => Gemm { k: per, ..g },
            Axis::N => Gemm { n: per, ..g },
        };
        let e = self.dtype.size();
        for t in 0..taps {
            // Shift the operand that carries the tap dimension by one tap's slice.
            let (a_t, b_t, c_t) = match axis {
                Axis::K => (a.skip(t * per * e), b.skip(t * per * sub.n * e), c),
                Axis::N => (a, b.skip(t * per * e), c.skip(t * per * e)),
                Axis::M => (a.skip(t * per * e), b, c.skip(t * per * sub.n * e)),
            };
            self.gemm(sub, a_t, b_t, c_t);
        }
    }
}

/// Which GEMM dimension carries a convolution's kernel taps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Axis {
    M,
    K,
    N,
}

/// Fits a GEMM into its operand spans: strides of one matrix where `count` matrices fit,
/// else stride 0; dimensions shrunk where even one matrix does not fit.
fn fit(dtype: DType, g: Gemm, a: Span, b: Span, c: Span) -> Option<Kernel> {
    let e = dtype.size();
    let cap = |x: u64| x.min(i32::MAX as u64);
    let (mut m, mut k, mut n) = (cap(g.m), cap(g.k), cap(g.n));
    let count = cap(g.count);
    let elems = |s: Span| s.len / e;
    for _ in 0..2 {
        if k * n > elems(b) {
            n = (elems(b) / k.max(1)).max(1);
            k = k.min(elems(b));
        }
        if m * k > elems(a) {
            m = (elems(a) / k.max(1)).max(1);
            k = k.min(elems(a));
        }
        if m * n > elems(c) {
            m = (elems(c) / n.max(1)).max(1);
            n = n.min(elems(c));
        }
    }
    if m == 0 || k == 0 || n == 0 || count == 0 {
        return None;
    }
    if m * k > elems(a) || k * n > elems(b) || m * n > elems(c) {
        return None;
    }
    let operand = |span: Span, per: u64| Operand {
        span,
        stride: if count * per <= elems(span) { per } else { 0 },
    };
    Some(Kernel::Gemm {
        dtype,
        count: count as u32,
        m: m as u32,
        k: k as u32,
        n: n as u32,
        a: operand(a, m * k),
        b: operand(b, k * n),
        c: operand(c, m * n),
    })
}

/// Builds the program for `batch` (micro-batch) of `planner`'s configuration. At most
/// `max_probes` memory probes are placed in the measured step (evenly, plus the last
/// event). With `cap` (the device's free bytes) the allocator model releases cached
/// segments before it would exceed the cap, as PyTorch does when `cudaMalloc` fails.
#[allow(
    clippy::too_many_lines,
    reason = "one pass over the events with its state in locals; not yet split"
)]
pub fn build(
    planner: &Planner,
    batch: u64,
    max_probes: usize,
    cap: Option<u64>,
) -> Result<Schedule, ScheduleError> {
    let cfg = planner.config.allocator;
    if cfg.expandable_segments {
        return Err(ScheduleError::Expandable);
    }
    let ev = &planner.events;
    let g = &planner.graph;
    let sizes: Vec<u64> = ev
        .buffers
        .iter()
        .map(|b| {
            b.per_sample
                .checked_mul(batch)
                .and_then(|x| x.checked_add(b.fixed))
                .ok_or(PlanError::Overflow("activation bytes"))
        })
        .collect::<Result<_, _>>()?;
    let peak = planner.peaks(batch)?;
    let dtype = gemm_dtype(planner);
    let e = dtype.size();

    let mut producer = vec![usize::MAX; g.tensors.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        producer[n.output] = i;
    }
    let mut alloc = match cap {
        Some(c) => CachingAllocator::with_cap(cfg, c),
        None => CachingAllocator::new(cfg),
    };
    let mut handle = vec![u32::MAX; ev.buffers.len()];
    let mut span: Vec<Option<Span>> = vec![None; ev.buffers.len()];
    let mut node_out: Vec<Option<Span>> = vec![None; g.nodes.len()];
    let mut segments = Vec::new();
    let mut b = Builder {
        released: Vec::new(),
        dtype,
        kernels: Vec::new(),
        steps: Vec::new(),
        model_flops: 0.0,
    };
    let mut probes = Vec::new();
    let mut step_kernels = 0..0;
    let mut group_allocs: Vec<Span> = Vec::new();
    let measured_events = ev.events.len().saturating_sub(ev.measured_start).max(1);
    let probe_every = measured_events.div_ceil(max_probes.max(1)).max(1);
    let mut flops_before_measured = 0.0;

    let param_span = |span: &[Option<Span>], node: usize| -> Option<Span> {
        g.nodes[node].params.first().and_then(|&p| span[p])
    };
    // An op that allocates nothing (in-place activation, view) leaves its input's
    // buffer as its output: follow the chain back to the op that allocated it.
    let input_span = |node_out: &[Option<Span>], node: usize, i: usize| -> Option<Span> {
        let mut t = *g.nodes[node].inputs.get(i)?;
        for _ in 0..64 {
            let p = producer[t];
            if p == usize::MAX {
                return None;
            }
            if let Some(s) = node_out[p] {
                return Some(s);
            }
            t = *g.nodes[p].inputs.first()?;
        }
        None
    };

    let n_events = ev.events.len();
    for i in 0..n_events {
        let event = ev.events[i];
        if i == ev.measured_start {
            step_kernels.start = b.kernels.len();
            flops_before_measured = b.model_flops;
        }
        let bi = event.buffer as usize;
        if event.alloc {
            let before = alloc.segment_count();
            let reserved_before = alloc.reserved;
            let h = alloc.malloc(sizes[bi]);
            let new_bytes: u64 = (before..alloc.segment_count())
                .map(|s| alloc.segment_size(s))
                .sum();
            if alloc.reserved < reserved_before + new_bytes {
                // Cached segments were released to make room: free them first.
                for s in 0..before {
                    if alloc.segment_released(s) && !b.released[s as usize] {
                        b.released[s as usize] = true;
                        b.steps.push(Step::Release(s));
                    }
                }
            }
            for s in before..alloc.segment_count() {
                let bytes = alloc.segment_size(s);
                segments.push(bytes);
                b.released.push(false);
                b.steps.push(Step::Segment { bytes });
            }
            handle[bi] = h;
            if let Some((segment, offset, len)) = alloc.block_location(h) {
                let s = Span {
                    segment,
                    offset,
                    len,
                };
                span[bi] = Some(s);
                group_allocs.push(s);
            }
        } else {
            alloc.free(handle[bi]);
        }
        let next = ev.events.get(i + 1);
        let group_ends = next
            .is_none_or(|n| (n.node, n.phase, n.micro) != (event.node, event.phase, event.micro));
        if !group_ends {
            continue;
        }
        let out = group_allocs.iter().copied().max_by_key(|s| s.len);
        let last_group = std::mem::take(&mut group_allocs);
        let node = event.node as usize;
        match event.phase {
            Phase::Forward if node < g.nodes.len() => {
                // The output is the block whose size is the output tensor's (in some
                // dtype); an op that allocated none wrote in place (or is a view).
                let t = &g.tensors[g.nodes[node].output];
                let elems = t.per_sample.saturating_mul(batch).saturating_add(t.fixed);
                let matched = last_group
                    .iter()
                    .copied()
                    .filter(|s| {
                        [1u64, 2, 4, 8].iter().any(|&e| {
                            let want = elems.saturating_mul(e);
                            s.len >= want && s.len <= want + (want / 8).max((1 << 20) + 512)
                        })
                    })
                    .max_by_key(|s| s.len);
                let own = matched.or_else(|| input_span(&node_out, node, 0)).or(out);
                node_out[node] = own;
                let Some(c) = own else { continue };
                let a = input_span(&node_out, node, 0).unwrap_or(c);
                let w = param_span(&span, node).unwrap_or(a);
                match work::forward(g, &g.nodes[node], batch) {
                    Work::Gemm { gemm, weight } => {
                        let rhs = if weight {
                            w
                        } else {
                            input_span(&node_out, node, 1).unwrap_or(a)
                        };
                        match g.nodes[node].op {
                            Op::Conv2d {
                                transposed: false,
                                kernel,
                                ..
                            } => b.conv(gemm, kernel * kernel, Axis::K, a, rhs, c),
                            _ => b.gemm(gemm, a, rhs, c),
                        }
                    }
                    Work::Attention { qk, pv } => {
                        let k = input_span(&node_out, node, 1).unwrap_or(a);
                        let v = input_span(&node_out, node, 2).unwrap_or(a);
                        // The score tile lives in registers/SRAM in a fused kernel: it is
                        // written over the output buffer, not a new one.
                        b.gemm(qk, a, k, c);
                        b.gemm(pv, c, v, c);
                    }
                    Work::Traffic { elems } => {
                        let bytes = elems.saturating_mul(e);
                        let dst = Span {
                            len: c.len.min(bytes.max(1)),
                            ..c
                        };
                        if a == c {
                            b.push(Kernel::Fill { dst });
                        } else {
                            b.push(Kernel::Copy { src: a, dst });
                        }
                    }
                    Work::None => {}
                }
            }
            Phase::Backward if node < g.nodes.len() => {
                let Some(fwd) = node_out[node].or(out) else {
                    continue;
                };
                let grad = out.unwrap_or(fwd);
                let a = input_span(&node_out, node, 0).unwrap_or(fwd);
                let w = param_span(&span, node).unwrap_or(a);
                match work::forward(g, &g.nodes[node], batch) {
                    Work::Gemm { gemm, weight } => {
                        let rhs = if weight {
                            w
                        } else {
                            input_span(&node_out, node, 1).unwrap_or(a)
                        };
                        let taps = match g.nodes[node].op {
                            Op::Conv2d {
                                transposed: false,
                                kernel,
                                ..
                            } => kernel * kernel,
                            _ => 1,
                        };
                        // dA = dC · Bᵀ, dB = Aᵀ · dC.
                        b.conv(gemm.dgrad(), taps, Axis::N, fwd, rhs, grad);
                        b.conv(gemm.wgrad(), taps, Axis::M, a, fwd, rhs);
                    }
                    Work::Attention { qk, pv } => {
                        b.gemm(qk, a, a, grad);
                        b.gemm(pv.dgrad(), fwd, a, grad);
                        b.gemm(pv.wgrad(), grad, fwd, grad);
                        b.gemm(qk.dgrad(), grad, a, grad);
                        b.gemm(qk.wgrad(), a, grad, grad);
                    }
                    Work::Traffic { .. } => {
                        if fwd == grad {
                            b.push(Kernel::Fill { dst: grad });
                        } else {
                            b.push(Kernel::Copy {
                                src: fwd,
                                dst: grad,
                            });
                        }
                    }
                    Work::None => {}
                }
            }
            Phase::Optimizer if next.is_none_or(|n| n.phase != Phase::Optimizer) => {
                // The update reads and writes every parameter and its state once.
                for (bi, buf) in ev.buffers.iter().enumerate() {
                    let live = matches!(
                        buf.category,
                        Category::Parameters | Category::OptimizerState
                    );
                    if let (true, Some(dst)) = (live, span[bi])
                        && handle[bi] != u32::MAX
                    {
                        b.push(Kernel::Fill { dst });
                    }
                }
            }
            _ => {}
        }
        if i >= ev.measured_start {
            let k = i - ev.measured_start;
            if k.is_multiple_of(probe_every) || next.is_none() {
                let label = if node < g.nodes.len() {
                    format!("{} {}", g.name(&g.nodes[node]), event.phase.label())
                } else {
                    event.phase.label().to_string()
                };
                b.steps.push(Step::Probe(probes.len() as u32));
                probes.push(Probe {
                    event: k as u32,
                    allocated: alloc.allocated,
                    reserved: alloc.reserved,
                    label,
                });
            }
        }
    }
    step_kernels.end = b.kernels.len();
    let flops_executed = b.kernels[step_kernels.clone()]
        .iter()
        .map(Kernel::flops)
        .sum();
    let flops_model = b.model_flops - flops_before_measured;
    Ok(Schedule {
        batch,
        dtype,
        segments,
        kernels: b.kernels,
        steps: b.steps,
        probes,
        step_kernels,
        flops_executed,
        flops_model,
        peak_allocated: peak.allocated.0,
        peak_reserved: alloc.peak_reserved,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramlab_core::model::preset::find_builtin;
    use vramlab_core::plan::{Precision, TrainConfig};

    fn planner(id: &str, precision: Precision) -> Planner {
        let p = find_builtin(id).expect("preset");
        let cfg = TrainConfig {
            precision,
            ..TrainConfig::default()
        };
        Planner::new(&p, &cfg).expect("planner")
    }

    fn in_bounds(s: &Schedule, span: Span, what: &str) {
        let seg = s.segments[span.segment as usize];
        assert!(
            span.offset + span.len <= seg,
            "{what}: {span:?} outside segment of {seg}"
        );
    }

    fn check(s: &Schedule) {
        for k in &s.kernels {
            match *k {
                Kernel::Gemm {
                    dtype,
                    count,
                    m,
                    k,
                    n,
                    a,
                    b,
                    c,
                } => {
                    let e = dtype.size();
                    let need =
                        |op: Operand, per: u64| (u64::from(count) - 1) * op.stride * e + per * e;
                    for (op, per, what) in [
                        (a, u64::from(m) * u64::from(k), "A"),
                        (b, u64::from(k) * u64::from(n), "B"),
                        (c, u64::from(m) * u64::from(n), "C"),
                    ] {
                        assert!(need(op, per) <= op.span.len, "{what} overruns {op:?}");
                        in_bounds(s, op.span, what);
                    }
                }
                Kernel::Copy { src, dst } => {
                    in_bounds(s, src, "copy src");
                    in_bounds(s, dst, "copy dst");
                }
                Kernel::Fill { dst } => in_bounds(s, dst, "fill"),
            }
        }
    }

    #[test]
    fn every_operand_lies_inside_its_segment() {
        for (id, prec) in [
            ("resnet50", Precision::Fp32),
            ("gpt2", Precision::AmpBf16),
            ("vit_b_16", Precision::AmpFp16),
            ("unet", Precision::Bf16),
            ("TinyLlama-1.1B", Precision::Bf16),
            ("mobilenet_v3_small", Precision::Fp32),
        ] {
            let p = planner(id, prec);
            for batch in [1, 3, 8] {
                let s = build(&p, batch, 200, None).expect("schedule");
                check(&s);
                assert!(!s.kernels.is_empty());
                assert!(s.probes.len() <= 201);
            }
        }
    }

    #[test]
    fn segments_are_the_planned_reserved_bytes() {
        let p = planner("gpt2", Precision::AmpBf16);
        let s = build(&p, 4, 50, None).expect("schedule");
        let peaks = p.peaks(4).expect("peaks");
        let total: u64 = s.segments.iter().sum();
        assert_eq!(total, s.peak_reserved);
        assert_eq!(total.max(peaks.allocated.0), peaks.reserved.0);
    }

    #[test]
    fn executed_flops_are_the_models() {
        // Clamping may only trim a little; the timed loop must do the model's arithmetic.
        for (id, prec, batch) in [
            ("gpt2", Precision::AmpBf16, 4),
            ("resnet50", Precision::Fp32, 16),
            ("vit_b_16", Precision::AmpBf16, 8),
        ] {
            let p = planner(id, prec);
            let s = build(&p, batch, 10, None).expect("schedule");
            let expect = work::step_flops(&p.graph, batch);
            let ratio = s.flops_executed / expect;
            assert!(
                (0.9..=1.01).contains(&ratio),
                "{id}: executed {:.3e} vs model {expect:.3e} ({ratio:.3})",
                s.flops_executed
            );
        }
    }

    #[test]
    fn a_cap_releases_cached_segments_and_kernels_avoid_them() {
        let p = planner("resnet50", Precision::AmpBf16);
        let free = build(&p, 64, 50, None).expect("schedule");
        // Just above the allocated peak: the model must give back cached segments.
        let cap = free.peak_allocated + (free.peak_reserved - free.peak_allocated) / 4;
        let s = build(&p, 64, 50, Some(cap)).expect("schedule");
        let released: Vec<u32> = s
            .steps
            .iter()
            .filter_map(|st| match st {
                Step::Release(i) => Some(*i),
                _ => None,
            })
            .collect();
        assert!(!released.is_empty(), "no segment released under the cap");
        // No kernel after a release touches the released segment.
        let mut gone = vec![false; s.segments.len()];
        for st in &s.steps {
            match *st {
                Step::Release(i) => gone[i as usize] = true,
                Step::Kernel(k) => {
                    let spans: Vec<Span> = match s.kernels[k as usize] {
                        Kernel::Gemm { a, b, c, .. } => vec![a.span, b.span, c.span],
                        Kernel::Copy { src, dst } => vec![src, dst],
                        Kernel::Fill { dst } => vec![dst],
                    };
                    assert!(spans.iter().all(|sp| !gone[sp.segment as usize]));
                }
                _ => {}
            }
        }
        check(&s);
    }

    #[test]
    fn expandable_segments_are_refused_with_a_reason() {
        let p = find_builtin("gpt2").expect("preset");
        let mut cfg = TrainConfig::default();
        cfg.allocator.expandable_segments = true;
        let planner = Planner::new(&p, &cfg).expect("planner");
        let err = build(&planner, 1, 10, None).expect_err("refused");
        assert!(err.to_string().contains("expandable_segments"));
    }
}
