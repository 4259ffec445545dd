//! How the command line ends: an error with its own exit status ([`Exit`]), and a closed
//! pipe that is no error.

/// Exit status of `max-batch` when even batch 1 does not fit (documented in the README).
pub const EXIT_NOTHING_FITS: u8 = 3;

/// An error that exits with its own status instead of 1.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// Whether the error is a write to a closed pipe (`vramlab presets | head -1`): Unix tools
/// exit quietly then.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
