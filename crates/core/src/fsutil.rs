//! Writing files without losing what was there: the one helper every saver uses.

use std::io::Write as _;
use std::path::Path;

/// Writes `bytes` to `path` atomically: a temporary file in the same folder, flushed to
/// disk, then renamed over the target. A crash or a full disk leaves the old file intact.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_or_keeps_the_old_file() {
        let dir = std::env::temp_dir().join(format!("vramlab-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("plan.vramlab.json");
        write_atomic(&path, b"first").expect("write");
        write_atomic(&path, b"second").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"second");
        // A failing write (target is a directory) leaves no temporary and no damage.
        let blocked = dir.join("sub");
        std::fs::create_dir_all(blocked.join("x")).expect("dir");
        assert!(write_atomic(&blocked, b"x").is_err());
        assert!(blocked.is_dir());
        let leftovers = std::fs::read_dir(&dir)
            .expect("ls")
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            })
            .count();
        assert_eq!(leftovers, 0);
        assert_eq!(std::fs::read(&path).expect("read"), b"second");
    }
}
