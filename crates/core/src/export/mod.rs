//! Configs in and out: the `.vramlab.json` document and framework configs generated from
//! a plan, bench results as JSON / CSV. Pure functions plus one atomic file write; no UI, no GPU.

pub mod distributed_exports;
pub mod frameworks;
pub mod inference_exports;
pub mod peft;
pub(crate) mod python;
pub mod results;
pub mod vramlab_file;

pub use frameworks::{ExportError, Format, render};
pub use inference_exports::InferFormat;
pub use vramlab_file::{SCHEMA_VERSION, VramlabConfig};
