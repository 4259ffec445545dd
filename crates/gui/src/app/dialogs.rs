//! The file dialogs and what stands in for them: rfd's save and open dialogs (replaceable
//! in tests), the message when none answers, the "open by path" window's state, and the
//! bounded read of a chosen file.

use std::path::{Path, PathBuf};

pub(super) const NO_DIALOG: &str =
    "No file chosen (cancelled, or no file dialog: it needs xdg-desktop-portal or zenity).";

/// Save dialog: suggested file name → chosen path (`None`: cancelled or no dialog).
pub type SaveDialog = Box<dyn FnMut(&str) -> Option<PathBuf>>;
/// Open dialog → chosen path.
pub type OpenDialog = Box<dyn FnMut() -> Option<PathBuf>>;

pub(super) fn rfd_save(name: &str) -> Option<PathBuf> {
    let mut dialog = rfd::FileDialog::new().set_title("Save").set_file_name(name);
    if let Some(ext) = Path::new(name).extension().and_then(|e| e.to_str()) {
        dialog = dialog.add_filter(ext, &[ext]);
    }
    dialog.save_file()
}

pub(super) fn rfd_open() -> Option<PathBuf> {
    rfd::FileDialog::new()
        .set_title("Open")
        .add_filter(
            "JSON (presets, Hugging Face config.json, .vramlab.json plans)",
            &["json"],
        )
        .pick_file()
}

pub(super) fn rfd_open_config() -> Option<PathBuf> {
    rfd::FileDialog::new()
        .set_title("Open a Hugging Face config.json")
        .add_filter("Hugging Face config.json (*.json)", &["json"])
        .set_file_name("config.json")
        .pick_file()
}

/// Reads a saved plan: a regular file of at most `vramlab_file::MAX_BYTES` (`fsutil::read_bounded`).
pub(super) fn read_limited(path: &Path) -> Result<Vec<u8>, vramlab_core::fsutil::ReadError> {
    vramlab_core::fsutil::read_bounded(path, vramlab_core::fsutil::FileKind::SavedPlan)
}

/// What a path typed into the fallback window opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpenKind {
    Plan,
    Preset,
    Run,
    HfConfig,
}

impl OpenKind {
    pub(super) fn what(self) -> &'static str {
        match self {
            OpenKind::Plan => "a plan (.vramlab.json)",
            OpenKind::Preset => "a preset",
            OpenKind::Run => "a run",
            OpenKind::HfConfig => "a Hugging Face config.json",
        }
    }
}

/// The fallback when no file dialog is available: a path field.
#[derive(Debug, Clone)]
pub(super) struct PathPrompt {
    pub(super) kind: OpenKind,
    pub(super) text: String,
}

impl PathPrompt {
    pub(super) fn new(kind: OpenKind) -> PathPrompt {
        PathPrompt {
            kind,
            text: String::new(),
        }
    }
}
