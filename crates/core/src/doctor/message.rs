//! Parses PyTorch's "CUDA out of memory" messages.
//!
//! The wording mirrors `c10/cuda/CUDACachingAllocator.cpp` (`DeviceCachingAllocator::malloc`
//! and `reportProcessMemoryInfo`), PyTorch 2.1 and later:
//!
//! ```text
//! CUDA out of memory. Tried to allocate {alloc_size}. GPU {d} has a total capacity of {total}
//! of which {free} is free. [Process {pid} has {n} memory in use. ]…[Including non-PyTorch
//! memory, this process has {n} memory in use. ][{max} allowed; ]Of the allocated memory
//! {allocated} is allocated by PyTorch, [with {p} allocated in private pools (e.g., CUDA
//! Graphs), ]and {reserved - allocated} is reserved by PyTorch but unallocated. …
//! ```
//!
//! (2.1 spelled "total capacty"), and the PyTorch ≤ 2.0 form
//! `Tried to allocate {n} (GPU {d}; {t} total capacity; {a} already allocated; {f} free;
//! [{m} allowed; ]{r} reserved in total by PyTorch)`. Sizes are `format_size`: "512 bytes",
//! then KiB, MiB, GiB with two decimals, so each figure is exact to ±0.005 of its unit.
//! Whitespace and line breaks inside the message are ignored.

use serde::Serialize;

use crate::units::{Bytes, GIB, KIB, MIB};

/// Which wording the message used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageFormat {
    /// PyTorch 2.1+: "GPU 0 has a total capacity of … of which … is free".
    Current,
    /// PyTorch ≤ 2.0: "(GPU 0; … total capacity; … already allocated; …)".
    Legacy,
    /// "CUDA error: out of memory": a CUDA call outside the caching allocator failed.
    CudaError,
    /// vramlab's native bench engine: "CUDA out of memory: cuMemAlloc of {n} failed with
    /// {reserved} in {k} segments held".
    VramlabNative,
}

/// Memory another process holds on the same GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessUse {
    pub pid: u64,
    pub bytes: Bytes,
}

/// The figures of one OOM message (byte counts as printed, ±0.005 of their unit).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OomMessage {
    pub format: MessageFormat,
    /// Device kind as printed ("CUDA", "XPU", …).
    pub backend: String,
    pub gpu: Option<u32>,
    /// The allocation that failed (`alloc_size`: already rounded to the segment size the
    /// allocator asked the driver for).
    pub requested_bytes: Option<Bytes>,
    pub total_capacity_bytes: Option<Bytes>,
    /// `cudaMemGetInfo` free bytes at the failure.
    pub device_free_bytes: Option<Bytes>,
    /// NVML's figure for this process: PyTorch's reserved bytes + everything else it holds.
    pub this_process_bytes: Option<Bytes>,
    pub other_processes: Vec<ProcessUse>,
    /// The cap of `set_per_process_memory_fraction`.
    pub allowed_bytes: Option<Bytes>,
    pub allocated_bytes: Option<Bytes>,
    /// Held by CUDA-graph private pools (included in `allocated_bytes`).
    pub private_pools_bytes: Option<Bytes>,
    pub reserved_unallocated_bytes: Option<Bytes>,
    /// Reserved by PyTorch's allocator (allocated + reserved-but-unallocated).
    pub reserved_bytes: Option<Bytes>,
    /// Function names of the traceback lines (`File "…", line N, in NAME`), outermost first.
    pub traceback_functions: Vec<String>,
    /// A `with …no_grad()` / `@torch.no_grad()` / `inference_mode` line is in the traceback.
    pub mentions_no_grad: bool,
}

/// Parses a size as `format_size` prints it ("1.50 GiB", "512 bytes"); the unit must follow.
fn parse_size(num: &str, unit: &str) -> Option<Bytes> {
    let v: f64 = num.parse().ok()?;
    let mult = match unit.trim_end_matches(['.', ',', ';', ')']) {
        "bytes" | "B" => 1,
        "KiB" | "KB" => KIB,
        "MiB" | "MB" => MIB,
        "GiB" | "GB" => GIB,
        "TiB" | "TB" => GIB * 1024,
        _ => return None,
    };
    let b = v * mult as f64;
    (b.is_finite() && b >= 0.0 && b < u64::MAX as f64).then(|| Bytes(b.round() as u64))
}

/// The size that starts right after the first `prefix`.
fn size_after(text: &str, prefix: &str) -> Option<Bytes> {
    let at = text.find(prefix)? + prefix.len();
    let mut words = text[at..].split(' ');
    parse_size(words.next()?, words.next()?)
}

/// The size that ends right before `suffix`.
fn size_before(text: &str, suffix: &str) -> Option<Bytes> {
    let at = text.find(suffix)?;
    let mut words = text[..at].rsplit(' ');
    let unit = words.next()?;
    parse_size(words.next()?, unit)
}

fn collapse_ws(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Finds the last OOM message in `text` (a traceback, a log, or the bare message).
/// Returns `None` when the text holds no out-of-memory message.
pub fn parse_message(text: &str) -> Option<OomMessage> {
    let traceback_functions = traceback_functions(text);
    let mentions_no_grad = text.lines().any(|l| {
        let code = l.split('#').next().unwrap_or("").trim();
        (code.starts_with("with ") || code.starts_with('@'))
            && (code.contains("no_grad") || code.contains("inference_mode"))
    });
    let flat = collapse_ws(text);
    let start = flat.rfind("out of memory")?;
    // The backend word ("CUDA", "XPU") sits just before "out of memory".
    let backend = flat[..start]
        .split(' ')
        .rev()
        .find(|w| !w.is_empty())
        .map(|w| w.trim_start_matches("torch.OutOfMemoryError:").to_string())
        .filter(|w| w.chars().all(|c| c.is_ascii_uppercase()) && !w.is_empty())
        .unwrap_or_else(|| "CUDA".into());
    let msg = &flat[start..];
    let mut m = OomMessage {
        format: MessageFormat::Current,
        backend,
        gpu: None,
        requested_bytes: size_after(msg, "Tried to allocate "),
        total_capacity_bytes: None,
        device_free_bytes: None,
        this_process_bytes: None,
        other_processes: Vec::new(),
        allowed_bytes: size_before(msg, " allowed;"),
        allocated_bytes: None,
        private_pools_bytes: None,
        reserved_unallocated_bytes: None,
        reserved_bytes: None,
        traceback_functions,
        mentions_no_grad,
    };
    if msg.contains("total capacity of ") || msg.contains("total capacty of ") {
        m.gpu = msg
            .find("GPU ")
            .and_then(|i| msg[i + 4..].split(' ').next())
            .and_then(|w| w.parse().ok());
        m.total_capacity_bytes =
            size_after(msg, "total capacity of ").or_else(|| size_after(msg, "total capacty of "));
        m.device_free_bytes = size_before(msg, " is free.");
        m.this_process_bytes = size_after(msg, "this process has ");
        m.allocated_bytes = size_before(msg, " is allocated by PyTorch");
        m.private_pools_bytes = size_before(msg, " allocated in private pools");
        m.reserved_unallocated_bytes = size_before(msg, " is reserved by PyTorch but unallocated");
        let mut rest = msg;
        while let Some(i) = rest.find("Process ") {
            rest = &rest[i + "Process ".len()..];
            let mut w = rest.split(' ');
            let (Some(pid), Some("has"), Some(num), Some(unit)) =
                (w.next(), w.next(), w.next(), w.next())
            else {
                continue;
            };
            if let (Ok(pid), Some(bytes)) = (pid.parse(), parse_size(num, unit)) {
                m.other_processes.push(ProcessUse { pid, bytes });
            }
        }
        m.reserved_bytes = match (m.allocated_bytes, m.reserved_unallocated_bytes) {
            (Some(a), Some(u)) => a.checked_add(u),
            _ => None,
        };
    } else if msg.contains("total capacity;") {
        m.format = MessageFormat::Legacy;
        m.gpu = msg
            .find("(GPU ")
            .and_then(|i| msg[i + 5..].split(';').next())
            .and_then(|w| w.trim().parse().ok());
        m.total_capacity_bytes = size_before(msg, " total capacity;");
        m.allocated_bytes = size_before(msg, " already allocated;");
        m.device_free_bytes = size_before(msg, " free;");
        m.reserved_bytes = size_before(msg, " reserved in total by PyTorch");
        m.reserved_unallocated_bytes = match (m.reserved_bytes, m.allocated_bytes) {
            (Some(r), Some(a)) => Some(r.saturating_sub(a)),
            _ => None,
        };
    } else if msg.contains("cuMemAlloc of ") && msg.contains(" segments held") {
        m.format = MessageFormat::VramlabNative;
        m.requested_bytes = size_after(msg, "cuMemAlloc of ");
        m.reserved_bytes = size_after(msg, "failed with ");
    } else if msg.starts_with("out of memory") && flat[..start].ends_with("error: ") {
        m.format = MessageFormat::CudaError;
    } else if m.requested_bytes.is_none() {
        return None;
    }
    Some(m)
}

/// `in NAME` of every `File "…", line N, in NAME` line.
fn traceback_functions(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            if !l.starts_with("File \"") {
                return None;
            }
            let i = l.rfind(", in ")?;
            Some(l[i + 5..].trim().to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_format_with_processes_and_cap() {
        let t = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 42.00 MiB. GPU 0 has \
                 a total capacity of 47.27 GiB of which 9.38 MiB is free. Process 644963 has 5.59 \
                 MiB memory in use. Process 3053273 has 29.04 GiB memory in use. Including \
                 non-PyTorch memory, this process has 3.25 GiB memory in use. 10.00 GiB allowed; \
                 Of the allocated memory 2.92 GiB is allocated by PyTorch, with 1.00 GiB allocated \
                 in private pools (e.g., CUDA Graphs), and 34.62 MiB is reserved by PyTorch but \
                 unallocated. If reserved but unallocated memory is large try setting \
                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
        let m = parse_message(t).expect("an OOM message");
        assert_eq!(m.format, MessageFormat::Current);
        assert_eq!(m.backend, "CUDA");
        assert_eq!(m.gpu, Some(0));
        assert_eq!(m.requested_bytes, Some(Bytes(42 * MIB)));
        assert_eq!(
            m.total_capacity_bytes,
            Some(Bytes((47.27 * GIB as f64).round() as u64))
        );
        assert_eq!(
            m.device_free_bytes,
            Some(Bytes((9.38 * MIB as f64).round() as u64))
        );
        assert_eq!(m.other_processes.len(), 2);
        assert_eq!(m.other_processes[1].pid, 3053273);
        assert_eq!(
            m.this_process_bytes,
            Some(Bytes((3.25 * GIB as f64).round() as u64))
        );
        assert_eq!(m.allowed_bytes, Some(Bytes(10 * GIB)));
        assert_eq!(m.private_pools_bytes, Some(Bytes(GIB)));
        assert_eq!(
            m.reserved_unallocated_bytes,
            Some(Bytes((34.62 * MIB as f64).round() as u64))
        );
    }

    #[test]
    fn legacy_and_typo_formats() {
        let t = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB \
                 total capacity; 14.21 GiB already allocated; 15.75 MiB free; 14.45 GiB reserved \
                 in total by PyTorch) If reserved memory is >> allocated memory try setting \
                 max_split_size_mb to avoid fragmentation.";
        let m = parse_message(t).expect("legacy");
        assert_eq!(m.format, MessageFormat::Legacy);
        assert_eq!(
            m.allocated_bytes,
            Some(Bytes((14.21 * GIB as f64).round() as u64))
        );
        assert!(
            m.reserved_unallocated_bytes
                .is_some_and(|u| u.0 > 200 * MIB)
        );
        let t = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacty of \
                 79.15 GiB of which 1.05 GiB is free. Of the allocated memory 70.00 GiB is \
                 allocated by PyTorch, and 512 bytes is reserved by PyTorch but unallocated.";
        let m = parse_message(t).expect("2.1 typo");
        assert_eq!(m.gpu, Some(1));
        assert_eq!(m.reserved_unallocated_bytes, Some(Bytes(512)));
        assert!(m.total_capacity_bytes.is_some());
    }

    #[test]
    fn cuda_error_and_non_oom() {
        let m = parse_message("RuntimeError: CUDA error: out of memory\nCUDA kernel errors")
            .expect("cuda error");
        assert_eq!(m.format, MessageFormat::CudaError);
        let m = parse_message(
            "CUDA out of memory: cuMemAlloc of 17.64 GiB failed with 136.13 GiB in 120 segments held",
        )
        .expect("native engine");
        assert_eq!(m.format, MessageFormat::VramlabNative);
        assert_eq!(
            m.reserved_bytes,
            Some(Bytes((136.13 * GIB as f64).round() as u64))
        );
        assert!(parse_message("RuntimeError: shape mismatch").is_none());
        assert!(parse_message("").is_none());
    }
}
