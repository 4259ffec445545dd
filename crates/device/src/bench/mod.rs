//! Bench: checks a plan on a real GPU. Engines behind one trait ([`engine::Engine`]):
//! [`native`] runs the planned step as real device buffers and cuBLAS GEMMs through
//! cudarc, [`torch`] runs the reference model in the user's PyTorch, [`dist`] runs a
//! multi-GPU world of it (torchrun, or rank 0 emulated; `dist_runner.py` or DeepSpeed's
//! `ds_runner.py`; the pure logic in [`world`], the import check in [`py_import`]), and
//! [`infer`] measures inference calls (`infer_runner.py`) against the inference planner. `schedule` and `runner` are
//! pure logic (run records and sweep plans live in the core) (tested in CI without a GPU); `native`,
//! `torch` and `profile` touch the device and explain clearly when they cannot.

pub mod cuda;
pub mod dist;
pub mod engine;
pub mod infer;
pub mod native;
pub mod profile;
pub mod py_import;
pub mod request;
pub mod runner;
pub mod runners;
pub mod schedule;
pub mod torch;
pub mod trials;
pub mod world;

pub use request::{BenchRequest, InferBench};
pub use runner::{BenchHandle, spawn};
pub use vramlab_core::record::{
    BenchEvent, DeviceInfo, EngineKind, MemSample, Outcome, RankPeak, Run, Trial, WorldMode,
    WorldRun,
};
pub use vramlab_core::sweep::BatchPlan;
