//! The accuracy tables of `docs/accuracy.md`, computed from the measured files in
//! `tests/data/` with [`crate::validate`]: one row per file (with the device, driver and
//! PyTorch it was measured on), the built-in presets' sets by family, the imported
//! `config.json` rows by `model_type`. A test compares the committed page with this text.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use crate::validate::{Row, ValidateError, compare, max_abs, median_abs, parse_lines, summary};

/// The marker lines around the generated text in `docs/accuracy.md`.
pub const BEGIN: &str = "<!-- accuracy:begin (generated: do not edit by hand) -->";
pub const END: &str = "<!-- accuracy:end -->";

/// The command that rewrites the generated text.
pub const REGENERATE: &str =
    "cargo test -p vramlab-core --test tests -- --ignored write_accuracy_tables";

/// One measured file: its rows replayed through the planner and where it was measured.
pub struct MeasuredFile {
    pub name: String,
    pub rows: Vec<Row>,
    /// Distinct `device · driver · torch` of its rows, sorted.
    pub provenance: BTreeSet<String>,
}

/// Every `*.jsonl` file of `dir` that holds measured training steps, sorted by name. Paths
/// inside rows are relative to the repository root, the working directory this runs in.
pub fn measured_files(dir: &Path) -> Result<Vec<MeasuredFile>, ValidateError> {
    let io = |e: std::io::Error| ValidateError::ModelFile {
        path: dir.display().to_string(),
        message: e.to_string(),
    };
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for name in names {
        let text = std::fs::read_to_string(dir.join(&name)).map_err(io)?;
        let measured: Vec<_> = parse_lines(&text)
            .into_iter()
            .filter(|m| m.usable())
            .collect();
        if measured.is_empty() {
            continue;
        }
        let provenance = text.lines().filter_map(provenance).collect();
        out.push(MeasuredFile {
            rows: compare(&measured)?,
            name,
            provenance,
        });
    }
    Ok(out)
}

/// "device · driver · torch" of one measured line (runner rows keep them under
/// `versions`, capture rows at the top level).
fn provenance(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    v.get("peak_allocated")?;
    let field = |k: &str| {
        v.get("versions")
            .and_then(|s| s.get(k))
            .or_else(|| v.get(k))
            .and_then(|x| x.as_str())
    };
    let device = field("device_name").or_else(|| field("device"))?;
    let mut s = device.to_string();
    for part in [field("driver"), field("torch")].into_iter().flatten() {
        s.push_str(" · ");
        s.push_str(part);
    }
    Some(s)
}

const HEAD: &str =
    "| rows | allocated median \\|error\\| | worst | reserved median \\|error\\| | worst |";
const RULE: &str = "|---:|---:|---:|---:|---:|";

/// "| n | a % | b % | c % | d % |" over `rows`.
fn cells<'a>(rows: impl Iterator<Item = &'a Row> + Clone) -> String {
    format!(
        "| {} | {:.2} % | {:.2} % | {:.2} % | {:.2} % |",
        rows.clone().count(),
        median_abs(rows.clone().map(Row::allocated_error)),
        max_abs(rows.clone().map(Row::allocated_error)),
        median_abs(rows.clone().map(Row::reserved_error)),
        max_abs(rows.map(Row::reserved_error)),
    )
}

/// Rows of `files` whose name passes `keep`, grouped by family label, as a table.
fn by_family(files: &[MeasuredFile], keep: impl Fn(&str) -> bool, label: &str) -> String {
    let rows: Vec<&Row> = files
        .iter()
        .filter(|f| keep(&f.name))
        .flat_map(|f| &f.rows)
        .collect();
    let families: BTreeSet<&str> = rows.iter().map(|r| r.family.as_str()).collect();
    let mut s = format!("| {label} {HEAD}\n|---{RULE}\n");
    for fam in families {
        let of = rows.iter().copied().filter(|r| r.family == fam);
        let _ = writeln!(s, "| {fam} {}", cells(of));
    }
    let _ = writeln!(s, "| **all** {}", cells(rows.iter().copied()));
    s
}

/// The summary over every file but the untouched ones (the README quotes it).
pub fn overall(files: &[MeasuredFile]) -> String {
    let all: Vec<Row> = files
        .iter()
        .filter(|f| crate::validate::feeds_bands(&f.name))
        .flat_map(|f| f.rows.iter().cloned())
        .collect();
    summary(&all)
}

/// The built-in presets' calibration and holdout sets.
fn preset_set(name: &str) -> bool {
    name.starts_with("calibration") || name.starts_with("holdout")
}

/// The generated text between [`BEGIN`] and [`END`] (markers excluded).
pub fn tables(files: &[MeasuredFile]) -> String {
    let mut s = String::from("### Every measured file\n\n");
    s.push_str(
        "Predicted − measured, relative to measured; `untouched` files never feed the error bands.\n\n",
    );
    let _ = writeln!(s, "| file {HEAD} measured on (device · driver · PyTorch) |");
    let _ = writeln!(s, "|---{RULE}---|");
    for f in files {
        let prov: Vec<&str> = f.provenance.iter().map(String::as_str).collect();
        let _ = writeln!(
            s,
            "| `tests/data/{}` {} {} |",
            f.name,
            cells(f.rows.iter()),
            prov.join("; ")
        );
    }
    let _ = write!(
        s,
        "\nAll files but the untouched ones: {}.\n\n",
        overall(files)
    );
    s.push_str("### Built-in presets by family (`calibration.jsonl`, `holdout*.jsonl`)\n\n");
    s.push_str(&by_family(files, preset_set, "family"));
    s.push_str("\n### Imported `config.json` models by `model_type` (`hf_import*.jsonl`)\n\n");
    s.push_str(&by_family(
        files,
        |n| n.starts_with("hf_import"),
        "`model_type`",
    ));
    s
}

/// `page` with the text between its markers replaced by `generated`; `None` when a marker
/// is missing.
pub fn splice(page: &str, generated: &str) -> Option<String> {
    let b = page.find(BEGIN)? + BEGIN.len();
    let e = page[b..].find(END)? + b;
    Some(format!("{}\n\n{generated}\n{}", &page[..b], &page[e..]))
}
