//! Test support for this crate's tests and the binary's: writing a script that a test then
//! executes (a fake `python` for the engines).
//!
//! Writing it from the test process races with every other test thread that spawns a
//! child: a `fork` in another thread between our `open` for writing and our `close`
//! hands the child a copy of the write descriptor, and until that child `exec`s, the
//! kernel refuses to execute the file (`ETXTBSY`, "Text file busy"). CI hit exactly
//! that. So the text goes to a side file that is never executed, and a single-threaded
//! child (`install`) copies it into place with its mode: no write descriptor to the
//! executable ever exists in the test process.

use std::path::Path;
use std::process::Command;

/// Writes `text` to `path` as an executable (mode 0755), through `path` with the extension
/// `text` and `install -m 0755`.
#[cfg(unix)]
pub fn write_executable(path: &Path, text: &str) -> std::io::Result<()> {
    let side = path.with_extension("text");
    std::fs::write(&side, text)?;
    let status = Command::new("install")
        .arg("-m")
        .arg("0755")
        .arg(&side)
        .arg(path)
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "install {} failed: {status}",
            path.display()
        )))
    }
}
