//! Bench results out and in: a [`Run`] as JSON (the full record, opened again by the
//! GUI) and as CSV (one row per trial, measured and predicted columns, for a
//! spreadsheet). Pure functions; the file write is [`crate::fsutil::write_atomic`].

use std::fmt::Write as _;

use crate::record::{RUN_SCHEMA_VERSION, Run, Trial};
use crate::units::Bytes;

/// Largest run file accepted (timelines make runs bigger than plans, but not this big).
pub const MAX_RUN_BYTES: usize = 64 << 20;

/// Device memory a trial may leave behind and still count as "returned to baseline".
pub const RETURN_TOLERANCE: Bytes = Bytes(8 << 20);

/// A run file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum RunFileError {
    #[error("not a vramlab run: {0}")]
    Malformed(String),
    #[error(
        "schema_version {found} is newer than this vramlab understands ({RUN_SCHEMA_VERSION}); update vramlab"
    )]
    TooNew { found: u64 },
    #[error("the file is larger than {MAX_RUN_BYTES} bytes")]
    TooLarge,
}

/// The run, pretty-printed JSON (what [`run_from_json`] reads).
pub fn run_to_json(run: &Run) -> String {
    serde_json::to_string_pretty(run).unwrap_or_default()
}

/// Parses a saved run; errors name the field (`trials[2].batch: invalid type …`).
pub fn run_from_json(bytes: &[u8]) -> Result<Run, RunFileError> {
    if bytes.len() > MAX_RUN_BYTES {
        return Err(RunFileError::TooLarge);
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| RunFileError::Malformed(format!("not UTF-8 text ({e})")))?;
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| RunFileError::Malformed(format!("not valid JSON: {e}")))?;
    let found = v
        .get("schema_version")
        .ok_or_else(|| RunFileError::Malformed("missing field `schema_version`".into()))?
        .as_u64()
        .ok_or_else(|| {
            RunFileError::Malformed("schema_version must be a positive integer".into())
        })?;
    if found > u64::from(RUN_SCHEMA_VERSION) {
        return Err(RunFileError::TooNew { found });
    }
    serde_path_to_error::deserialize(v)
        .map_err(|e| RunFileError::Malformed(format!("{}: {}", e.path(), e.inner())))
}

/// The CSV header of [`run_to_csv`].
pub const CSV_COLUMNS: [&str; 28] = [
    "trial",
    "batch",
    "outcome",
    "message",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "process_bytes",
    "device_used_peak_bytes",
    "predicted_allocated_bytes",
    "predicted_reserved_bytes",
    "predicted_nvidia_smi_bytes",
    "error_allocated_pct",
    "error_reserved_pct",
    "error_nvidia_smi_pct",
    "step_ms",
    "flops_per_step",
    "tflops",
    "baseline_before_bytes",
    "baseline_after_bytes",
    "memory_returned",
    "timeline_samples",
    "world_mode",
    "world_size",
    "ranks_reported",
    "max_rank_peak_allocated_bytes",
    "max_rank_peak_reserved_bytes",
    "rank_peak_allocated_bytes",
    "rank_peak_reserved_bytes",
];

/// One row per trial under a header ([`CSV_COLUMNS`]); empty cells where nothing was
/// measured. Byte columns are exact integers, so a spreadsheet can convert the units.
pub fn run_to_csv(run: &Run) -> String {
    let mut out = CSV_COLUMNS.join(",");
    out.push('\n');
    for t in &run.trials {
        let row = trial_row(t);
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

fn trial_row(t: &Trial) -> Vec<String> {
    let bytes = |b: Option<Bytes>| b.map(|b| b.0.to_string()).unwrap_or_default();
    let float = |f: Option<f64>, decimals: usize| {
        f.filter(|f| f.is_finite())
            .map(|f| format!("{f:.decimals$}"))
            .unwrap_or_default()
    };
    let message = match &t.outcome {
        crate::record::Outcome::Oom { message } | crate::record::Outcome::Error { message } => {
            message.as_str()
        }
        _ => "",
    };
    let e = t.errors_pct();
    let p = t.predicted;
    vec![
        t.index.to_string(),
        t.batch.to_string(),
        t.outcome.label().to_string(),
        csv_field(message),
        bytes(t.peak_allocated),
        bytes(t.peak_reserved),
        bytes(t.process_bytes),
        bytes(t.device_used_peak),
        bytes(p.map(|p| p.allocated)),
        bytes(p.map(|p| p.reserved)),
        bytes(p.map(|p| p.nvidia_smi)),
        float(e.allocated, 2),
        float(e.reserved, 2),
        float(e.nvidia_smi, 2),
        float(t.step_ms, 3),
        float(t.flops_per_step, 0),
        float(t.tflops, 2),
        bytes(t.baseline_before),
        bytes(t.baseline_after),
        t.memory_returned(RETURN_TOLERANCE)
            .map(|r| r.to_string())
            .unwrap_or_default(),
        t.timeline.len().to_string(),
        t.world
            .as_ref()
            .map(|w| w.mode.as_str().to_string())
            .unwrap_or_default(),
        t.world
            .as_ref()
            .map(|w| w.size.to_string())
            .unwrap_or_default(),
        t.ranks.len().to_string(),
        bytes(t.max_rank_allocated()),
        bytes(t.max_rank_reserved()),
        rank_list(t, |r| r.peak_allocated),
        rank_list(t, |r| r.peak_reserved),
    ]
}

/// One byte figure per rank in rank order, `;`-separated (an empty item where the rank
/// did not report it).
fn rank_list(t: &Trial, field: impl Fn(&crate::record::RankPeak) -> Option<Bytes>) -> String {
    t.ranks
        .iter()
        .map(|r| field(r).map(|b| b.0.to_string()).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(";")
}

/// Quotes a field when it holds a comma, quote or line break (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        let mut q = String::with_capacity(s.len() + 2);
        q.push('"');
        for c in s.chars() {
            if c == '"' {
                q.push('"');
            }
            q.push(c);
        }
        q.push('"');
        q
    } else {
        s.to_string()
    }
}

/// A file name for the run: `gpt2-native-b4-16.json` (extension without the dot).
pub fn suggested_run_name(run: &Run, ext: &str) -> String {
    let mut name = String::new();
    let model: String = run
        .model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let _ = write!(name, "{model}-{}", run.engine.as_str());
    let lo = run.trials.iter().map(|t| t.batch).min();
    let hi = run.trials.iter().map(|t| t.batch).max();
    if let (Some(lo), Some(hi)) = (lo, hi) {
        let _ = write!(name, "-b{lo}-{hi}");
    }
    let _ = write!(name, ".run.{ext}");
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::TrainConfig;
    use crate::record::{DeviceInfo, EngineKind, MemSample, Outcome, Predicted};

    fn trial(index: u32, batch: u64, outcome: Outcome) -> Trial {
        let mut t = Trial::failed(index, batch, outcome);
        t.predicted = Some(Predicted {
            allocated: Bytes((batch * 100) << 20),
            reserved: Bytes((batch * 110) << 20),
            nvidia_smi: Bytes((batch * 110 + 500) << 20),
        });
        if t.outcome.ran() {
            t.peak_allocated = Some(Bytes((batch * 105) << 20));
            t.peak_reserved = Some(Bytes((batch * 110) << 20));
            t.process_bytes = Some(Bytes((batch * 110 + 700) << 20));
            t.baseline_before = Some(Bytes(1 << 30));
            t.baseline_after = Some(Bytes(1 << 30));
            t.step_ms = Some(12.5);
            t.tflops = Some(310.25);
            t.timeline = vec![MemSample {
                t_ms: 0.0,
                event: Some(0),
                measured: Bytes(1 << 20),
                predicted_allocated: Some(Bytes(1 << 20)),
                predicted_reserved: None,
                label: "forward".into(),
            }];
        }
        t
    }

    fn run() -> Run {
        Run {
            schema_version: RUN_SCHEMA_VERSION,
            engine: EngineKind::Native,
            device: DeviceInfo {
                name: "NVIDIA H200".into(),
                total_bytes: Bytes(140 << 30),
                ..DeviceInfo::default()
            },
            model: "gpt2".into(),
            config: TrainConfig::default(),
            size: 1024,
            started_unix: 1_700_000_000,
            vramlab_version: "0.1.0".into(),
            predicted_max_batch: Some(8),
            trials: vec![
                trial(0, 4, Outcome::Ran),
                trial(1, 8, Outcome::Ran),
                trial(
                    2,
                    16,
                    Outcome::Oom {
                        message: "CUDA out of memory, tried to allocate \"2 GiB\"".into(),
                    },
                ),
            ],
            stopped: None,
            inference: None,
        }
    }

    #[test]
    fn json_round_trips() {
        let r = run();
        let back = run_from_json(run_to_json(&r).as_bytes()).expect("parses");
        assert_eq!(back, r);
    }

    #[test]
    fn csv_has_a_header_and_one_row_per_trial() {
        let csv = run_to_csv(&run());
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], CSV_COLUMNS.join(","));
        let row: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(row.len(), CSV_COLUMNS.len());
        assert_eq!(row[1], "4");
        assert_eq!(row[2], "ran");
        assert_eq!(row[4], (420u64 << 20).to_string());
        // predicted 400 MiB vs measured 420 MiB
        assert_eq!(row[11], "-4.76");
        assert_eq!(row[19], "true");
        // The OOM message holds a comma and quotes: one quoted field.
        assert!(
            lines[3].contains("\"CUDA out of memory, tried to allocate \"\"2 GiB\"\"\""),
            "{}",
            lines[3]
        );
        assert!(lines[3].contains(",OOM,"));
        // One GPU: no world, no ranks, the max over ranks is rank 0's (the headline).
        assert_eq!(row[21], "");
        assert_eq!(row[23], "0");
        assert_eq!(row[24], row[4]);
    }

    #[test]
    fn csv_and_json_carry_every_rank() {
        use crate::record::{RankPeak, WorldMode, WorldRun};
        let mut r = run();
        let t = &mut r.trials[0];
        t.world = Some(WorldRun {
            mode: WorldMode::Torchrun,
            size: 2,
            strategy: "ddp".into(),
        });
        t.ranks = (0..2)
            .map(|rank| RankPeak {
                rank,
                peak_allocated: Some(Bytes(100 + u64::from(rank))),
                peak_reserved: Some(Bytes(200 + u64::from(rank))),
                nvml_used: None,
                oom: false,
            })
            .collect();
        let back = run_from_json(run_to_json(&r).as_bytes()).expect("parses");
        assert_eq!(back, r);
        let csv = run_to_csv(&r);
        let row: Vec<&str> = csv.lines().nth(1).expect("row").split(',').collect();
        assert_eq!(row.len(), CSV_COLUMNS.len());
        assert_eq!(
            &row[21..],
            ["torchrun", "2", "2", "101", "201", "100;101", "200;201"]
        );
    }

    #[test]
    fn bad_run_files_name_the_field() {
        let ok = run_to_json(&run());
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![0xff, 0xfe], "UTF-8"),
            (b"[".to_vec(), "not valid JSON"),
            (b"{}".to_vec(), "schema_version"),
            (
                ok.replace("\"schema_version\": 1", "\"schema_version\": 9")
                    .into_bytes(),
                "newer",
            ),
            (
                ok.replace("\"batch\": 16", "\"batch\": \"many\"")
                    .into_bytes(),
                "trials[2].batch",
            ),
            (
                ok.replace("\"engine\": \"native\"", "\"engine\": \"tpu\"")
                    .into_bytes(),
                "engine",
            ),
            (vec![b' '; MAX_RUN_BYTES + 1], "larger"),
        ];
        for (bytes, needle) in cases {
            let err = run_from_json(&bytes).expect_err(needle).to_string();
            assert!(err.contains(needle), "{err:?} lacks {needle:?}");
        }
    }

    #[test]
    fn file_names_are_safe() {
        let mut r = run();
        r.model = "my/model v2".into();
        assert_eq!(
            suggested_run_name(&r, "csv"),
            "my_model_v2-native-b4-16.run.csv"
        );
    }
}
