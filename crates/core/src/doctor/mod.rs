//! OOM doctor: reads a "CUDA out of memory" message and/or a memory snapshot, says why
//! the allocation failed and what to change.
//!
//! Pure: depends on std, serde, serde_json and thiserror only (and [`crate::units`]).
//! The planner's answers (the batch that fits, planned remedies) are added by the callers.

mod error;
pub mod legacy;
pub mod message;
pub mod overlay;
pub mod pickle;
pub mod snapshot;

use serde::Serialize;

pub use error::DoctorError;
pub use message::{MessageFormat, OomMessage, ProcessUse, parse_message};
pub use snapshot::{Frame, Snapshot, SnapshotReport, analyze};

use crate::units::{Bytes, GIB, MIB};

/// Why the allocation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The step needs more memory than the GPU has: PyTorch's own tensors fill it.
    Capacity,
    /// Enough memory is cached or free in total, but not in one piece.
    Fragmentation,
    /// This process holds memory outside PyTorch's caching allocator.
    OutsideAllocator,
    /// Other processes hold the GPU's memory.
    OtherProcesses,
    /// `set_per_process_memory_fraction` capped the allocator below what the GPU had free.
    ProcessCap,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Capacity => "capacity",
            Cause::Fragmentation => "fragmentation",
            Cause::OutsideAllocator => "outside_allocator",
            Cause::OtherProcesses => "other_processes",
            Cause::ProcessCap => "process_cap",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Cause::Capacity => "Not enough memory for this step (capacity)",
            Cause::Fragmentation => "Fragmentation: free memory exists, but not in one piece",
            Cause::OutsideAllocator => "Memory held outside PyTorch's allocator in this process",
            Cause::OtherProcesses => "Other processes hold the GPU's memory",
            Cause::ProcessCap => "The per-process memory fraction caps PyTorch",
        }
    }
}

/// One thing to change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Remedy {
    pub title: String,
    pub detail: String,
    /// An environment setting or code line to use, when there is one.
    pub setting: Option<String>,
}

impl Remedy {
    fn new(title: impl Into<String>, detail: impl Into<String>, setting: Option<String>) -> Self {
        Remedy {
            title: title.into(),
            detail: detail.into(),
            setting,
        }
    }
}

/// The figures the diagnosis used (from the message, the snapshot, or both).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Figures {
    pub requested_bytes: Option<Bytes>,
    pub total_capacity_bytes: Option<Bytes>,
    pub device_free_bytes: Option<Bytes>,
    pub allowed_bytes: Option<Bytes>,
    pub allocated_bytes: Option<Bytes>,
    pub reserved_bytes: Option<Bytes>,
    pub reserved_unallocated_bytes: Option<Bytes>,
    pub largest_free_block_bytes: Option<Bytes>,
    pub this_process_bytes: Option<Bytes>,
    /// This process minus PyTorch's reserved bytes (CUDA context included).
    pub outside_allocator_bytes: Option<Bytes>,
    pub other_processes_bytes: Option<Bytes>,
}

impl Figures {
    /// The figures that are known, with the words every front end shows them under, in
    /// the order shown.
    pub fn labelled(&self) -> Vec<(&'static str, Bytes)> {
        [
            ("requested", self.requested_bytes),
            ("GPU total capacity", self.total_capacity_bytes),
            ("GPU free", self.device_free_bytes),
            ("allowed (fraction cap)", self.allowed_bytes),
            ("allocated by PyTorch", self.allocated_bytes),
            ("reserved by PyTorch", self.reserved_bytes),
            ("reserved but unallocated", self.reserved_unallocated_bytes),
            ("largest free cached block", self.largest_free_block_bytes),
            ("this process (NVML)", self.this_process_bytes),
            ("outside the allocator", self.outside_allocator_bytes),
            ("other processes", self.other_processes_bytes),
        ]
        .into_iter()
        .filter_map(|(label, v)| v.map(|b| (label, b)))
        .collect()
    }
}

/// The doctor's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnosis {
    pub cause: Cause,
    pub summary: String,
    pub evidence: Vec<String>,
    /// Most useful first.
    pub remedies: Vec<Remedy>,
    pub figures: Figures,
    /// The traceback or the snapshot points at evaluation code running with autograd on.
    pub validation_without_no_grad: bool,
}

/// Memory a process holds outside the allocator even when nothing else is loaded: the
/// CUDA context, kernels and library handles (measured 760–802 MiB on an H200 with
/// PyTorch 2.11 / CUDA 13; other GPUs and versions vary by a few hundred MiB).
pub const CONTEXT_ALLOWANCE: Bytes = Bytes(GIB);

/// PyTorch refuses `max_split_size_mb` values of 20 or less (`kLargeBuffer` is 20 MiB).
const MIN_MAX_SPLIT_MB: u64 = 21;

fn sum(a: Option<Bytes>, b: Option<Bytes>) -> Option<Bytes> {
    a?.checked_add(b?)
}

/// Diagnoses from a parsed message, a snapshot report, or both (the message's figures win
/// where both give one; the snapshot adds the largest free block and the sites).
#[allow(
    clippy::too_many_lines,
    reason = "one branch per cause with its evidence; not yet split"
)]
pub fn diagnose(msg: Option<&OomMessage>, snap: Option<&SnapshotReport>) -> Option<Diagnosis> {
    if msg.is_none() && snap.is_none_or(|s| s.ooms.is_empty()) {
        return None;
    }
    let oom = snap.and_then(|s| s.ooms.last());
    let map = snap.and_then(|s| s.segment_map.as_ref());
    let mut f = Figures::default();
    if let Some(m) = msg {
        f.requested_bytes = m.requested_bytes;
        f.total_capacity_bytes = m.total_capacity_bytes;
        f.device_free_bytes = m.device_free_bytes;
        f.allowed_bytes = m.allowed_bytes;
        f.allocated_bytes = m.allocated_bytes;
        f.reserved_bytes = m.reserved_bytes;
        f.reserved_unallocated_bytes = m.reserved_unallocated_bytes;
        f.this_process_bytes = m.this_process_bytes;
        if !m.other_processes.is_empty() {
            f.other_processes_bytes =
                Some(Bytes(m.other_processes.iter().map(|p| p.bytes.0).sum()));
        }
    }
    if let Some(o) = oom {
        f.requested_bytes = f.requested_bytes.or(Some(o.requested_bytes));
        f.device_free_bytes = f.device_free_bytes.or(o.device_free_bytes);
        f.allocated_bytes = f.allocated_bytes.or(Some(o.allocated_bytes));
        f.reserved_bytes = f.reserved_bytes.or(Some(o.reserved_bytes));
    }
    if let Some(m) = map.filter(|m| m.at == "oom") {
        f.largest_free_block_bytes = Some(m.largest_free_block_bytes);
        f.reserved_unallocated_bytes = f
            .reserved_unallocated_bytes
            .or(Some(m.free_in_segments_bytes));
    }
    f.outside_allocator_bytes = match (f.this_process_bytes, f.reserved_bytes) {
        (Some(p), Some(r)) => Some(p.saturating_sub(r)),
        _ => None,
    };
    let validation = msg.is_some_and(|m| {
        !m.mentions_no_grad && m.traceback_functions.iter().any(|n| is_eval_function(n))
    }) || snap.is_some_and(|s| !s.eval_sites_at_peak.is_empty());

    let req = f.requested_bytes.unwrap_or(Bytes::ZERO);
    let free = f.device_free_bytes;
    let unalloc = f.reserved_unallocated_bytes.unwrap_or(Bytes::ZERO);
    let mut evidence = Vec::new();
    // Under a cap, a fragmented cache is the first cause when the request would have fit in
    // one piece: before it reports an OOM the allocator releases every cached segment with
    // no live block (`release_cached_blocks` in `CUDACachingAllocator.cpp`), so the
    // reserved-but-unallocated bytes left are holes between live blocks, and with
    // `expandable_segments` those holes' pages are reused.
    let mut also_capped = None;
    let cause = if let (Some(allowed), Some(r), Some(fr)) =
        (f.allowed_bytes, f.reserved_bytes, free)
        && sum(Some(r), Some(req)).is_some_and(|n| n > allowed)
        && fr >= req
    {
        let headroom = allowed.saturating_sub(r).min(fr);
        if unalloc.0 > 0 && sum(Some(unalloc), Some(headroom)).is_some_and(|t| t >= req) {
            evidence.push(format!(
                "Under the cap of {allowed} (`set_per_process_memory_fraction`) the request \
                 would have fit in one piece: {unalloc} is reserved but unallocated and {headroom} \
                 more may still be reserved, against a {req} request. The cached memory is split \
                 into holes between live blocks, so the allocator asked for a new segment, which \
                 the cap refused."
            ));
            if let Some(l) = f.largest_free_block_bytes {
                evidence.push(format!(
                    "The largest free block in the cache is {l}, smaller than the request."
                ));
            }
            also_capped = Some(allowed);
            Cause::Fragmentation
        } else {
            evidence.push(format!(
                "PyTorch may use {allowed} (`set_per_process_memory_fraction`); it had reserved \
                 {r} and asked for {req} more, while the GPU still had {fr} free."
            ));
            Cause::ProcessCap
        }
    } else if unalloc.0 > 0
        && (unalloc >= req || sum(Some(unalloc), free).is_some_and(|t| t >= req))
        && !validation
    {
        evidence.push(format!(
            "{unalloc} is reserved by PyTorch but unallocated{}, yet no free piece holds the \
             {req} request.",
            free.map(|fr| format!(" and the GPU has {fr} free"))
                .unwrap_or_default()
        ));
        if let Some(l) = f.largest_free_block_bytes {
            evidence.push(format!(
                "The largest free block in the cache is {l}, smaller than the request."
            ));
        }
        Cause::Fragmentation
    } else {
        let own = f.reserved_bytes.unwrap_or(Bytes::ZERO);
        let outside = f
            .outside_allocator_bytes
            .map(|o| o.saturating_sub(CONTEXT_ALLOWANCE))
            .unwrap_or(Bytes::ZERO);
        let others = f.other_processes_bytes.unwrap_or(Bytes::ZERO);
        // Without NVML's per-process lines, the memory nobody accounts for is "outside".
        let unattributed = match (f.this_process_bytes, f.total_capacity_bytes, free) {
            (None, Some(t), Some(fr)) if others.0 == 0 => t
                .saturating_sub(fr)
                .saturating_sub(own)
                .saturating_sub(CONTEXT_ALLOWANCE),
            _ => Bytes::ZERO,
        };
        let outside = outside.max(unattributed);
        if msg.is_some_and(|m| m.format == MessageFormat::CudaError) {
            evidence.push(
                "\"CUDA error: out of memory\" comes from a CUDA call outside PyTorch's caching \
                 allocator (a library handle, a workspace, a kernel launch, another framework)."
                    .to_string(),
            );
            Cause::OutsideAllocator
        } else if others > own && others >= outside && others >= req {
            let list = msg
                .map(|m| {
                    m.other_processes
                        .iter()
                        .map(|p| format!("PID {} holds {}", p.pid, p.bytes))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default();
            evidence.push(format!(
                "Other processes hold {others} ({list}); PyTorch in this process reserved only {own}."
            ));
            Cause::OtherProcesses
        } else if outside > own && outside >= req {
            evidence.push(match f.this_process_bytes {
                Some(p) => format!(
                    "This process holds {p}, but PyTorch's allocator reserved only {own}: {} \
                     is held outside it ({} beyond a CUDA context's ~{}).",
                    p.saturating_sub(own),
                    outside,
                    CONTEXT_ALLOWANCE
                ),
                None => format!(
                    "{outside} of the GPU is used by neither PyTorch's allocator nor the CUDA \
                     context (no per-process figures in the message: this process or another)."
                ),
            });
            Cause::OutsideAllocator
        } else {
            evidence.push(format!(
                "PyTorch's tensors hold {} of {} reserved; the GPU had {} free for a {req} request.",
                f.allocated_bytes.map_or("?".into(), |b| b.to_string()),
                own,
                free.map_or("?".into(), |b| b.to_string())
            ));
            if validation && unalloc >= req {
                evidence.push(format!(
                    "{unalloc} is cached but unallocated in pieces, enough for this {req} \
                     request alone; but an evaluation loop that keeps its graphs grows by a \
                     batch's activations at every step, so no allocator setting would have \
                     kept up."
                ));
            } else if unalloc.0 > 0 {
                evidence.push(format!(
                    "Only {unalloc} is cached but unallocated: the cache is not the problem."
                ));
            }
            Cause::Capacity
        }
    };
    if let (Some(p), Some(r)) = (f.this_process_bytes, f.reserved_bytes)
        && cause != Cause::OutsideAllocator
    {
        evidence.push(format!(
            "This process holds {p} in all; {} of it is outside PyTorch's allocator (the CUDA \
             context is usually 0.3–1 GiB).",
            p.saturating_sub(r)
        ));
    }
    if validation {
        evidence.push(
            "The failure is inside evaluation code (validate/evaluate/predict) and the \
             traceback shows no `torch.no_grad()` / `torch.inference_mode()`: unless the loop \
             runs under one, autograd keeps every activation of every evaluation batch alive \
             as long as its outputs live."
                .to_string(),
        );
    }
    let mut remedies = remedies_for(cause, &f);
    if also_capped.is_some() {
        // The cap comes after the fragmentation remedies: it is what refused the new
        // segment, but an unfragmented pool would have held the request under it.
        remedies.extend(remedies_for(Cause::ProcessCap, &f));
    }
    if validation {
        remedies.insert(
            0,
            Remedy::new(
                "Run validation without autograd",
                "Wrap the evaluation loop in `with torch.no_grad():` (or `torch.inference_mode()`), \
                 and keep `loss.item()` / detached outputs, not tensors that carry a graph.",
                Some("with torch.inference_mode():".to_string()),
            ),
        );
    }
    Some(Diagnosis {
        cause,
        summary: summary(cause, &f),
        evidence,
        remedies,
        figures: f,
        validation_without_no_grad: validation,
    })
}

fn summary(cause: Cause, f: &Figures) -> String {
    let req = f
        .requested_bytes
        .map_or("the request".into(), |b| b.to_string());
    match cause {
        Cause::Capacity => format!(
            "The step needs more than the GPU has: {req} more could not fit next to PyTorch's {} of tensors.",
            f.allocated_bytes.map_or("?".into(), |b| b.to_string())
        ),
        Cause::Fragmentation => format!(
            "{} is cached but split into pieces smaller than {req}.",
            f.reserved_unallocated_bytes
                .map_or("Memory".into(), |b| b.to_string())
        ),
        Cause::OutsideAllocator => format!(
            "{} of this process's memory is outside PyTorch's allocator.",
            f.outside_allocator_bytes
                .map_or("Much".into(), |b| b.to_string())
        ),
        Cause::OtherProcesses => format!(
            "Other processes hold {} of the GPU.",
            f.other_processes_bytes
                .map_or("most".into(), |b| b.to_string())
        ),
        Cause::ProcessCap => format!(
            "The per-process cap of {} stopped a {req} request while the GPU had memory free.",
            f.allowed_bytes.map_or("?".into(), |b| b.to_string())
        ),
    }
}

/// Function names that mark evaluation code in a traceback.
pub fn is_eval_function(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.contains("valid")
        || n.contains("evaluat")
        || n.starts_with("eval")
        || n.ends_with("_eval")
        || n.contains("predict")
        || n == "test_step"
}

/// A `max_split_size_mb` that keeps requests like this one from being carved out of
/// cached blocks: the largest power of two (in MiB) not above the request, at least the
/// PyTorch minimum; `None` when the request is too small for the setting to matter.
pub fn max_split_size_mb_for(request: Bytes) -> Option<u64> {
    let mb = request.0 / MIB;
    if mb < MIN_MAX_SPLIT_MB {
        return None;
    }
    let pow = 1u64 << (63 - mb.leading_zeros());
    Some(pow.max(MIN_MAX_SPLIT_MB))
}

fn remedies_for(cause: Cause, f: &Figures) -> Vec<Remedy> {
    let req = f.requested_bytes.unwrap_or(Bytes::ZERO);
    let mut v = Vec::new();
    match cause {
        Cause::Fragmentation => {
            v.push(Remedy::new(
                "Use expandable segments",
                "The allocator maps memory into one growing segment per stream and can return \
                 the pages of free holes, so pieces no longer strand free memory.",
                Some("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".to_string()),
            ));
            if let Some(mb) = max_split_size_mb_for(req) {
                v.push(Remedy::new(
                    format!("Or stop splitting blocks of {mb} MiB and more"),
                    format!(
                        "Cached blocks of at least {mb} MiB are then never carved up by smaller \
                         tensors, so a {req} request finds a whole block (costs some reuse)."
                    ),
                    Some(format!("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{mb}")),
                ));
            }
            v.push(Remedy::new(
                "Keep shapes steady",
                "Varying sequence lengths or image sizes leave holes of every size: pad or bucket \
                 inputs, allocate long-lived buffers first, and call torch.cuda.empty_cache() \
                 only between phases (it frees whole unused segments, not holes).",
                None,
            ));
        }
        Cause::Capacity => {
            let need = sum(f.allocated_bytes, Some(req));
            let have = match (
                f.allocated_bytes,
                f.device_free_bytes,
                f.reserved_unallocated_bytes,
            ) {
                (Some(a), Some(fr), u) => {
                    sum(Some(a), Some(fr)).and_then(|x| sum(Some(x), u.or(Some(Bytes::ZERO))))
                }
                _ => None,
            };
            let detail = match (need, have) {
                (Some(n), Some(h)) if n > h => format!(
                    "At the failure the step already needed {} more than the GPU could give \
                     ({n} against {h}); the OOM hit partway through the step, so the whole step \
                     needs more still. Lower the micro-batch and keep the effective batch with \
                     gradient accumulation; with `--model …` the planner gives the largest \
                     batch that fits.",
                    n.saturating_sub(h)
                ),
                _ => "Halve the micro-batch and double gradient accumulation; with `--model …` \
                      the planner gives the largest batch that fits."
                    .to_string(),
            };
            v.push(Remedy::new(
                "Smaller micro-batch + gradient accumulation",
                detail,
                None,
            ));
            v.push(Remedy::new(
                "Mixed precision",
                "Autocast to bf16 (or fp16 with a GradScaler) halves most saved activations.",
                Some("with torch.autocast(\"cuda\", dtype=torch.bfloat16):".to_string()),
            ));
            v.push(Remedy::new(
                "Activation checkpointing",
                "Recompute each block's activations in backward instead of keeping them.",
                Some(
                    "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)".to_string(),
                ),
            ));
            v.push(Remedy::new(
                "Lighter optimizer state",
                "AdamW keeps two fp32 states per parameter: 8-bit Adam, Adafactor or SGD cut it; \
                 FSDP/ZeRO shard it across GPUs or offload it to the CPU.",
                None,
            ));
        }
        Cause::OutsideAllocator => {
            v.push(Remedy::new(
                "Find what allocates outside PyTorch",
                format!(
                    "{} is held outside the caching allocator. The usual holders: another \
                     framework in the same process (JAX preallocates 75 %: \
                     XLA_PYTHON_CLIENT_PREALLOCATE=false; TensorFlow: \
                     tf.config.experimental.set_memory_growth; CuPy's pool: \
                     cupy.get_default_memory_pool().free_all_blocks()), custom CUDA extensions \
                     calling cudaMalloc, NCCL buffers (NCCL_BUFFSIZE), cuBLAS/cuDNN workspaces \
                     (CUBLAS_WORKSPACE_CONFIG, cudnn.benchmark), the cudaMallocAsync backend's own \
                     pool, and the CUDA context itself (0.3–1 GiB).",
                    f.outside_allocator_bytes
                        .map_or("Memory".into(), |b| b.to_string())
                ),
                None,
            ));
            v.push(Remedy::new(
                "Measure it",
                "Compare torch.cuda.memory_reserved() with the process's usage in nvidia-smi \
                 before and after each library initialises.",
                Some("nvidia-smi --query-compute-apps=pid,used_memory --format=csv".to_string()),
            ));
        }
        Cause::OtherProcesses => {
            v.push(Remedy::new(
                "Free the GPU or pick another",
                "Stop the other processes (stale Jupyter kernels, DataLoader workers that touched \
                 CUDA, an old run), or run on an idle GPU.",
                Some("nvidia-smi --query-compute-apps=pid,used_memory --format=csv".to_string()),
            ));
            v.push(Remedy::new(
                "Share the GPU on purpose",
                "Cap each process with torch.cuda.set_per_process_memory_fraction, or partition \
                 the GPU (MIG) so one job cannot starve another.",
                Some("CUDA_VISIBLE_DEVICES=1".to_string()),
            ));
        }
        Cause::ProcessCap => {
            let frac = match (f.reserved_bytes, f.total_capacity_bytes) {
                (Some(r), Some(t)) if t.0 > 0 => {
                    let need = (r.0 as f64 + req.0 as f64) / t.0 as f64;
                    Some(((need * 100.0).ceil() / 100.0 + 0.05).min(1.0))
                }
                _ => None,
            };
            v.push(Remedy::new(
                "Raise the per-process cap",
                match frac {
                    Some(x) => format!(
                        "The step needs at least {:.2} of the GPU at this point; allow more (or \
                         remove the call) if this process may use it.",
                        x - 0.05
                    ),
                    None => "Allow a larger fraction, or remove the call.".to_string(),
                },
                Some(format!(
                    "torch.cuda.set_per_process_memory_fraction({})",
                    frac.map_or("0.9".into(), |x| format!("{x:.2}"))
                )),
            ));
            v.push(Remedy::new(
                "Or fit under the cap",
                "Smaller micro-batch with gradient accumulation, mixed precision or activation \
                 checkpointing.",
                None,
            ));
        }
    }
    v
}

/// Reads a snapshot from a stream (progress: bytes read so far; return false to cancel).
pub fn read_snapshot<R: std::io::Read>(
    reader: R,
    progress: &mut dyn FnMut(u64) -> bool,
) -> Result<Snapshot, DoctorError> {
    let p = pickle::read_pickle(reader, pickle::Limits::default(), progress)?;
    Snapshot::from_pickle(&p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_split_from_request() {
        assert_eq!(max_split_size_mb_for(Bytes(256 * MIB)), Some(256));
        assert_eq!(max_split_size_mb_for(Bytes(300 * MIB)), Some(256));
        assert_eq!(max_split_size_mb_for(Bytes(24 * MIB)), Some(21));
        assert_eq!(max_split_size_mb_for(Bytes(20 * MIB)), None);
    }

    fn msg(t: &str) -> OomMessage {
        parse_message(t).expect("message")
    }

    #[test]
    fn rules() {
        let cap = msg(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.00 \
             GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process has 78.00 \
             GiB memory in use. Of the allocated memory 77.00 GiB is allocated by PyTorch, and \
             10.00 MiB is reserved by PyTorch but unallocated.",
        );
        assert_eq!(
            diagnose(Some(&cap), None).map(|d| d.cause),
            Some(Cause::Capacity)
        );
        let frag = msg(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.00 \
             GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process has 78.00 \
             GiB memory in use. Of the allocated memory 60.00 GiB is allocated by PyTorch, and \
             17.00 GiB is reserved by PyTorch but unallocated.",
        );
        let d = diagnose(Some(&frag), None).expect("diagnosis");
        assert_eq!(d.cause, Cause::Fragmentation);
        assert!(
            d.remedies[0].setting.as_deref()
                == Some("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        );
        assert!(
            d.remedies[1].setting.as_deref()
                == Some("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:2048")
        );
        let no_nvml = msg(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.00 \
             GiB of which 1.00 GiB is free. Of the allocated memory 10.00 GiB is allocated by \
             PyTorch, and 2.00 MiB is reserved by PyTorch but unallocated.",
        );
        assert_eq!(
            diagnose(Some(&no_nvml), None).map(|d| d.cause),
            Some(Cause::OutsideAllocator)
        );
        assert!(diagnose(None, None).is_none());
    }

    fn capped(allocated: &str, unallocated: &str) -> OomMessage {
        msg(&format!(
            "CUDA out of memory. Tried to allocate 1.40 GiB. GPU 0 has a total capacity of \
             139.80 GiB of which 120.00 GiB is free. Including non-PyTorch memory, this process \
             has 8.50 GiB memory in use. 8.00 GiB allowed; Of the allocated memory {allocated} \
             is allocated by PyTorch, and {unallocated} is reserved by PyTorch but unallocated. \
             If reserved but unallocated memory is large try setting \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        ))
    }

    #[test]
    fn fragmentation_under_a_cap_comes_before_the_cap() {
        // Issue 27: 8 GiB cap, 3.73 GiB cached but unallocated, a 1.40 GiB request: in one
        // piece the request fits under the cap.
        let d = diagnose(Some(&capped("4.20 GiB", "3.73 GiB")), None).expect("diagnosis");
        assert_eq!(d.cause, Cause::Fragmentation, "{:?}", d.evidence);
        let settings: Vec<&str> = d
            .remedies
            .iter()
            .filter_map(|r| r.setting.as_deref())
            .collect();
        assert_eq!(
            settings[..2],
            [
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:1024"
            ]
        );
        let cap = d
            .remedies
            .iter()
            .position(|r| r.title == "Raise the per-process cap")
            .expect("the cap is still a remedy");
        assert!(cap >= 2, "{:?}", d.remedies);
        assert!(d.evidence[0].contains("would have fit in one piece"));
        // Nearly all of the cap allocated: the cap itself is the cause.
        let d = diagnose(Some(&capped("7.90 GiB", "30.00 MiB")), None).expect("diagnosis");
        assert_eq!(d.cause, Cause::ProcessCap);
        assert_eq!(d.remedies[0].title, "Raise the per-process cap");
    }
}
