//! Loading CUDA at run time. cudarc (`dynamic-loading`) links no CUDA library and
//! *panics* on the first call into a library that is missing, so every GPU entry point
//! calls [`require`] first and gets a clear error instead.

#![allow(unsafe_code)]

use anyhow::{Result, bail};

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
