//! Where a `--model` that is neither a preset nor a file comes from: a Hugging Face Hub id
//! (`ORG/NAME[@REVISION]`, its `config.json` taken from the huggingface_hub cache, else
//! downloaded into it) or a model folder (its `config.json` and the stored dtypes of its
//! safetensors). Network code lives here, never in `vramlab-core`; what this returns is
//! the config text the core's `config.json` import reads.

pub mod cache;
pub mod env;
pub mod error;
#[cfg(feature = "download")]
pub mod fetch;
pub mod folder;
pub mod id;
pub mod resolve;
pub mod source;

pub use env::HubEnv;
pub use error::HubError;
pub use folder::{Folder, Prequantized, Weights};
pub use id::HubId;
pub use resolve::{Origin, Resolved, check_config, resolve};
pub use source::Source;
