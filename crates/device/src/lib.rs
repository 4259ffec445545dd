//! vramlab on a real GPU: the benchmark engines ([`bench`]: cudarc + cuBLAS, and the
//! user's PyTorch), the GPU profile, and NVML ([`gpu`]: discovery, per-process memory, the
//! live monitor). Everything builds without CUDA (cudarc loads its libraries at run time)
//! and explains, never panics, when there is no GPU.

pub mod bench;
pub mod gpu;
pub mod testing;
