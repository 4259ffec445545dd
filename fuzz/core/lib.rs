//! The pure core of vramlab (model, plan, export, units, CLI), compiled from the main
//! crate's own source files. The main crate also links the GUI, CUDA and NVML crates, which
//! would make every sanitizer build of the fuzz targets compile a few hundred GUI crates;
//! the core does not use them, so the fuzz targets build these modules directly.

#![allow(dead_code, unused_imports)]

#[path = "../../src/cli.rs"]
pub mod cli;
#[path = "../../src/doctor/mod.rs"]
pub mod doctor;
#[path = "../../src/export/mod.rs"]
pub mod export;
#[path = "../../src/model/mod.rs"]
pub mod model;
#[path = "../../src/plan/mod.rs"]
pub mod plan;
#[path = "../../src/units.rs"]
pub mod units;
#[path = "../../src/validate.rs"]
pub mod validate;
