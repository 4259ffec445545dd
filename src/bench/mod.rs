//! Bench: checks a plan on a real GPU. Engines behind one trait ([`runner::Engine`]):
//! [`native`] runs the planned step as real device buffers and cuBLAS GEMMs through
//! cudarc, [`torch`] runs the reference model in the user's PyTorch. `record`, `sweep`,
//! `schedule` and `runner` are pure logic (tested in CI without a GPU); `native`,
//! `torch` and `profile` touch the device and explain clearly when they cannot.

pub mod cuda;
pub mod native;
pub mod profile;
pub mod record;
pub mod runner;
pub mod schedule;
pub mod sweep;
pub mod torch;

pub use record::{BenchEvent, DeviceInfo, EngineKind, MemSample, Outcome, Run, Trial};
pub use runner::{BenchHandle, BenchRequest, spawn};
pub use sweep::BatchPlan;
