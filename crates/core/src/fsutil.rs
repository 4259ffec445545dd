//! Files: writing without losing what was there (the one helper every saver uses) and
//! reading a file a user names without reading more than its kind can hold (the one helper
//! every loader uses): `/dev/zero`, a FIFO or a 2 GB file given as a preset is refused at
//! once, never read whole.

use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};

use crate::units::Bytes;

/// The kinds of file a user names, each with the most bytes vramlab reads of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `--model FILE`: a preset document, a Hugging Face `config.json` or a captured graph
    /// (`*.vramlab-graph.json`); read before its content says which.
    Model,
    /// A saved plan (`.vramlab.json`).
    SavedPlan,
    /// A bench run record (JSON).
    Run,
    /// A memory snapshot (`torch.cuda.memory._dump_snapshot` pickle), streamed.
    Snapshot,
    /// An OOM message or a log excerpt holding one.
    OomMessage,
    /// Measurement rows (JSON lines) for `vramlab validate`.
    Measurements,
}

impl FileKind {
    /// The most bytes read of a file of this kind.
    ///
    /// - model file, 128 MiB: presets and `config.json` files are kilobytes; the largest
    ///   recorded captured graph (Qwen3-0.6B, 28 layers, `tests/data/captured/`) is 1.9 MB
    ///   and a graph grows with the op count, so an 80-layer model's is ~6 MB: 20× room.
    /// - saved plan, 4 MiB: [`crate::export::vramlab_file::MAX_BYTES`] (a plan is a few KiB,
    ///   a custom model inside it at most a captured graph's summary).
    /// - run, 64 MiB: [`crate::export::results::MAX_RUN_BYTES`] (the largest recorded run in
    ///   `tests/data/bench/` is 0.5 MB).
    /// - snapshot, 4 GiB: PyTorch's default recording (`stacks='all'`, C++ frames, no
    ///   `max_entries` cap) writes hundreds of MB for a few steps; the reader streams it and
    ///   bounds what it keeps (`doctor::pickle::Limits`), so the size bounds time, not memory.
    /// - OOM message, 16 MiB: a message is a few hundred bytes; a pasted log excerpt fits.
    /// - measurements, 256 MiB: JSON lines of a few hundred bytes each (the recorded files
    ///   are under 1 MB): a million rows.
    pub fn limit(self) -> Bytes {
        Bytes(match self {
            FileKind::Model => 128 << 20,
            FileKind::SavedPlan => crate::export::vramlab_file::MAX_BYTES as u64,
            FileKind::Run => crate::export::results::MAX_RUN_BYTES as u64,
            FileKind::Snapshot => 4 << 30,
            FileKind::OomMessage => 16 << 20,
            FileKind::Measurements => 256 << 20,
        })
    }

    /// What the file is, with its article, for messages.
    pub fn what(self) -> &'static str {
        match self {
            FileKind::Model => "a model file (preset, config.json or captured graph)",
            FileKind::SavedPlan => "a saved plan (.vramlab.json)",
            FileKind::Run => "a run record",
            FileKind::Snapshot => "a memory snapshot",
            FileKind::OomMessage => "an OOM message file",
            FileKind::Measurements => "a measurement file",
        }
    }
}

/// A file a user named that cannot be read as its kind.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    // `error`, not `source`: the message says it once (a source would be printed again by
    // an error chain).
    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{}: not a regular file ({found}); {what} must be a regular file", path.display())]
    NotRegular {
        path: PathBuf,
        found: &'static str,
        what: &'static str,
    },
    #[error("{}: larger than the {limit} limit for {what}", path.display())]
    TooLarge {
        path: PathBuf,
        limit: Bytes,
        what: &'static str,
    },
    #[error("{}: not UTF-8 text ({what} is text): {error}", path.display())]
    NotText {
        path: PathBuf,
        what: &'static str,
        error: std::string::FromUtf8Error,
    },
}

fn file_type_name(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a file"
    }
}

/// A reader that fails, instead of stopping, when its source holds more than the limit.
#[derive(Debug)]
pub struct Bounded<R> {
    inner: std::io::Take<R>,
    path: PathBuf,
    kind: FileKind,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        // The take is limit + 1: reaching its end means one byte more than the limit.
        if n > 0 && self.inner.limit() == 0 {
            return Err(std::io::Error::other(ReadError::TooLarge {
                path: self.path.clone(),
                limit: self.kind.limit(),
                what: self.kind.what(),
            }));
        }
        Ok(n)
    }
}

/// Opens a file a user named as `kind`: refuses anything but a regular file (checked before
/// opening, so a FIFO never blocks) and a file above the kind's limit; the reader fails if
/// the file grows past the limit while it is read. Also returns the size, for progress.
pub fn open_bounded(
    path: &Path,
    kind: FileKind,
) -> Result<(Bounded<std::fs::File>, u64), ReadError> {
    let io = |error| ReadError::Io {
        path: path.to_path_buf(),
        error,
    };
    let check = |meta: &std::fs::Metadata| {
        if !meta.is_file() {
            return Err(ReadError::NotRegular {
                path: path.to_path_buf(),
                found: file_type_name(meta.file_type()),
                what: kind.what(),
            });
        }
        if meta.len() > kind.limit().0 {
            return Err(ReadError::TooLarge {
                path: path.to_path_buf(),
                limit: kind.limit(),
                what: kind.what(),
            });
        }
        Ok(meta.len())
    };
    check(&std::fs::metadata(path).map_err(io)?)?;
    let file = std::fs::File::open(path).map_err(io)?;
    // The file opened may not be the one checked (a rename in between): check it again.
    let len = check(&file.metadata().map_err(io)?)?;
    Ok((
        Bounded {
            inner: file.take(kind.limit().0.saturating_add(1)),
            path: path.to_path_buf(),
            kind,
        },
        len,
    ))
}

/// Reads a file a user named as `kind`, whole, within the kind's limit ([`open_bounded`]).
pub fn read_bounded(path: &Path, kind: FileKind) -> Result<Vec<u8>, ReadError> {
    let (mut reader, len) = open_bounded(path, kind)?;
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    reader.read_to_end(&mut bytes).map_err(|e| {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<ReadError>())
        {
            Some(ReadError::TooLarge { path, limit, what }) => ReadError::TooLarge {
                path: path.clone(),
                limit: *limit,
                what,
            },
            _ => ReadError::Io {
                path: path.to_path_buf(),
                error: e,
            },
        }
    })?;
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_bounded_string(path: &Path, kind: FileKind) -> Result<String, ReadError> {
    String::from_utf8(read_bounded(path, kind)?).map_err(|error| ReadError::NotText {
        path: path.to_path_buf(),
        what: kind.what(),
        error,
    })
}

/// Reads standard input (or any stream) as `kind`'s text, within the kind's limit.
pub fn read_stream_string(
    reader: impl Read,
    name: &Path,
    kind: FileKind,
) -> Result<String, ReadError> {
    let mut bytes = Vec::new();
    reader
        .take(kind.limit().0.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|error| ReadError::Io {
            path: name.to_path_buf(),
            error,
        })?;
    if bytes.len() as u64 > kind.limit().0 {
        return Err(ReadError::TooLarge {
            path: name.to_path_buf(),
            limit: kind.limit(),
            what: kind.what(),
        });
    }
    String::from_utf8(bytes).map_err(|error| ReadError::NotText {
        path: name.to_path_buf(),
        what: kind.what(),
        error,
    })
}

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
    fn bounded_reads_refuse_devices_directories_and_big_files() {
        let dir = std::env::temp_dir().join(format!("vramlab-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let e = read_bounded(&dir, FileKind::Model).expect_err("a directory");
        assert!(e.to_string().contains("a directory"), "{e}");
        #[cfg(unix)]
        {
            let e = read_bounded(Path::new("/dev/zero"), FileKind::Snapshot).expect_err("device");
            assert!(
                e.to_string()
                    .contains("not a regular file (a character device)"),
                "{e}"
            );
        }
        let small = dir.join("plan.vramlab.json");
        std::fs::write(&small, b"{}").expect("write");
        assert_eq!(
            read_bounded_string(&small, FileKind::SavedPlan).expect("read"),
            "{}"
        );
        let big = dir.join("big.vramlab.json");
        let f = std::fs::File::create(&big).expect("create");
        f.set_len(FileKind::SavedPlan.limit().0 + 1)
            .expect("sparse");
        let e = read_bounded(&big, FileKind::SavedPlan).expect_err("big");
        assert!(
            e.to_string()
                .contains("larger than the 4.00 MiB limit for a saved plan"),
            "{e}"
        );
        let e = read_stream_string(
            &vec![b'x'; 17 << 20][..],
            Path::new("-"),
            FileKind::OomMessage,
        )
        .expect_err("stdin");
        assert!(e.to_string().contains("16.00 MiB limit"), "{e}");
        // A reader that meets more bytes than the limit fails rather than stopping short.
        let mut r = Bounded {
            inner: (&[0u8; 8][..]).take(5),
            path: PathBuf::from("x"),
            kind: FileKind::Run,
        };
        let mut buf = Vec::new();
        assert!(r.read_to_end(&mut buf).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

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
