//! vramlab's pure core: the model IR and its builders ([`model`]), the planner ([`plan`]),
//! exports ([`export`]), run records and sweep plans ([`record`], [`sweep`]), units and
//! validation against measured runs, and the OOM doctor ([`doctor`]: OOM messages, memory
//! snapshots read by a safe pickle reader, diagnoses).
//!
//! Nothing here touches a GPU, a window or a file dialog: this crate depends on serde,
//! serde_json, serde_path_to_error and thiserror only (checked by a test at the root).
//! The only I/O is [`fsutil::write_atomic`]. It reads no word a user types (names with
//! aliases, sizes such as `24GB`): `vramlab-words` reads those into its typed values.

pub mod accuracy;
pub mod answer;
pub mod doctor;
pub mod export;
pub mod fsutil;
pub mod model;
pub mod par;
pub mod plan;
pub mod record;
pub mod sweep;
pub mod units;
pub mod validate;
