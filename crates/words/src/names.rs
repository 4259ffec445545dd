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
}
