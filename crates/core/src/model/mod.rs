//! Model IR, builders and presets. Pure data: no I/O beyond parsing, no GPU, no UI.

pub mod builder;
pub mod captured;
pub mod captured_kernels;
pub mod checks;
pub mod families;
pub mod hf;
pub mod ir;
pub mod preset;
pub mod work;

pub use checks::{MAX_DIM, MAX_ELEMS, MAX_LAYERS, ModelError};
pub use ir::Graph;
pub use preset::{InputSpec, ModelSpec, Preset};
