//! Configs in and out: the `.vramlab.json` document and framework configs generated from
//! a plan, bench results as JSON / CSV. Pure functions plus one atomic file write; no UI, no GPU.

pub mod distributed_exports;
pub mod frameworks;
pub mod peft;
pub mod results;
pub mod vramlab_file;

pub use frameworks::{Format, render};
pub use vramlab_file::{SCHEMA_VERSION, VramlabConfig};

/// A Python boolean literal, for the generated scripts and configs.
pub(crate) fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}
