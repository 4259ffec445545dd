//! The Python runners shipped inside the binary (`crates/device/runners/`), written together
//! into one folder before a run: they import one another (`dist_runner.py`, `ds_runner.py` and
//! `infer_runner.py` import `torch_runner.py`, which imports `torch_qlora.py` for QLoRA), so
//! every run gets all of them.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The reference single-GPU runner.
pub const TORCH_RUNNER: &str = include_str!("../../runners/torch_runner.py");
/// bitsandbytes 4-bit layers, `prepare_model_for_kbit_training` and the 8-bit optimizers,
/// imported by `torch_runner.py` for QLoRA rows.
pub const TORCH_QLORA: &str = include_str!("../../runners/torch_qlora.py");
/// The distributed runner (DDP, FSDP2, PyTorch's ZeRO-1), real or emulated world.
pub const DIST_RUNNER: &str = include_str!("../../runners/dist_runner.py");
/// The DeepSpeed runner (ZeRO-1/2/3).
pub const DS_RUNNER: &str = include_str!("../../runners/ds_runner.py");
/// The inference runner (`model.generate()` / a no_grad forward; the lab's
/// `lab/device/infer_runner.py` runs it too); imports `torch_runner.py` for presets and NVML.
pub const INFER_RUNNER: &str = include_str!("../../runners/infer_runner.py");

/// Every shipped runner, by the file name the others import it under.
pub const FILES: [(&str, &str); 5] = [
    ("torch_runner.py", TORCH_RUNNER),
    ("torch_qlora.py", TORCH_QLORA),
    ("dist_runner.py", DIST_RUNNER),
    ("ds_runner.py", DS_RUNNER),
    ("infer_runner.py", INFER_RUNNER),
];

/// Writes every runner into `dir`; returns the path of `name` there.
pub fn write_all(dir: &Path, name: &str) -> Result<PathBuf> {
    for (file, text) in FILES {
        let p = dir.join(file);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every runner in `crates/device/runners/` is shipped, and every sibling a runner
    /// imports is one of them: a runner importing a sibling the binary does not write fails
    /// only on the user's GPU (QLoRA's `import torch_qlora` did, before this list).
    #[test]
    fn every_runner_and_every_sibling_import_is_shipped() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("runners");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .expect("runners/")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".py"))
            .collect();
        on_disk.sort();
        let mut shipped: Vec<String> = FILES.iter().map(|(f, _)| f.to_string()).collect();
        shipped.sort();
        assert_eq!(on_disk, shipped);
        let mut imports = 0;
        for (file, text) in FILES {
            for line in text.lines() {
                let l = line.trim();
                let Some(module) = l
                    .strip_prefix("import ")
                    .or_else(|| l.strip_prefix("from "))
                    .and_then(|rest| rest.split([' ', '.', ',']).next())
                else {
                    continue;
                };
                if module.ends_with("_runner") || module.starts_with("torch_") {
                    assert!(
                        shipped.contains(&format!("{module}.py")),
                        "{file} imports {module}, which is not shipped"
                    );
                    imports += 1;
                }
            }
        }
        assert!(
            imports >= 6,
            "the runners' sibling imports were not found ({imports})"
        );
    }

    #[test]
    fn write_all_writes_every_file() {
        let dir = std::env::temp_dir().join(format!("vramlab-runners-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let main = write_all(&dir, "dist_runner.py").expect("write");
        assert!(main.ends_with("dist_runner.py"));
        for (f, text) in FILES {
            assert_eq!(std::fs::read_to_string(dir.join(f)).expect("read"), text);
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
