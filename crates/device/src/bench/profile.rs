//! The device profile: GEMM TFLOP/s per dtype, device-to-device and host-to-device
//! bandwidth, and usable memory (allocate in chunks until OOM, then free). Saved per GPU
//! under the user's config folder; the planner's step-time estimates read it.

#![allow(unsafe_code)]

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use cudarc::cublas::sys as blas;
use cudarc::driver::result as drv;
use cudarc::driver::sys::CUresult;

use super::cuda::{self, Device, DeviceBuffer, GemmOperand};
use crate::gpu::nvml;
use vramlab_core::plan::timing::DeviceProfile;
use vramlab_core::units::Bytes;

fn alloc(bytes: usize) -> Result<DeviceBuffer, cudarc::driver::DriverError> {
    DeviceBuffer::alloc(bytes as u64)
}

/// Where the profile of `device` is saved.
pub fn profile_path(device: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    let name: String = device
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    Some(
        base.join("vramlab")
            .join("profiles")
            .join(format!("{name}.json")),
    )
}

/// Loads the saved profile of `device`, if any.
pub fn load(device: &str) -> Option<DeviceProfile> {
    let text = std::fs::read(profile_path(device)?).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Saves `p` atomically next to other profiles; returns the path.
pub fn save(p: &DeviceProfile) -> Result<PathBuf> {
    let path = profile_path(&p.device).context("no config folder (HOME is not set)")?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(p).context("serialising the profile")?;
    vramlab_core::fsutil::write_atomic(&path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// TFLOP/s of an n×n×n GEMM of `ty` elements (`elem` bytes) with `compute`.
fn gemm_tflops(
    dev: &Device,
    ty: blas::cudaDataType,
    compute: blas::cublasComputeType_t,
    elem: usize,
    n: usize,
) -> Result<f64> {
    let bytes = n * n * elem;
    let (a, b, c) = (
        alloc(bytes).map_err(|e| anyhow!("{e}"))?,
        alloc(bytes).map_err(|e| anyhow!("{e}"))?,
        alloc(bytes).map_err(|e| anyhow!("{e}"))?,
    );
    for buf in [&a, &b, &c] {
        // SAFETY: `bytes` bytes were allocated at `buf`.
        unsafe { drv::memset_d8_async(buf.ptr(), 0, bytes, dev.stream.cu_stream()) }
            .map_err(|e| anyhow!("{e}"))?;
    }
    let op = |buf: &DeviceBuffer| GemmOperand {
        ptr: buf.ptr(),
        stride: 0,
    };
    let dim = n as u32;
    // SAFETY: three n×n matrices of `elem`-byte elements were allocated above.
    let run = || unsafe { dev.gemm(ty, compute, 1, (dim, dim, dim), op(&a), op(&b), op(&c)) };
    for _ in 0..3 {
        run()?;
    }
    let (start, end) = (dev.timing_event()?, dev.timing_event()?);
    let iters = 20;
    start.record(&dev.stream).map_err(|e| anyhow!("{e}"))?;
    for _ in 0..iters {
        run()?;
    }
    end.record(&dev.stream).map_err(|e| anyhow!("{e}"))?;
    let ms = f64::from(start.elapsed_ms(&end).map_err(|e| anyhow!("{e}"))?);
    let flops = 2.0 * (n as f64).powi(3) * f64::from(iters);
    Ok(flops / (ms / 1e3) / 1e12)
}

/// Measures the profile of device `ordinal` (takes a few seconds; allocates up to all
/// free memory briefly, then frees it).
pub fn measure(ordinal: usize, progress: &mut dyn FnMut(&str)) -> Result<DeviceProfile> {
    let dev = Device::open(ordinal)?;
    let (ctx, stream) = (&dev.ctx, &dev.stream);
    let device = ctx.name().unwrap_or_else(|_| "CUDA device".into());
    let total = ctx.total_mem().map_or(0, |t| t as u64);
    let n = 8192;
    use blas::cublasComputeType_t::{CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
    use blas::cudaDataType::{CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F};
    let kinds = [
        ("fp32", CUDA_R_32F, CUBLAS_COMPUTE_32F, 4),
        ("tf32", CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4),
        ("fp16", CUDA_R_16F, CUBLAS_COMPUTE_32F, 2),
        ("bf16", CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2),
    ];
    let mut rates = [0.0f64; 4];
    for (rate, (name, ty, compute, elem)) in rates.iter_mut().zip(kinds) {
        progress(&format!("GEMM {name}"));
        *rate = gemm_tflops(&dev, ty, compute, elem, n)?;
    }
    let [fp32, tf32, fp16, bf16] = rates;
    progress("device-to-device bandwidth");
    let bytes = 1usize << 30;
    let (src, dst) = (
        alloc(bytes).map_err(|e| anyhow!("{e}"))?,
        alloc(bytes).map_err(|e| anyhow!("{e}"))?,
    );
    let cu = stream.cu_stream();
    // SAFETY: both buffers hold `bytes` bytes.
    unsafe { drv::memcpy_dtod_async(dst.ptr(), src.ptr(), bytes, cu) }
        .map_err(|e| anyhow!("{e}"))?;
    let (start, end) = (dev.timing_event()?, dev.timing_event()?);
    start.record(stream).map_err(|e| anyhow!("{e}"))?;
    for _ in 0..10 {
        // SAFETY: as above.
        unsafe { drv::memcpy_dtod_async(dst.ptr(), src.ptr(), bytes, cu) }
            .map_err(|e| anyhow!("{e}"))?;
    }
    end.record(stream).map_err(|e| anyhow!("{e}"))?;
    let ms = f64::from(start.elapsed_ms(&end).map_err(|e| anyhow!("{e}"))?);
    let d2d = 2.0 * bytes as f64 * 10.0 / (ms / 1e3) / 1e9;

    progress("host-to-device bandwidth");
    let host = vec![0u8; 256 << 20];
    let t = Instant::now();
    for _ in 0..4 {
        // SAFETY: `dst` holds ≥ 256 MiB; `host` outlives the synchronous copy.
        unsafe { drv::memcpy_htod_sync(dst.ptr(), &host) }.map_err(|e| anyhow!("{e}"))?;
    }
    let h2d = 4.0 * host.len() as f64 / t.elapsed().as_secs_f64() / 1e9;
    drop((src, dst));
    stream.synchronize().map_err(|e| anyhow!("{e}"))?;

    progress("usable memory (allocating until OOM)");
    let mut held = Vec::new();
    let mut usable = 0u64;
    for chunk in [1usize << 30, 64 << 20, 2 << 20] {
        loop {
            match alloc(chunk) {
                Ok(b) => {
                    held.push(b);
                    usable += chunk as u64;
                }
                Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => break,
                Err(e) => return Err(anyhow!("allocating {}: {e}", Bytes(chunk as u64))),
            }
        }
    }
    drop(held);
    let mut versions = std::collections::BTreeMap::new();
    versions.insert("cuda_build".into(), cuda::CUDA_BUILD.to_string());
    if let Some(d) = nvml::driver_version() {
        versions.insert("driver".into(), d);
    }
    Ok(DeviceProfile {
        schema_version: 1,
        device,
        total_bytes: Bytes(total),
        usable_bytes: Bytes(usable),
        fp32_tflops: fp32,
        tf32_tflops: tf32,
        fp16_tflops: fp16,
        bf16_tflops: bf16,
        d2d_gbps: d2d,
        h2d_gbps: h2d,
        versions,
        measured_unix: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    })
}
