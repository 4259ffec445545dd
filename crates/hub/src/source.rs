//! A `--model` that is a model folder or a Hub id, read into a preset: the one function the
//! command line (plan, max-batch, fit, export, doctor) and the GUI's model picker both call,
//! so a Hub id or a folder resolves the same way wherever it is typed.

use std::path::Path;

use vramlab_core::model::{Preset, hf};
use vramlab_core::units::Bytes;

use crate::env::HubEnv;
use crate::error::HubError;
use crate::folder::{self, Prequantized};
use crate::id::HubId;
use crate::resolve::{Origin, resolve};

/// A model read from a folder or the Hub.
#[derive(Debug, Clone)]
pub struct Source {
    /// The imported `config.json`, named after the repository or the folder, its
    /// `reference` naming where it came from (a saved plan keeps it).
    pub preset: Preset,
    /// The config's `quantization_config`: the checkpoint is stored quantized.
    pub prequantized: Option<Prequantized>,
    /// The Hub repository (`ORG/NAME`) when the config came from the Hub.
    pub hub_repo: Option<String>,
    /// What to tell the user: where the config came from, the stored dtypes, a cache that
    /// could not be written.
    pub notes: Vec<String>,
}

/// Whether `name` is for [`load`]: an existing folder, or shaped like a Hub id
/// (`ORG/NAME[@REVISION]`). Callers try a file and a preset name first.
pub fn is_source(name: &str) -> bool {
    let name = name.trim();
    Path::new(name).is_dir() || HubId::looks_like(name)
}

/// Reads `name`: a model folder when it is one, else a Hub id resolved through `env` (the
/// Hugging Face cache first, then a download unless offline).
pub fn load(name: &str, env: &HubEnv) -> Result<Source, HubError> {
    let name = name.trim();
    let path = Path::new(name);
    if path.is_dir() {
        return from_folder(path);
    }
    from_hub(&HubId::parse(name)?, env)
}

/// `reference` of an imported config, naming where it came from.
fn set_reference(p: &mut Preset, from: &str) {
    p.reference = p
        .reference
        .replace("(config.json)", &format!("(config.json of {from})"));
}

/// A Hub id's config: from the Hugging Face cache, else downloaded into it. The preset is
/// named after the repository (`Qwen2.5-1.5B`), as a clone's `config.json` would be.
pub fn from_hub(id: &HubId, env: &HubEnv) -> Result<Source, HubError> {
    let r = resolve(id, env)?;
    let mut notes: Vec<String> = r.warning.iter().cloned().collect();
    notes.push(format!(
        "{id}: config.json at commit {}, {} {}",
        r.commit,
        match r.origin {
            Origin::Cache => "from the Hugging Face cache",
            Origin::Downloaded => "downloaded into the Hugging Face cache",
        },
        r.path.display()
    ));
    let mut preset =
        hf::from_config_text(&r.text, id.name()).map_err(|error| HubError::Import {
            what: format!("Hugging Face config of {id} ({})", r.path.display()),
            error,
        })?;
    set_reference(
        &mut preset,
        &format!("{} at {}, commit {}", id.repo, id.revision(), r.commit),
    );
    let v: serde_json::Value = serde_json::from_str(&r.text).map_err(|e| HubError::Malformed {
        what: id.to_string(),
        reason: format!("config.json is not valid JSON: {e}"),
    })?;
    Ok(Source {
        preset,
        prequantized: folder::prequantized(&v),
        hub_repo: Some(id.repo.clone()),
        notes,
    })
}

/// A model folder: its `config.json`, named after the folder, with the stored dtypes of
/// its safetensors in the notes.
pub fn from_folder(dir: &Path) -> Result<Source, HubError> {
    let f = folder::read(dir)?;
    let mut preset = hf::from_config_text(&f.text, &f.name).map_err(|error| HubError::Import {
        what: format!("Hugging Face config {}", f.config_path.display()),
        error,
    })?;
    set_reference(&mut preset, &dir.display().to_string());
    let note = match &f.weights {
        Some(w) => {
            let stored: Vec<String> = w
                .elements
                .iter()
                .map(|(dtype, n)| {
                    let bytes = Bytes(w.bytes.get(dtype).copied().unwrap_or(0));
                    format!("{dtype} {n} elements ({bytes})")
                })
                .collect();
            format!(
                "{}: {} tensors in {} safetensors file(s), stored as {}; the plan holds the \
                 weights in the dtype --precision gives (bf16 keeps bf16 weights)",
                dir.display(),
                w.tensors,
                w.files,
                stored.join(", ")
            )
        }
        None => format!(
            "{}: no model.safetensors(.index.json): stored dtypes unknown",
            dir.display()
        ),
    };
    Ok(Source {
        preset,
        prequantized: f.prequantized,
        hub_repo: None,
        notes: vec![note],
    })
}
