//! `--model` beyond presets and files: a Hugging Face Hub id (`ORG/NAME[@REVISION]`) and a
//! model folder, read through `vramlab-hub` (a pre-quantized checkpoint is planned as stored
//! by `args::as_stored`).

use anyhow::{Context, Result};

use vramlab_hub::{HubEnv, Source};

use super::stderr::note;

/// A model folder or a Hub id, read by `vramlab-hub` (the function the GUI's model picker
/// calls too), its notes said on standard error.
pub(crate) fn load(name: &str) -> Result<Source> {
    let what = if std::path::Path::new(name.trim()).is_dir() {
        "--model".to_string()
    } else {
        // A mistyped path reads as a Hub id too: say how it was read.
        format!("--model {name} (no such file, folder or preset here; read as a Hub id)")
    };
    let s = vramlab_hub::source::load(name, &HubEnv::from_env()).context(what)?;
    for n in &s.notes {
        note(&format!("--model {n}"));
    }
    Ok(s)
}
