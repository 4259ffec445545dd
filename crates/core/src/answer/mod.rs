//! Answers: what a user reads about a plan, computed once here; the CLI, the GUI and the
//! Python bindings only display them.
//!
//! - [`verdict`]: whether a plan fits, judged at the upper edge of its measured error band.
//! - [`inference`]: an inference call's verdict, largest batch and timeline.
//! - [`max_batch`]: the largest micro-batch that fits (`vramlab max-batch`).
//! - [`max_context`]: the longest prompt (or most new tokens) of an inference call that fits
//!   (`vramlab max-context`).
//! - [`vllm`]: vLLM's KV-cache capacity, planned from vLLM's source (`vramlab vllm`).
//! - [`report`]: the plan report — everything `vramlab plan` and the GUI's planner show
//!   (`plan --json` is its serialisation, [`report_json`]).
//! - [`warnings`]: settings the planner plans but the card runs badly or not at all.
//! - [`per_rank`]: the figures of a multi-GPU plan (world, global batch, host RAM, NCCL).
//! - [`next_step`]: where to go when neither the plan nor any single remedy fits.
//! - [`remedy_planners`]: the remedies' planners kept between batches (the GUI's cache).
//! - [`doctor_advice`]: what the planner says about a model that ran out of memory.
//! - [`doctor_report`]: the doctor's report (diagnosis, snapshot, planner, overlay):
//!   `doctor --json`.
//! - [`error`]: the error a front end shows when an answer cannot be given.
//!
//! The answers take typed settings; the words users type are read into them by
//! `vramlab-words`, at the edge.

pub mod doctor_advice;
pub mod doctor_report;
pub mod error;
pub mod inference;
pub mod inference_json;
pub mod max_batch;
pub mod max_context;
pub mod next_step;
pub mod per_rank;
pub mod remedy_planners;
pub mod report;
pub mod report_json;
pub mod verdict;
/// vLLM's KV capacity, planned in [`crate::plan::inference::vllm`] (the exports use it too).
pub use crate::plan::inference::vllm;
pub mod warnings;

pub use doctor_advice::PlanAdvice;
pub use report::PlanReport;
pub use verdict::{BandEdges, PlanBand, Verdict};
