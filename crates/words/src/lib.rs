//! vramlab's words: what users type — on the command line, in the GUI's fields, as the
//! Python bindings' keywords — read into the core's typed values, at the edge. The core
//! takes typed values and reads no word; every front end reads its words through here, so
//! they all accept the same names and refuse the same mistakes.
//!
//! - [`names`]: forgiving name matching (case and punctuation ignored, aliases, "did you
//!   mean" on a typo, ambiguous prefixes refused);
//! - [`vocabulary`]: precisions, optimizers, attention kernels, export formats and built-in
//!   models by name; [`gpus`]: GPU names in the catalog; [`sizes`]: sizes such as `10GiB`;
//!   [`settings`]: every other setting the planner takes; [`batches`]: a bench run's batch
//!   list;
//! - [`Parse`] and [`parse`]: the trait those types implement here (`FromStr` cannot: the
//!   types are the core's);
//! - [`train_words`]: a whole configuration as words (the CLI's flags, the Python keywords)
//!   resolved to a preset, a training config and a GPU budget, and the reports of it;
//!   [`fit_words`]: `vramlab fit` and `vramlab export` from words.

pub mod batches;
pub mod fit_words;
pub mod gpus;
pub mod names;
mod parse;
pub mod settings;
pub mod sizes;
pub mod train_words;
pub mod vocabulary;

pub use gpus::{find_gpu, gpu_by_name};
pub use parse::{Parse, parse};
pub use settings::parse_dtype;
pub use sizes::max_memory_bytes;
