//! What the doctor could not read: a snapshot that is no pickle or no PyTorch memory
//! snapshot, a text without an OOM message.

use thiserror::Error;

use super::pickle;

/// What the doctor could not read.
#[derive(Debug, Error)]
pub enum DoctorError {
    #[error("snapshot: {0}")]
    Pickle(#[from] pickle::PickleError),
    #[error("snapshot: not a PyTorch memory snapshot: {0}")]
    NotSnapshot(String),
    #[error(
        "message: no \"out of memory\" message found (paste the whole error, starting at \
         `torch.OutOfMemoryError: CUDA out of memory.`)"
    )]
    NoMessage,
}
