//! `--model` beyond presets and files: a Hugging Face Hub id (`ORG/NAME[@REVISION]`) and a
//! model folder, read through `vramlab-hub`; a pre-quantized checkpoint planned as stored
//! where the planner models its storage.

use std::borrow::Cow;
use std::path::Path;

use anyhow::{Context, Result, bail};

use vramlab_core::model::Preset;
use vramlab_core::model::hf;
use vramlab_core::units::Bytes;
use vramlab_hub::{HubEnv, HubId, Origin, Prequantized};

use super::args::{TrainArgs, note};

/// A model read from a folder or the Hub: its preset and its stored quantization.
#[derive(Debug, Clone)]
pub(crate) struct Sourced {
    pub preset: Preset,
    pub prequantized: Option<Prequantized>,
}

/// `reference` of an imported config, naming where it came from (saved plans keep it).
fn set_reference(p: &mut Preset, from: &str) {
    p.reference = p
        .reference
        .replace("(config.json)", &format!("(config.json of {from})"));
}

/// A Hub id's config: from the Hugging Face cache, else downloaded into it. The preset is
/// named after the repository (`Qwen2.5-1.5B`), as a clone's `config.json` would be.
pub(crate) fn from_hub(name: &str) -> Result<Sourced> {
    let id = HubId::parse(name).context("--model")?;
    let env = HubEnv::from_env();
    let r = vramlab_hub::resolve(&id, &env).context("--model")?;
    if let Some(w) = &r.warning {
        note(w);
    }
    note(&format!(
        "--model {id}: config.json at commit {}, {} {}",
        r.commit,
        match r.origin {
            Origin::Cache => "from the Hugging Face cache",
            Origin::Downloaded => "downloaded into the Hugging Face cache",
        },
        r.path.display()
    ));
    let mut preset = hf::from_config_text(&r.text, id.name())
        .with_context(|| format!("Hugging Face config of {id} ({})", r.path.display()))?;
    set_reference(
        &mut preset,
        &format!("{} at {}, commit {}", id.repo, id.revision(), r.commit),
    );
    let v: serde_json::Value = serde_json::from_str(&r.text).context("config.json")?;
    Ok(Sourced {
        preset,
        prequantized: vramlab_hub::folder::prequantized(&v),
    })
}

/// A model folder: its `config.json`, named after the folder, with the stored dtypes of
/// its safetensors said on standard error.
pub(crate) fn from_folder(dir: &Path) -> Result<Sourced> {
    let f = vramlab_hub::folder::read(dir).context("--model")?;
    let mut preset = hf::from_config_text(&f.text, &f.name)
        .with_context(|| format!("Hugging Face config {}", f.config_path.display()))?;
    set_reference(&mut preset, &dir.display().to_string());
    match &f.weights {
        Some(w) => {
            let stored: Vec<String> = w
                .elements
                .iter()
                .map(|(dtype, n)| {
                    let bytes = Bytes(w.bytes.get(dtype).copied().unwrap_or(0));
                    format!("{dtype} {n} elements ({bytes})")
                })
                .collect();
            note(&format!(
                "--model {}: {} tensors in {} safetensors file(s), stored as {}; the plan holds \
                 the weights in the dtype --precision gives (bf16 keeps bf16 weights)",
                dir.display(),
                w.tensors,
                w.files,
                stored.join(", ")
            ));
        }
        None => note(&format!(
            "--model {}: no model.safetensors(.index.json): stored dtypes unknown",
            dir.display()
        )),
    }
    Ok(Sourced {
        preset,
        prequantized: f.prequantized,
    })
}

/// The flags with a pre-quantized checkpoint planned as it is stored: a bitsandbytes 4-bit
/// or 8-bit base is QLoRA's base (`--finetune qlora --quant …`), the only way such a base
/// trains; other methods are not modelled, said on standard error.
pub(crate) fn as_stored<'a>(
    t: &'a TrainArgs,
    q: Option<&Prequantized>,
    model: &str,
) -> Result<Cow<'a, TrainArgs>> {
    let Some(q) = q else {
        return Ok(Cow::Borrowed(t));
    };
    let (quant, double) = match q {
        Prequantized::Bnb4 {
            quant_type,
            double_quant,
        } if matches!(quant_type.as_str(), "nf4" | "fp4") => (quant_type.as_str(), *double_quant),
        Prequantized::Bnb8 => ("int8", false),
        other => {
            note(&format!(
                "--model {model}: quantization_config says the checkpoint is pre-quantized \
                 ({other}); that storage is not modelled: the plan holds unquantized weights in \
                 the dtype --precision gives"
            ));
            return Ok(Cow::Borrowed(t));
        }
    };
    match t.finetune.as_deref() {
        None => {
            let mut planned = t.clone();
            planned.finetune = Some("qlora".to_string());
            planned.quant = Some(quant.to_string());
            planned.no_double_quant = !double;
            note(&format!(
                "--model {model}: the checkpoint is pre-quantized ({q}); planned as stored: \
                 --finetune qlora --quant {quant}{} (adapters on the quantized base)",
                if double { "" } else { " --no-double-quant" }
            ));
            Ok(Cow::Owned(planned))
        }
        Some("qlora") => {
            if t.quant.as_deref().is_some_and(|given| given != quant) {
                note(&format!(
                    "--model {model}: the checkpoint stores {q}; planning the --quant given"
                ));
            }
            Ok(Cow::Borrowed(t))
        }
        Some(other) => bail!(
            "--finetune {other}: --model {model} is pre-quantized ({q}): its base weights stay \
             quantized and cannot train as {other}; plan it with --finetune qlora (LoRA \
             adapters on the quantized base), or use the unquantized checkpoint"
        ),
    }
}
