//! The native engine: runs a [`Schedule`] on the GPU through cudarc — real segments
//! from `cuMemAlloc`, the plan's blocks inside them, cuBLAS GEMMs of the model's shapes
//! and copies/fills for the memory-bound ops — and measures device memory at op
//! boundaries (`cuMemGetInfo`, NVML), step time (CUDA events) and TFLOP/s.
//!
//! Every CUDA call goes through [`super::cuda::require`] first: without a driver or
//! cuBLAS the engine refuses to open with a clear message instead of cudarc's panic.

#![allow(unsafe_code)]

use std::time::Instant;

use anyhow::{Result, anyhow};
use cudarc::cublas::sys as blas;
use cudarc::driver::result as drv;
use cudarc::driver::sys::{CUdeviceptr, CUresult};

use super::cuda::{self, Device, DeviceBuffer, GemmOperand, is_oom};
use super::engine::{Control, Engine, TrialJob, cancelled_trial};
use super::schedule::{self, Kernel, Operand, Schedule, Span, Step};
use crate::gpu::nvml;
use vramlab_core::plan::DType;
use vramlab_core::record::{DeviceInfo, MemSample, Outcome, Trial};
use vramlab_core::units::Bytes;

/// Probes (memory readings) placed in a trial's measured step.
pub const MAX_PROBES: usize = 400;

/// One segment of the schedule: a `cuMemAlloc` of its bytes (the stream is synchronised
/// before segments are dropped).
type Segment = DeviceBuffer;

/// A CUDA context, stream and cuBLAS handle on one device.
pub struct NativeEngine {
    dev: Device,
    info: DeviceInfo,
}

impl NativeEngine {
    /// Opens device `ordinal` (a clear error without a driver, cuBLAS or device).
    pub fn open(ordinal: usize) -> Result<NativeEngine> {
        let dev = Device::open(ordinal)?;
        let name = dev.ctx.name().unwrap_or_else(|_| "CUDA device".into());
        let total = dev.ctx.total_mem().map_or(0, |t| t as u64);
        let driver = nvml::driver_version();
        let mut versions = std::collections::BTreeMap::new();
        versions.insert("cuda_build".into(), cuda::CUDA_BUILD.into());
        let mut v: std::ffi::c_int = 0;
        // SAFETY: writes one int through a valid pointer.
        if unsafe { cudarc::driver::sys::cuDriverGetVersion(&raw mut v) } == CUresult::CUDA_SUCCESS
        {
            versions.insert(
                "cuda_driver_api".into(),
                format!("{}.{}", v / 1000, (v % 1000) / 10),
            );
        }
        let mut v: std::ffi::c_int = 0;
        // SAFETY: a live handle and a valid out pointer.
        if unsafe { blas::cublasGetVersion_v2(*dev.blas.handle(), &raw mut v) }
            == blas::cublasStatus_t::CUBLAS_STATUS_SUCCESS
        {
            versions.insert("cublas".into(), v.to_string());
        }
        Ok(NativeEngine {
            dev,
            info: DeviceInfo {
                name,
                total_bytes: Bytes(total),
                driver,
                versions,
            },
        })
    }

    /// Device used bytes (`total − free` from `cuMemGetInfo`).
    pub fn used(&self) -> Result<u64> {
        self.dev.ctx.bind_to_thread().map_err(|e| anyhow!("{e}"))?;
        let (free, total) = drv::mem_get_info().map_err(|e| anyhow!("{e}"))?;
        Ok((total - free) as u64)
    }

    /// NVML memory of this process on the device, where NVML can tell.
    fn process_bytes(&self) -> Option<u64> {
        nvml::process_memory(self.dev.ctx.ordinal() as u32, std::process::id()).map(|b| b.0)
    }

    fn sync(&self) -> Result<()> {
        self.dev.stream.synchronize().map_err(|e| anyhow!("{e}"))
    }

    /// Launches `k`; a kernel whose segment was already released is skipped (the
    /// schedule never places one, this is the second line of defence).
    fn launch(&self, k: &Kernel, segs: &[Option<Segment>]) -> Result<()> {
        let live = |s: Span| segs.get(s.segment as usize).is_some_and(Option::is_some);
        let all_live = match *k {
            Kernel::Gemm { a, b, c, .. } => live(a.span) && live(b.span) && live(c.span),
            Kernel::Copy { src, dst } => live(src) && live(dst),
            Kernel::Fill { dst } => live(dst),
        };
        if !all_live {
            return Ok(());
        }
        let ptr = |s: Span| segs[s.segment as usize].as_ref().map_or(0, |g| g.ptr()) + s.offset;
        let cu = self.dev.stream.cu_stream();
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
            } => self.gemm(
                dtype,
                count,
                m,
                k,
                n,
                (ptr(a.span), a),
                (ptr(b.span), b),
                (ptr(c.span), c),
            ),
            Kernel::Copy { src, dst } => {
                let bytes = src.len.min(dst.len) as usize;
                let overlap = src.segment == dst.segment
                    && src.offset < dst.offset + dst.len
                    && dst.offset < src.offset + src.len;
                // SAFETY: both ranges lie inside live segments (checked by the schedule).
                unsafe {
                    if overlap {
                        drv::memset_d8_async(ptr(dst), 0, bytes, cu)
                    } else {
                        drv::memcpy_dtod_async(ptr(dst), ptr(src), bytes, cu)
                    }
                }
                .map_err(|e| anyhow!("{e}"))
            }
            Kernel::Fill { dst } => {
                // SAFETY: the range lies inside a live segment.
                unsafe { drv::memset_d8_async(ptr(dst), 0, dst.len as usize, cu) }
                    .map_err(|e| anyhow!("{e}"))
            }
        }
    }

    /// Row-major `C = A · B` of the schedule's operands (fp32 accumulation).
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        dtype: DType,
        count: u32,
        m: u32,
        k: u32,
        n: u32,
        (pa, a): (CUdeviceptr, Operand),
        (pb, b): (CUdeviceptr, Operand),
        (pc, c): (CUdeviceptr, Operand),
    ) -> Result<()> {
        let ty = match dtype {
            DType::F32 => blas::cudaDataType::CUDA_R_32F,
            DType::F16 => blas::cudaDataType::CUDA_R_16F,
            DType::BF16 => blas::cudaDataType::CUDA_R_16BF,
            other => return Err(anyhow!("no GEMM for {other:?}")),
        };
        let op = |ptr, o: Operand| GemmOperand {
            ptr,
            stride: o.stride,
        };
        // SAFETY: the schedule guarantees `(count − 1) · stride + rows · cols` elements of
        // every operand lie inside its segment, and the dimensions fit in i32.
        unsafe {
            self.dev.gemm(
                ty,
                blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                count,
                (m, k, n),
                op(pa, a),
                op(pb, b),
                op(pc, c),
            )
        }
    }

    /// Runs `s`; returns the measured trial (OOM as an outcome).
    fn run_schedule(
        &self,
        s: &Schedule,
        index: u32,
        steps: u32,
        ctl: &mut Control<'_>,
    ) -> Result<Trial> {
        let batch = s.batch;
        let mut trial = Trial::failed(index, batch, Outcome::Ran);
        self.sync()?;
        let baseline = self.used()?;
        trial.baseline_before = Some(Bytes(baseline));
        let started = Instant::now();
        let mut segs: Vec<Option<Segment>> = Vec::with_capacity(s.segments.len());
        let mut held = 0u64;
        let mut peak_held = 0u64;
        let mut peak_used = 0u64;
        let total_steps = s.steps.len().max(1);
        ctl.progress(index, batch, "allocating and warm-up step", 0.0);
        let mut outcome = Outcome::Ran;
        for (i, step) in s.steps.iter().enumerate() {
            if i % 64 == 0 && ctl.cancelled() {
                outcome = Outcome::Cancelled;
                break;
            }
            match *step {
                Step::Segment { bytes } => {
                    self.dev.ctx.bind_to_thread().map_err(|e| anyhow!("{e}"))?;
                    match Segment::alloc(bytes) {
                        Ok(seg) => {
                            segs.push(Some(seg));
                            held += bytes;
                            peak_held = peak_held.max(held);
                        }
                        Err(e) if is_oom(&e) => {
                            outcome = Outcome::Oom {
                                message: format!(
                                    "CUDA out of memory: cuMemAlloc of {} failed with {} in {} segments held",
                                    Bytes(bytes),
                                    Bytes(held),
                                    segs.iter().flatten().count()
                                ),
                            };
                            break;
                        }
                        Err(e) => return Err(anyhow!("cuMemAlloc of {}: {e}", Bytes(bytes))),
                    }
                }
                Step::Release(i) => {
                    self.sync()?;
                    if let Some(seg) = segs.get_mut(i as usize).and_then(Option::take) {
                        held -= seg.bytes();
                    }
                }
                Step::Kernel(k) => self.launch(&s.kernels[k as usize], &segs)?,
                Step::Probe(p) => {
                    self.sync()?;
                    let used = self.used()?;
                    peak_used = peak_used.max(used);
                    let probe = &s.probes[p as usize];
                    let sample = MemSample {
                        t_ms: started.elapsed().as_secs_f64() * 1e3,
                        event: Some(probe.event),
                        measured: Bytes(used.saturating_sub(baseline)),
                        predicted_allocated: Some(Bytes(probe.allocated)),
                        predicted_reserved: Some(Bytes(probe.reserved)),
                        label: probe.label.clone(),
                    };
                    trial.timeline.push(sample.clone());
                    ctl.sample(index, sample);
                    if p % 16 == 0 {
                        ctl.progress(
                            index,
                            batch,
                            "measured step (probed)",
                            0.5 * i as f32 / total_steps as f32,
                        );
                    }
                }
            }
        }
        if outcome.ran() {
            self.sync()?;
            peak_used = peak_used.max(self.used()?);
            trial.process_bytes = self.process_bytes().map(Bytes);
            // Timed steady-state steps: the measured step's kernels, no allocation (a
            // warm caching allocator serves every block from its segments).
            let (start, end) = (self.dev.timing_event()?, self.dev.timing_event()?);
            let mut times = Vec::with_capacity(steps as usize);
            for step in 0..steps {
                if ctl.cancelled() {
                    outcome = Outcome::Cancelled;
                    break;
                }
                ctl.progress(
                    index,
                    batch,
                    &format!("timed step {}/{steps}", step + 1),
                    0.5 + 0.5 * step as f32 / steps as f32,
                );
                start.record(&self.dev.stream).map_err(|e| anyhow!("{e}"))?;
                for (i, k) in s.kernels[s.step_kernels.clone()].iter().enumerate() {
                    if i % 64 == 63 && ctl.cancelled() {
                        break;
                    }
                    self.launch(k, &segs)?;
                }
                if ctl.cancelled() {
                    outcome = Outcome::Cancelled;
                    break;
                }
                end.record(&self.dev.stream).map_err(|e| anyhow!("{e}"))?;
                let ms = start.elapsed_ms(&end).map_err(|e| anyhow!("{e}"))?;
                times.push(f64::from(ms));
            }
            if !times.is_empty() {
                times.sort_by(f64::total_cmp);
                let median = times[times.len() / 2];
                trial.step_ms = Some(median);
                trial.flops_per_step = Some(s.flops_executed);
                trial.tflops = Some(s.flops_executed / (median / 1e3) / 1e12);
            }
        }
        self.sync()?;
        drop(segs);
        self.sync()?;
        trial.baseline_after = Some(Bytes(self.used()?));
        trial.peak_allocated = Some(Bytes(s.peak_allocated));
        trial.peak_reserved = Some(Bytes(peak_held));
        trial.device_used_peak = Some(Bytes(peak_used.saturating_sub(baseline)));
        trial.outcome = outcome;
        Ok(trial)
    }
}

impl Engine for NativeEngine {
    fn device(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn trial(&mut self, job: &TrialJob<'_>, ctl: &mut Control<'_>) -> Trial {
        let (planner, index, batch, steps) = (job.planner, job.index, job.batch, job.steps);
        if ctl.cancelled() {
            return cancelled_trial(index, batch);
        }
        ctl.progress(index, batch, "building the step", 0.0);
        // PyTorch's allocator gives cached segments back when cudaMalloc fails; the
        // replay does the same against the memory free on the device now.
        let cap = self
            .used()
            .ok()
            .map(|used| self.info.total_bytes.0.saturating_sub(used));
        let s = match schedule::build(planner, batch, MAX_PROBES, cap) {
            Ok(s) => s,
            Err(e) => {
                return Trial::failed(
                    index,
                    batch,
                    Outcome::Error {
                        message: format!("{e:#}"),
                    },
                );
            }
        };
        match self.run_schedule(&s, index, steps, ctl) {
            Ok(t) => t,
            Err(e) => {
                // A failed launch leaves nothing allocated (segments are dropped on the
                // way out); report it.
                let mut t = Trial::failed(
                    index,
                    batch,
                    Outcome::Error {
                        message: format!("{e:#}"),
                    },
                );
                t.baseline_after = self.used().ok().map(Bytes);
                t
            }
        }
    }
}
