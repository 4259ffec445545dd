//! vramlab's one wrapper over cudarc: loading CUDA at run time ([`require`]), a device
//! with its stream and cuBLAS handle ([`Device`], with the GEMM both the native engine and
//! the profile run), and raw device allocations ([`DeviceBuffer`]). cudarc
//! (`dynamic-loading`) links no CUDA library and *panics* on the first call into a library
//! that is missing, so every GPU entry point calls [`require`] first and gets a clear error
//! instead.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::sync::Arc;

use anyhow::{Context as _, Result, anyhow, bail};
use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys as blas;
use cudarc::driver::sys::{CUdeviceptr, CUevent_flags, CUresult};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result as drv};

/// The CUDA major version this build loads (`cuda-13000`: `libcublas.so.13`, driver ≥ 580).
pub const CUDA_BUILD: &str = "13.0";

/// Which CUDA libraries a caller needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    pub cublas: bool,
}

/// Checks that the driver library (and cuBLAS where needed) can be loaded.
pub fn require(needs: Needs) -> Result<()> {
    // SAFETY: `is_culib_present` only tries to dlopen the library candidates.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        bail!(
            "no CUDA driver found (libcuda.so could not be loaded): the native engine and the \
             device profile need an NVIDIA GPU with driver 580 or newer (CUDA {CUDA_BUILD})"
        );
    }
    // SAFETY: as above, dlopen only.
    if needs.cublas && !unsafe { cudarc::cublas::sys::is_culib_present() } {
        bail!(
            "cuBLAS {CUDA_BUILD} not found (libcublas.so.13 could not be loaded): install the CUDA \
             {CUDA_BUILD} runtime libraries or add their folder to LD_LIBRARY_PATH"
        );
    }
    Ok(())
}

/// A CUDA context, a stream and a cuBLAS handle on one device: what the native engine and
/// the device profile both open.
pub struct Device {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
}

impl Device {
    /// Opens device `ordinal` (a clear error without a driver, cuBLAS or device).
    pub fn open(ordinal: usize) -> Result<Device> {
        require(Needs { cublas: true })?;
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| anyhow!("{e}"))
            .with_context(|| format!("creating a CUDA context on device {ordinal}"))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| anyhow!("{e}"))
            .context("creating a CUDA stream")?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| anyhow!("{e:?}"))
            .context("creating a cuBLAS handle")?;
        Ok(Device { ctx, stream, blas })
    }

    /// Row-major, strided-batched `C = A · B` (`count` products of m×k by k×n), computed
    /// as the column-major `Cᵀ = Bᵀ · Aᵀ` with fp32 accumulation unless `compute` says
    /// otherwise.
    ///
    /// # Safety
    /// Every operand must point at `(count − 1) · stride + rows · cols` elements of `ty`
    /// inside live device memory of this context, and the dimensions must fit in `i32`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        &self,
        ty: blas::cudaDataType,
        compute: blas::cublasComputeType_t,
        count: u32,
        (m, k, n): (u32, u32, u32),
        a: GemmOperand,
        b: GemmOperand,
        c: GemmOperand,
    ) -> Result<()> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the caller guarantees every operand's extent (see `# Safety`); alpha
        // and beta outlive the call.
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                *self.blas.handle(),
                blas::cublasOperation_t::CUBLAS_OP_N,
                blas::cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                (&raw const alpha).cast::<c_void>(),
                b.ptr as *const c_void,
                ty,
                n as i32,
                b.stride as i64,
                a.ptr as *const c_void,
                ty,
                k as i32,
                a.stride as i64,
                (&raw const beta).cast::<c_void>(),
                c.ptr as *mut c_void,
                ty,
                n as i32,
                c.stride as i64,
                count as i32,
                compute,
                blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| anyhow!("cuBLAS GEMM {m}×{k}×{n} (×{count}): {e:?}"))
    }

    /// A timing event (`CU_EVENT_DEFAULT`: `new_event(None)` would disable timing).
    pub fn timing_event(&self) -> Result<CudaEvent> {
        self.ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| anyhow!("{e}"))
    }
}

/// One GEMM operand: its first element and the distance, in elements, between the
/// matrices of a batch.
#[derive(Debug, Clone, Copy)]
pub struct GemmOperand {
    pub ptr: CUdeviceptr,
    pub stride: u64,
}

/// One device allocation (`cuMemAlloc` in the current context), freed on drop.
pub struct DeviceBuffer {
    ptr: CUdeviceptr,
    bytes: u64,
}

impl DeviceBuffer {
    /// Allocates `bytes`; the driver's error (out of memory among them) is returned as is.
    pub fn alloc(bytes: u64) -> Result<DeviceBuffer, DriverError> {
        // SAFETY: a plain device allocation in the current context; `Drop` frees it once.
        unsafe { drv::malloc_sync(bytes as usize) }.map(|ptr| DeviceBuffer { ptr, bytes })
    }

    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from cuMemAlloc and is freed exactly once; owners synchronise
        // the stream before dropping buffers that kernels still use.
        let _ = unsafe { drv::free_sync(self.ptr) };
    }
}

/// Whether a driver error is an out-of-memory.
pub fn is_oom(e: &DriverError) -> bool {
    e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY
}
