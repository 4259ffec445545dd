//! Forgiving names for everything a user types: models, GPUs, precisions, optimizers,
//! attention kernels and export formats.
//!
//! Matching ignores case and punctuation (`Llama-3-8B`, `llama_3_8b` and `llama38b` are the
//! same), accepts documented aliases (`fp16` → `amp-fp16`) and says which canonical name an
//! alias stood for, refuses ambiguous prefixes with the candidates (`a100` → `a100-40gb` or
//! `a100-80gb`), and suggests the closest known names (edit distance) when nothing matches.

use thiserror::Error;

/// A name that did not resolve. The message names the field and, where there are any, the
/// closest known names.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    /// Nothing matched.
    #[error("unknown {field} `{value}`{}{}", did_you_mean(.suggestions), known_list(.known))]
    Unknown {
        field: &'static str,
        value: String,
        /// The closest known names, best first (may be empty).
        suggestions: Vec<String>,
        /// "known: " and every canonical name, or a hint where the list is long.
        known: String,
    },
    /// More than one name matched.
    #[error("{field} `{value}` is ambiguous: it could be {}; give the full id", .candidates.join(", "))]
    Ambiguous {
        field: &'static str,
        value: String,
        candidates: Vec<String>,
    },
}

fn did_you_mean(s: &[String]) -> String {
    match s {
        [] => String::new(),
        [one] => format!("; did you mean `{one}`?"),
        many => format!(
            "; did you mean one of {}?",
            many.iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn known_list(known: &str) -> String {
    if known.is_empty() {
        String::new()
    } else {
        format!(" ({known})")
    }
}

/// Lower-case ASCII letters and digits only: `Meta-Llama-3-8B` → `metallama38b`.
pub fn normalize(s: &str) -> String {
    s.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions, so `gtp2`
/// is one edit from `gpt2`).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let w = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * w];
    for (i, row) in d.chunks_mut(w).enumerate() {
        row[0] = i;
    }
    for (j, cell) in d.iter_mut().take(w).enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[(i - 1) * w + j] + 1)
                .min(d[i * w + j - 1] + 1)
                .min(d[(i - 1) * w + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[(i - 2) * w + j - 2] + 1);
            }
            d[i * w + j] = v;
        }
    }
    d[a.len() * w + b.len()]
}

/// One known name: its canonical spelling, other accepted spellings, and what an alias
/// means where that needs saying.
#[derive(Debug, Clone)]
pub struct Choice<T> {
    pub canonical: String,
    /// Accepted spellings besides the canonical one (matched after [`normalize`]).
    pub aliases: Vec<String>,
    pub value: T,
}

impl<T> Choice<T> {
    pub fn new(canonical: &str, aliases: &[&str], value: T) -> Choice<T> {
        Choice {
            canonical: canonical.to_string(),
            aliases: aliases.iter().map(|a| (*a).to_string()).collect(),
            value,
        }
    }

    fn keys(&self) -> impl Iterator<Item = String> + '_ {
        std::iter::once(normalize(&self.canonical)).chain(self.aliases.iter().map(|a| normalize(a)))
    }
}

/// A resolved name: the value, its canonical name and, when the input was not the
/// canonical name, a note saying what it was taken to mean.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved<T> {
    pub value: T,
    pub canonical: String,
    /// e.g. "precision `fp16` read as `amp-fp16`".
    pub note: Option<String>,
}

/// How much of a name may be left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partial {
    /// Only whole names (after normalising) and aliases.
    Exact,
    /// Also a part of a name, when exactly one name contains it (`4090` → `rtx-4090`);
    /// a part several names contain is refused with the candidates.
    Unique,
}

/// Resolves `input` among `choices`; errors name `field`. `known` is shown with an unknown
/// name (empty: the canonical names are listed).
pub fn resolve<T: Clone>(
    field: &'static str,
    input: &str,
    choices: &[Choice<T>],
    partial: Partial,
    known: &str,
) -> Result<Resolved<T>, NameError> {
    let n = normalize(input);
    let known = if known.is_empty() {
        let names: Vec<&str> = choices.iter().map(|c| c.canonical.as_str()).collect();
        format!("known: {}", names.join(", "))
    } else {
        known.to_string()
    };
    let unknown = |suggestions: Vec<String>| NameError::Unknown {
        field,
        value: input.to_string(),
        suggestions,
        known: known.clone(),
    };
    if n.is_empty() {
        return Err(unknown(Vec::new()));
    }
    let found = |c: &Choice<T>| {
        let note = (normalize(&c.canonical) != n)
            .then(|| format!("{field} `{input}` read as `{}`", c.canonical));
        Resolved {
            value: c.value.clone(),
            canonical: c.canonical.clone(),
            note,
        }
    };
    let exact: Vec<&Choice<T>> = choices
        .iter()
        .filter(|c| c.keys().any(|k| k == n))
        .collect();
    match exact.as_slice() {
        [one] => return Ok(found(one)),
        [] => {}
        many => {
            return Err(NameError::Ambiguous {
                field,
                value: input.to_string(),
                candidates: many.iter().map(|c| c.canonical.clone()).collect(),
            });
        }
    }
    let containing: Vec<&Choice<T>> = choices
        .iter()
        .filter(|c| c.keys().any(|k| k.contains(&n)))
        .collect();
    if partial == Partial::Unique {
        match containing.as_slice() {
            [one] => return Ok(found(one)),
            [] => {}
            many => {
                return Err(NameError::Ambiguous {
                    field,
                    value: input.to_string(),
                    candidates: many.iter().map(|c| c.canonical.clone()).collect(),
                });
            }
        }
    }
    Err(unknown(suggest(&n, choices, &containing)))
}

/// The closest names to the normalised input `n`: within a third of its length in edits
/// (at least 1, at most 3), best first, then names that contain it; at most four.
fn suggest<T>(n: &str, choices: &[Choice<T>], containing: &[&Choice<T>]) -> Vec<String> {
    let limit = (n.chars().count() / 3).clamp(1, 3);
    let mut scored: Vec<(usize, &str)> = choices
        .iter()
        .filter_map(|c| {
            let d = c.keys().map(|k| edit_distance(n, &k)).min()?;
            (d <= limit).then_some((d, c.canonical.as_str()))
        })
        .collect();
    scored.sort_by_key(|(d, _)| *d);
    let mut out: Vec<String> = Vec::new();
    for name in scored
        .iter()
        .map(|(_, c)| *c)
        .chain(containing.iter().map(|c| c.canonical.as_str()))
    {
        if !out.iter().any(|o| o == name) {
            out.push(name.to_string());
        }
    }
    out.truncate(4);
    out
}

// ---- The vocabularies -------------------------------------------------------------------

use crate::export::Format;
use crate::plan::config::{Attention, Optimizer, Precision};
use crate::plan::gpus::Gpu;

/// Precision aliases. `fp16`/`half`/`16-mixed` mean autocast fp16 (`amp-fp16`: pure fp16
/// training is not modelled); `bfloat16`/`bf16-true` mean pure bf16 (`bf16`,
/// `model.to(torch.bfloat16)`); `bf16-amp`/`bf16-mixed` mean autocast bf16 (`amp-bf16`);
/// `float32`/`32`/`tf32` mean `fp32`. A bare `amp` is refused: fp16 or bf16?
pub fn precision(input: &str) -> Result<Resolved<Precision>, NameError> {
    let choices = [
        Choice::new(
            "fp32",
            &["float32", "f32", "32", "32-true", "full", "tf32"],
            Precision::Fp32,
        ),
        Choice::new(
            "amp-fp16",
            &[
                "fp16",
                "float16",
                "f16",
                "half",
                "16",
                "16-mixed",
                "fp16-amp",
                "fp16-mixed",
                "autocast-fp16",
                "amp",
                "mixed",
            ],
            Precision::AmpFp16,
        ),
        Choice::new(
            "amp-bf16",
            &["bf16-amp", "bf16-mixed", "autocast-bf16", "amp", "mixed"],
            Precision::AmpBf16,
        ),
        Choice::new(
            "bf16",
            &["bfloat16", "bf16-true", "pure-bf16", "bf16-pure"],
            Precision::Bf16,
        ),
    ];
    let mut r = resolve("precision", input, &choices, Partial::Exact, "")?;
    if let Some(note) = &mut r.note {
        note.push_str(match r.value {
            Precision::Fp32 => " (float32 weights and math; TF32 matmuls use the same memory)",
            Precision::AmpFp16 => {
                " (autocast fp16 with fp32 weights and a GradScaler; pure fp16 training is not modelled)"
            }
            Precision::AmpBf16 => " (autocast bf16 with fp32 weights)",
            Precision::Bf16 => {
                " (pure bf16: model.to(torch.bfloat16), no fp32 master weights; autocast bf16 is amp-bf16)"
            }
        });
    }
    Ok(r)
}

/// Optimizer aliases (`sgdm`, `momentum`, `adam-8bit`, `adamw8bit`, `bnb-adam8bit`, …).
pub fn optimizer(input: &str) -> Result<Resolved<Optimizer>, NameError> {
    let choices = [
        Choice::new("sgd", &["plain-sgd"], Optimizer::Sgd),
        Choice::new(
            "sgd-momentum",
            &["sgdm", "momentum", "sgd-with-momentum", "nesterov"],
            Optimizer::SgdMomentum,
        ),
        Choice::new("adam", &[], Optimizer::Adam),
        Choice::new("adamw", &["adam-w", "adamw-torch"], Optimizer::AdamW),
        Choice::new("adafactor", &[], Optimizer::Adafactor),
        Choice::new(
            "adam8bit",
            &[
                "adam-8bit",
                "8bit-adam",
                "adamw8bit",
                "adamw-8bit",
                "bnb-adam8bit",
                "paged-adamw-8bit",
            ],
            Optimizer::Adam8bit,
        ),
    ];
    resolve("optimizer", input, &choices, Partial::Exact, "")
}

/// Attention aliases (`flash`, `flash-attention-2`, `sdpa`, `math` is eager).
pub fn attention(input: &str) -> Result<Resolved<Attention>, NameError> {
    let choices = [
        Choice::new("eager", &["math", "naive"], Attention::Eager),
        Choice::new(
            "sdpa",
            &[
                "flash",
                "flash-attention",
                "flash-attention-2",
                "flash-attn",
                "fa2",
                "memory-efficient",
            ],
            Attention::Sdpa,
        ),
    ];
    resolve("attention", input, &choices, Partial::Exact, "")
}

/// Export-format aliases (`huggingface`, `transformers`, `ds`, `pl`, `torch`, `json`).
pub fn format(input: &str) -> Result<Resolved<Format>, NameError> {
    let aliases = |f: Format| -> &'static [&'static str] {
        match f {
            Format::Vramlab => &["json", "vramlab-json"],
            Format::DeepSpeed => &["ds", "deepspeed-json"],
            Format::HuggingFace => &[
                "huggingface",
                "transformers",
                "training-arguments",
                "trainer",
            ],
            Format::Lightning => &["pl", "pytorch-lightning", "lightning-trainer"],
            Format::PyTorch => &["torch", "pt", "python"],
            Format::Env => &["alloc-conf", "pytorch-cuda-alloc-conf", "shell"],
        }
    };
    let choices: Vec<Choice<Format>> = Format::ALL
        .into_iter()
        .map(|f| Choice::new(f.as_str(), aliases(f), f))
        .collect();
    resolve("format", input, &choices, Partial::Exact, "")
}

/// A catalog GPU by id or name; a part of one (`4090`) is accepted when only one card has
/// it, and refused with the candidates when several do (`a100`, `rtx`).
pub fn gpu(input: &str, catalog: &[Gpu]) -> Result<Resolved<Gpu>, NameError> {
    let choices: Vec<Choice<Gpu>> = catalog
        .iter()
        .map(|g| {
            let short = g.name.trim_start_matches("NVIDIA ");
            let shorter = short.trim_start_matches("GeForce ");
            Choice {
                canonical: g.id.clone(),
                aliases: vec![g.name.clone(), short.to_string(), shorter.to_string()],
                value: g.clone(),
            }
        })
        .collect();
    resolve("gpu", input, &choices, Partial::Unique, "")
}

/// A built-in model preset id by id or display name (`llama-3-8b` → `Meta-Llama-3-8B`,
/// `gpt-2` → `gpt2`, `vit-b-16` → `vit_b_16`, `bert-base` → `bert-base-uncased`).
pub fn model_id(input: &str) -> Result<Resolved<&'static str>, NameError> {
    let choices: Vec<Choice<&'static str>> = crate::model::preset::BUILTIN
        .iter()
        .map(|(id, text)| {
            let mut aliases = Vec::new();
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
                && let Some(d) = v.get("display_name").and_then(|d| d.as_str())
            {
                aliases.push(d.to_string());
            }
            let lower = id.to_ascii_lowercase();
            let bare = lower
                .trim_start_matches("meta-")
                .trim_end_matches("-hf")
                .trim_end_matches("-uncased");
            if bare != lower {
                aliases.push(bare.to_string());
            }
            Choice {
                canonical: (*id).to_string(),
                aliases,
                value: *id,
            }
        })
        .collect();
    resolve(
        "model",
        input,
        &choices,
        Partial::Exact,
        "run `vramlab presets` for the list, or pass a preset file path",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn colours() -> Vec<Choice<u8>> {
        vec![
            Choice::new("red-dark", &["maroon"], 1),
            Choice::new("red-light", &[], 2),
            Choice::new("blue", &["navy"], 3),
        ]
    }

    #[test]
    fn distance() {
        assert_eq!(edit_distance("gtp2", "gpt2"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn exact_alias_partial_ambiguous_unknown() {
        let c = colours();
        let r = resolve("colour", "Red_Dark", &c, Partial::Exact, "").expect("exact");
        assert_eq!((r.value, r.note), (1, None));
        let r = resolve("colour", "navy", &c, Partial::Exact, "").expect("alias");
        assert_eq!(r.value, 3);
        assert_eq!(r.note.as_deref(), Some("colour `navy` read as `blue`"));
        assert_eq!(
            resolve("colour", "light", &c, Partial::Unique, "").map(|r| r.value),
            Ok(2)
        );
        let err = resolve("colour", "red", &c, Partial::Unique, "").expect_err("ambiguous");
        assert!(
            matches!(err, NameError::Ambiguous { ref candidates, .. } if candidates.len() == 2)
        );
        assert!(err.to_string().contains("red-dark, red-light"), "{err}");
        let err = resolve("colour", "bleu", &c, Partial::Exact, "").expect_err("unknown");
        assert_eq!(
            err.to_string(),
            "unknown colour `bleu`; did you mean `blue`? (known: red-dark, red-light, blue)"
        );
        let err = resolve("colour", "", &c, Partial::Unique, "x").expect_err("empty");
        assert!(err.to_string().starts_with("unknown colour ``"), "{err}");
    }

    #[test]
    fn vocabularies() {
        assert_eq!(precision("fp16").map(|r| r.value), Ok(Precision::AmpFp16));
        assert_eq!(
            precision("BF16-AMP").map(|r| r.value),
            Ok(Precision::AmpBf16)
        );
        let r = precision("bfloat16").expect("bfloat16");
        assert_eq!(r.value, Precision::Bf16);
        assert!(r.note.is_some_and(|n| n.contains("pure bf16")));
        assert!(matches!(precision("amp"), Err(NameError::Ambiguous { .. })));
        assert!(
            precision("fp61").is_err_and(|e| e.to_string().contains("did you mean `amp-fp16`"))
        );
        assert_eq!(optimizer("AdamW").map(|r| r.note), Ok(None));
        assert_eq!(
            optimizer("sgdm").map(|r| r.value),
            Ok(Optimizer::SgdMomentum)
        );
        assert_eq!(
            attention("flash_attention_2").map(|r| r.value),
            Ok(Attention::Sdpa)
        );
        assert_eq!(
            format("huggingface").map(|r| r.value),
            Ok(Format::HuggingFace)
        );
        assert!(format("deepspeeed").is_err_and(|e| e.to_string().contains("`deepspeed`")));
        assert_eq!(
            model_id("llama-3-8b").map(|r| r.value),
            Ok("Meta-Llama-3-8B")
        );
        assert_eq!(model_id("Llama 2 7B").map(|r| r.value), Ok("Llama-2-7b-hf"));
        assert_eq!(model_id("ResNet-50").map(|r| r.note), Ok(None));
        assert_eq!(model_id("vit-b-16").map(|r| r.value), Ok("vit_b_16"));
        assert_eq!(
            model_id("bert-base").map(|r| r.value),
            Ok("bert-base-uncased")
        );
        let e = model_id("gtp2").expect_err("typo");
        assert!(e.to_string().contains("did you mean `gpt2`?"), "{e}");
        let e = model_id("llama").expect_err("a part");
        assert!(e.to_string().contains("Meta-Llama-3-8B"), "{e}");
    }
}
