//! `--model` beyond presets and files: a Hugging Face Hub id (`ORG/NAME[@REVISION]`) and a
//! model folder, read through `vramlab-hub`; a pre-quantized checkpoint planned as stored
//! where the planner models its storage.

use std::borrow::Cow;

use anyhow::{Context, Result, bail};

use vramlab_hub::{HubEnv, Prequantized, Source};

use super::args::{TrainArgs, note};

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
    let Some((quant, double)) = q.qlora_base() else {
        note(&format!(
            "--model {model}: quantization_config says the checkpoint is pre-quantized ({q}); \
             that storage is not modelled: the plan holds unquantized weights in the dtype \
             --precision gives"
        ));
        return Ok(Cow::Borrowed(t));
    };
    let quant = quant.as_str();
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
