//! The device profile: GEMM TFLOP/s per dtype, device-to-device and host-to-device
//! bandwidth, and usable memory (allocate in chunks until OOM, then free). Saved per GPU
//! under the user's config folder; the planner's step-time estimates read it.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys as blas;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags, CUresult};
use cudarc::driver::{CudaContext, result as drv};

use super::cuda::{self, Needs};
use crate::plan::timing::DeviceProfile;
use crate::units::Bytes;

/// One device allocation, freed on drop.
struct DevBuf(CUdeviceptr);

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in the current context, freed once.
        let _ = unsafe { drv::free_sync(self.0) };
    }
}

fn alloc(bytes: usize) -> Result<DevBuf, cudarc::driver::DriverError> {
    // SAFETY: a plain device allocation; `DevBuf` frees it.
    unsafe { drv::malloc_sync(bytes) }.map(DevBuf)
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
    crate::export::vramlab_file::write_atomic(&path, text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn gemm_tflops(
    blas_h: &CudaBlas,
    stream: &cudarc::driver::CudaStream,
    ctx: &std::sync::Arc<CudaContext>,
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
        // SAFETY: `bytes` bytes were allocated at `buf.0`.
        unsafe { drv::memset_d8_async(buf.0, 0, bytes, stream.cu_stream()) }
            .map_err(|e| anyhow!("{e}"))?;
    }
    let (alpha, beta) = (1.0f32, 0.0f32);
    let run = || {
        // SAFETY: three n×n matrices of `elem`-byte elements were allocated above.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas_h.handle(),
                blas::cublasOperation_t::CUBLAS_OP_N,
                blas::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                n as i32,
                n as i32,
                (&raw const alpha).cast::<c_void>(),
                a.0 as *const c_void,
                ty,
                n as i32,
                b.0 as *const c_void,
                ty,
                n as i32,
                (&raw const beta).cast::<c_void>(),
                c.0 as *mut c_void,
                ty,
                n as i32,
                compute,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| anyhow!("cuBLAS: {e:?}"))
    };
    for _ in 0..3 {
        run()?;
    }
    let start = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| anyhow!("{e}"))?;
    let end = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| anyhow!("{e}"))?;
    let iters = 20;
    start.record(stream).map_err(|e| anyhow!("{e}"))?;
    for _ in 0..iters {
        run()?;
    }
    end.record(stream).map_err(|e| anyhow!("{e}"))?;
    let ms = f64::from(start.elapsed_ms(&end).map_err(|e| anyhow!("{e}"))?);
    let flops = 2.0 * (n as f64).powi(3) * f64::from(iters);
    Ok(flops / (ms / 1e3) / 1e12)
}

/// Measures the profile of device `ordinal` (takes a few seconds; allocates up to all
/// free memory briefly, then frees it).
pub fn measure(ordinal: usize, progress: &mut dyn FnMut(&str)) -> Result<DeviceProfile> {
    cuda::require(Needs { cublas: true })?;
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("creating a CUDA context on device {ordinal}"))?;
    let stream = ctx.new_stream().map_err(|e| anyhow!("{e}"))?;
    let blas_h = CudaBlas::new(stream.clone()).map_err(|e| anyhow!("{e:?}"))?;
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
        *rate = gemm_tflops(&blas_h, &stream, &ctx, ty, compute, elem, n)?;
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
    unsafe { drv::memcpy_dtod_async(dst.0, src.0, bytes, cu) }.map_err(|e| anyhow!("{e}"))?;
    let start = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| anyhow!("{e}"))?;
    let end = ctx
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| anyhow!("{e}"))?;
    start.record(&stream).map_err(|e| anyhow!("{e}"))?;
    for _ in 0..10 {
        // SAFETY: as above.
        unsafe { drv::memcpy_dtod_async(dst.0, src.0, bytes, cu) }.map_err(|e| anyhow!("{e}"))?;
    }
    end.record(&stream).map_err(|e| anyhow!("{e}"))?;
    let ms = f64::from(start.elapsed_ms(&end).map_err(|e| anyhow!("{e}"))?);
    let d2d = 2.0 * bytes as f64 * 10.0 / (ms / 1e3) / 1e9;

    progress("host-to-device bandwidth");
    let host = vec![0u8; 256 << 20];
    let t = Instant::now();
    for _ in 0..4 {
        // SAFETY: `dst` holds ≥ 256 MiB; `host` outlives the synchronous copy.
        unsafe { drv::memcpy_htod_sync(dst.0, &host) }.map_err(|e| anyhow!("{e}"))?;
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
    if let Ok(nvml) = nvml_wrapper::Nvml::init()
        && let Ok(d) = nvml.sys_driver_version()
    {
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
