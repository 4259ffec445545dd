//! GPU names as users type them (`4090`, `H200`, `NVIDIA H100 SXM 80GB`), resolved in the
//! catalog (`plan::gpus`).

use crate::names::{Choice, NameError, Partial, Resolved, resolve};
use vramlab_core::plan::gpus::{Gpu, catalog};

/// A catalog GPU by id or name; a part of one (`4090`) is accepted when only one card has
/// it, and refused with the candidates when several do (`a100`, `rtx`).
pub fn gpu_by_name(input: &str, catalog: &[Gpu]) -> Result<Resolved<Gpu>, NameError> {
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

/// Finds a catalog GPU by id or name (case- and punctuation-insensitive; "4090" finds
/// "rtx-4090"; a part several cards share, like "a100", is refused with the candidates).
pub fn find_gpu(id: &str) -> Result<Gpu, NameError> {
    Ok(gpu_by_name(id, &catalog())?.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use find_gpu as find;

    #[test]
    fn finds_by_partial_id() {
        assert_eq!(find("4090").map(|g| g.id), Ok("rtx-4090".to_string()));
        assert_eq!(find("H200").map(|g| g.memory_mib), Ok(143771));
        assert!(matches!(
            find("voodoo"),
            Err(NameError::Unknown { field: "gpu", .. })
        ));
        // A part several cards share is refused with every candidate.
        for (part, n) in [("a100", 2), ("rtx", 4), ("v100", 2)] {
            match find(part) {
                Err(NameError::Ambiguous { candidates, .. }) => {
                    assert_eq!(candidates.len(), n, "{part}: {candidates:?}");
                }
                other => panic!("{part}: {other:?}"),
            }
        }
        assert_eq!(
            find("NVIDIA H100 SXM 80GB").map(|g| g.id),
            Ok("h100".to_string())
        );
        assert!(find("t4").is_ok_and(|g| g.lacks_bf16()));
        assert!(find("a10").is_ok_and(|g| !g.lacks_bf16()));
    }
}
