//! The planner's measured error per mode: how far planned peaks have been from PyTorch's
//! measured peaks, per model family × fine-tuning mode × strategy, in allocated and in
//! reserved bytes.
//!
//! The table is `presets/error_bands.json`, written by code from every measured row in
//! `tests/data/*.jsonl` (`validate::band_rows` replays them through the planner; the ignored
//! test `write_error_bands` writes the file; a normal test recomputes it and fails when the
//! committed file differs, so it is never stale nor edited by hand). The binary embeds it.
//!
//! A plan's band is looked up hierarchically, so every plan finds one: its exact mode
//! (`gpt2/lora/none`), then its fine-tuning mode × strategy over the families that read
//! what it reads ([`Modality`]: `text:*/lora/none`, `image:*/full/none`), then over all
//! families (`*/lora/none`), then every row (`*/*/*`). A level is used when it holds at least
//! [`MIN_ROWS`] rows. A mode with no measured row says so and gets a widened band
//! ([`WIDEN`]).
//!
//! The band is meant for rows nobody measured, so its edges are prediction bounds, not the
//! spread of the rows seen: for exchangeable errors, the next row falls below the k-th least
//! of n rows with probability k / (n + 1). A mode's own worst row is such a bound at a risk
//! of at most 1 in [`RISK`] once the mode has `RISK − 1` rows; a mode with fewer (but at
//! least [`MIN_ROWS`]) keeps its own worst row and is widened to its pool's bound at that
//! risk: the k-th least row of the first coarser level with [`MIN_ROWS`] rows
//! (`text:*/finetune/strategy`, `*/finetune/strategy`, `*/*/*`) with k = ⌊(n + 1) /
//! [`RISK`]⌋, so that k / (n + 1) ≤ 1 / RISK; at least the least row, whose risk is
//! 1 / (n + 1) in a pool of fewer than `RISK − 1` rows ([`Tail`]). The mechanisms behind the misses (the caching
//! allocator's placement, workspaces) are shared across families; eight rows of one family
//! that all came out close say little about the ninth (issue 26's untouched third: a
//! Qwen2.5 LoRA row 12 % under, where the mode's eight rows were within 1 %). The rule's
//! risk, measured out of sample over `tests/data` (each file left out in turn), is checked
//! by `crates/core/tests/error_bands.rs`.
//!
//! The band wraps the estimator: the simulated bytes are unchanged; the verdict ("fits",
//! max batch, `--gpus auto`, the fit search) uses the upper edge of the reserved band.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::distributed::Strategy;
use super::finetune_mode::FineTuneMode;
use crate::units::Bytes;

/// The committed table, embedded as the presets are.
pub const BANDS_JSON: &str = include_str!("../../../../presets/error_bands.json");

/// Rows a level needs before its own band is used (fewer: the next, coarser level). One or
/// two rows give a band as wide as their spread, which says nothing about the next run.
pub const MIN_ROWS: u32 = 3;

/// How much wider than the nearest measured level the band of a mode with no measured row
/// is: its worst under- and over-prediction doubled, and never narrower than the worst of
/// all rows (`*/*/*`).
///
/// Why doubled: issue 26 measured configurations that no file in `tests/data` covers and
/// found errors several times those of the measured sets (LoRA: 0.37 % median on
/// `lora.jsonl`, 11.9 % worst elsewhere; captures on a CPU-only host: 25.6 % worst against
/// 8 % on GPU-host captures). Doubling the nearest measured worst case, with the global worst
/// as a floor, keeps the reserved upper edge above every miss the issue reports (reserved
/// under by at most about a quarter of the measured value) while a measured mode keeps its
/// own, tighter band.
pub const WIDEN: f64 = 2.0;

/// The risk the band's edges are set for: at most one row in `RISK` of a mode's next rows
/// measured beyond an edge, where the rows are exchangeable (order statistics, no fitted
/// factor). A mode's own rows set the band alone once there are `RISK − 1` of them.
pub const RISK: u32 = 40;

/// The key of the level that holds every row.
pub const GLOBAL_KEY: &str = "*/*/*";

/// What a plan's error is measured per: the model family (`hf::family_label`: a builder's
/// family or an imported `model_type`), the fine-tuning mode and the multi-GPU strategy;
/// what the model reads places the family among its like for the level between a family
/// and every family.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ModeKey {
    pub family: String,
    #[serde(skip)]
    pub modality: Modality,
    pub finetune: FineTuneMode,
    pub strategy: Strategy,
}

/// What a model reads (`model::InputSpec`). The planner's misses differ in kind between the
/// two: a language model's are the few largest blocks (the logits and their gradient, a
/// cuBLAS workspace carved from one of them), a vision model's the many mid-sized
/// activations and cuDNN's per-convolution workspaces. A family with few rows is widened to
/// the bounds of the families that read what it reads before those of every family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Modality {
    #[default]
    Text,
    Image,
}

impl Modality {
    /// What `preset` reads.
    pub fn of(preset: &crate::model::Preset) -> Modality {
        if preset.input.is_tokens() {
            Modality::Text
        } else {
            Modality::Image
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Text => "text",
            Modality::Image => "image",
        }
    }
}

impl ModeKey {
    /// `family/finetune/strategy`, e.g. `gpt2/lora/none`.
    pub fn exact(&self) -> String {
        format!(
            "{}/{}/{}",
            self.family,
            self.finetune.as_str(),
            self.strategy.as_str()
        )
    }

    /// `text:*/finetune/strategy`: the same fine-tuning mode and strategy over every family
    /// that reads what this one reads.
    pub fn modal(&self) -> String {
        format!(
            "{}:*/{}/{}",
            self.modality.as_str(),
            self.finetune.as_str(),
            self.strategy.as_str()
        )
    }

    /// `*/finetune/strategy`: the same fine-tuning mode and strategy over every family.
    pub fn coarse(&self) -> String {
        format!("*/{}/{}", self.finetune.as_str(), self.strategy.as_str())
    }
}

/// Signed relative errors of one peak over a set of rows, in percent:
/// (planned − measured) / measured. Negative = the plan was under the measurement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ErrorStats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl ErrorStats {
    /// Median, min and max of `errors` (percent, ascending), rounded to 0.01 % outward: the
    /// minimum down, the maximum up, so the band never becomes narrower by rounding.
    fn of(errors: &[f64]) -> ErrorStats {
        let n = errors.len();
        if n == 0 {
            return ErrorStats {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let median = if n % 2 == 1 {
            errors[n / 2]
        } else {
            (errors[n / 2 - 1] + errors[n / 2]) / 2.0
        };
        ErrorStats {
            median: (median * 100.0).round() / 100.0,
            min: round_down(errors[0]),
            max: round_up(errors[n - 1]),
        }
    }

    /// [`WIDEN`]ed, and at least as wide as `floor`.
    fn widened(self, floor: ErrorStats) -> ErrorStats {
        ErrorStats {
            median: self.median,
            min: (self.min.min(0.0) * WIDEN).min(floor.min),
            max: (self.max.max(0.0) * WIDEN).max(floor.max),
        }
    }

    /// At least as wide as a pool's bounds `tail` (the median stays the mode's own).
    fn pooled(self, tail: Tail) -> ErrorStats {
        ErrorStats {
            median: self.median,
            min: self.min.min(tail.low),
            max: self.max.max(tail.high),
        }
    }

    /// The largest measured value a plan of `planned` bytes has been under: `planned /
    /// (1 + min)` when the plan was ever under the measurement, else `planned` (the band
    /// never makes a verdict less conservative than the estimator).
    pub fn upper(&self, planned: Bytes) -> Bytes {
        let f = self.upper_factor();
        Bytes((planned.0 as f64 * f).ceil() as u64)
    }

    /// The smallest measured value a plan of `planned` bytes has been over: `planned /
    /// (1 + max)` when the plan was ever over the measurement, else `planned`.
    pub fn lower(&self, planned: Bytes) -> Bytes {
        let f = 1.0 + self.max.max(0.0) / 100.0;
        Bytes((planned.0 as f64 / f).floor() as u64)
    }

    /// `1 / (1 + worst under-prediction)`, at least 1: planned bytes times this factor are
    /// the upper edge.
    pub fn upper_factor(&self) -> f64 {
        // An error of −100 % would mean a measured peak with nothing planned; a band that
        // wide is no band, and the divisor is kept positive.
        let keep = (1.0 + self.min.min(0.0) / 100.0).max(0.01);
        1.0 / keep
    }

    /// The bytes a plan may reach so that its upper edge stays within `cap`.
    pub fn cap_for_upper(&self, cap: Bytes) -> Bytes {
        Bytes((cap.0 as f64 / self.upper_factor()).floor() as u64)
    }
}

/// A level's prediction bounds at the risk 1 / [`RISK`]: `low` is the k-th least error and
/// `high` the k-th greatest, with k = ⌊(n + 1) / RISK⌋ (at least 1: the least and greatest
/// rows), so that an exchangeable next row falls below `low` (above `high`) with probability
/// k / (n + 1) ≤ 1 / RISK once n ≥ RISK − 1. Rounded outward to 0.01 %, as [`ErrorStats`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tail {
    pub low: f64,
    pub high: f64,
}

impl Tail {
    /// The bounds of `sorted` (ascending).
    fn of(sorted: &[f64]) -> Tail {
        let n = sorted.len();
        if n == 0 {
            return Tail {
                low: 0.0,
                high: 0.0,
            };
        }
        let k = ((n + 1) / RISK as usize).clamp(1, n);
        Tail {
            low: round_down(sorted[k - 1]),
            high: round_up(sorted[n - k]),
        }
    }
}

/// A lower edge (percent) rounded down to 0.01 %: rounding never narrows a band.
fn round_down(pct: f64) -> f64 {
    (pct * 100.0).floor() / 100.0
}

/// An upper edge (percent) rounded up to 0.01 %.
fn round_up(pct: f64) -> f64 {
    (pct * 100.0).ceil() / 100.0
}

/// The measured error of one level: its rows, the two peaks' errors, their bounds at the
/// band's risk ([`Tail`]) and the files the rows came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeBand {
    pub rows: u32,
    pub allocated: ErrorStats,
    pub reserved: ErrorStats,
    pub allocated_tail: Tail,
    pub reserved_tail: Tail,
    pub files: Vec<String>,
}

/// One measured row as the band generator needs it.
#[derive(Debug, Clone)]
pub struct BandRow {
    /// The file under `tests/data/` it came from.
    pub file: String,
    pub mode: ModeKey,
    /// Percent, (planned − measured) / measured.
    pub allocated_error: f64,
    pub reserved_error: f64,
}

/// `presets/error_bands.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandTable {
    pub about: String,
    pub regenerate: String,
    /// Every file that gave rows, sorted.
    pub sources: Vec<String>,
    /// Exact modes (`gpt2/full/none`), fine-tuning mode × strategy over the families of one
    /// modality (`text:*/lora/none`) and over all (`*/lora/none`), and every row (`*/*/*`).
    pub modes: BTreeMap<String, ModeBand>,
}

impl BandTable {
    /// The table of `rows`: every exact mode, every fine-tuning mode × strategy, and all.
    pub fn from_rows(rows: &[BandRow]) -> BandTable {
        let mut groups: BTreeMap<String, Vec<&BandRow>> = BTreeMap::new();
        for r in rows {
            for key in [
                r.mode.exact(),
                r.mode.modal(),
                r.mode.coarse(),
                GLOBAL_KEY.to_string(),
            ] {
                groups.entry(key).or_default().push(r);
            }
        }
        let modes = groups
            .into_iter()
            .map(|(key, rs)| {
                let mut a: Vec<f64> = rs.iter().map(|r| r.allocated_error).collect();
                let mut v: Vec<f64> = rs.iter().map(|r| r.reserved_error).collect();
                let mut files: Vec<String> = rs.iter().map(|r| r.file.clone()).collect();
                files.sort();
                files.dedup();
                // Sorted once for both the spread and the tails.
                a.sort_by(f64::total_cmp);
                v.sort_by(f64::total_cmp);
                let (allocated, reserved) = (ErrorStats::of(&a), ErrorStats::of(&v));
                let band = ModeBand {
                    rows: u32::try_from(rs.len()).unwrap_or(u32::MAX),
                    allocated,
                    reserved,
                    allocated_tail: Tail::of(&a),
                    reserved_tail: Tail::of(&v),
                    files,
                };
                (key, band)
            })
            .collect();
        let mut sources: Vec<String> = rows.iter().map(|r| r.file.clone()).collect();
        sources.sort();
        sources.dedup();
        BandTable {
            about: "The planner's signed relative error, percent ((planned - measured) / \
                    measured), of peak allocated and peak reserved per mode (family/finetune/\
                    strategy; * = any), over every measured row in tests/data/*.jsonl except \
                    files named *untouched*. Written by code; do not edit."
                .into(),
            regenerate: "cargo test -p vramlab-core --test tests -- --ignored write_error_bands"
                .into(),
            sources,
            modes,
        }
    }

    /// The file's text (pretty JSON and a final newline).
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The embedded table; `None` only when the committed file does not parse (a test
    /// forbids it).
    pub fn builtin() -> Option<&'static BandTable> {
        static TABLE: OnceLock<Option<BandTable>> = OnceLock::new();
        TABLE
            .get_or_init(|| serde_json::from_str(BANDS_JSON).ok())
            .as_ref()
    }

    /// The band of `key`: its own when it has [`MIN_ROWS`] rows (widened to its pool's
    /// [`Tail`] while it has fewer than `RISK − 1`), else the nearest coarser level's
    /// (widened when the mode has no measured row at all).
    pub fn lookup(&self, key: &ModeKey) -> ErrorBand {
        let exact = key.exact();
        let mode_rows = self.modes.get(&exact).map_or(0, |b| b.rows);
        let levels = [
            exact.clone(),
            key.modal(),
            key.coarse(),
            GLOBAL_KEY.to_string(),
        ];
        let level = |k: &String| {
            self.modes
                .get(k)
                .filter(|b| b.rows >= MIN_ROWS)
                .map(|b| (k.clone(), b))
        };
        let used = levels.iter().find_map(level).or_else(|| {
            self.modes
                .get(GLOBAL_KEY)
                .map(|b| (GLOBAL_KEY.to_string(), b))
        });
        let Some((source, band)) = used else {
            return ErrorBand::without_table(exact);
        };
        let mut pooled_with = None;
        let (allocated, reserved) = match self.modes.get(GLOBAL_KEY) {
            Some(g) if mode_rows == 0 => (
                band.allocated.widened(g.allocated),
                band.reserved.widened(g.reserved),
            ),
            _ if source == exact && mode_rows < RISK - 1 => {
                // Too few rows to bound the next one at the band's risk: the pool's bound too.
                match levels[1..].iter().find_map(level) {
                    Some((pool_key, pool)) => {
                        pooled_with = Some(pool_key);
                        (
                            band.allocated.pooled(pool.allocated_tail),
                            band.reserved.pooled(pool.reserved_tail),
                        )
                    }
                    None => (band.allocated, band.reserved),
                }
            }
            _ => (band.allocated, band.reserved),
        };
        ErrorBand {
            mode: exact,
            measured: mode_rows > 0,
            mode_rows,
            source,
            rows: band.rows,
            widened: mode_rows == 0,
            pooled_with,
            allocated,
            reserved,
        }
    }
}

/// The band a plan is shown with, and that its verdict uses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorBand {
    /// The plan's mode, `family/finetune/strategy`.
    pub mode: String,
    /// Whether any measured row has this exact mode.
    pub measured: bool,
    /// Measured rows of this exact mode.
    pub mode_rows: u32,
    /// The level whose rows give the band (`mode` itself, `text:*/finetune/strategy`,
    /// `*/finetune/strategy` or `*/*/*`).
    pub source: String,
    /// Rows of that level.
    pub rows: u32,
    /// Whether the band was widened because the mode has no measured row ([`WIDEN`]).
    pub widened: bool,
    /// The level whose bounds at the band's risk widen the mode's own band, when the mode
    /// has fewer than `RISK − 1` rows ([`Tail`]).
    pub pooled_with: Option<String>,
    pub allocated: ErrorStats,
    pub reserved: ErrorStats,
}

impl ErrorBand {
    /// The band of `key` in the embedded table.
    pub fn of(key: &ModeKey) -> ErrorBand {
        match BandTable::builtin() {
            Some(t) => t.lookup(key),
            None => ErrorBand::without_table(key.exact()),
        }
    }

    /// Only reachable when the embedded table does not parse (a test forbids it): no
    /// measurement, so a band twice the widest miss issue 26 reports (about a third).
    fn without_table(mode: String) -> ErrorBand {
        let wide = ErrorStats {
            median: 0.0,
            min: -50.0,
            max: 50.0,
        };
        ErrorBand {
            mode,
            measured: false,
            mode_rows: 0,
            source: "none".into(),
            rows: 0,
            widened: true,
            pooled_with: None,
            allocated: wide,
            reserved: wide,
        }
    }

    /// What the band rests on, in words: the mode and its measured rows, the pool that
    /// widens it, the coarser level it is taken from, or that no row measured this mode.
    /// The one wording of the CLI's and the GUI's band line ([`crate::answer::Verdict`]) and
    /// of the JSON's `note`.
    pub fn basis(&self) -> String {
        // `pooled_with` is set only on a band of the mode's own rows.
        if !self.measured {
            format!(
                "no measurements for this mode ({}): band of {}, {} rows, widened",
                self.mode, self.source, self.rows
            )
        } else if let Some(pool) = &self.pooled_with {
            format!(
                "{}, {} measured rows, widened to the 1-in-{RISK} bounds of {pool}",
                self.mode, self.rows
            )
        } else if self.source == self.mode {
            format!("{}, {} measured rows", self.mode, self.rows)
        } else {
            format!(
                "{}, {} measured row{} (too few): band of {}, {} rows",
                self.mode,
                self.mode_rows,
                if self.mode_rows == 1 { "" } else { "s" },
                self.source,
                self.rows
            )
        }
    }

    /// [`ErrorBand::basis`] with the errors, in percent.
    pub fn describe(&self) -> String {
        format!(
            "{}; allocated {:+.1} … {:+.1} %, reserved {:+.1} … {:+.1} %",
            self.basis(),
            self.allocated.min,
            self.allocated.max,
            self.reserved.min,
            self.reserved.max
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(family: &str, ft: FineTuneMode, st: Strategy) -> ModeKey {
        ModeKey {
            family: family.into(),
            modality: Modality::Text,
            finetune: ft,
            strategy: st,
        }
    }

    fn row(family: &str, ft: FineTuneMode, a: f64, r: f64) -> BandRow {
        BandRow {
            file: format!("{family}.jsonl"),
            mode: key(family, ft, Strategy::None),
            allocated_error: a,
            reserved_error: r,
        }
    }

    #[test]
    fn levels_and_widening() {
        use FineTuneMode::*;
        let rows = vec![
            row("gpt2", Full, -1.0, -2.0),
            row("gpt2", Full, 1.0, 3.0),
            row("gpt2", Full, 0.5, -0.004),
            row("bert", Full, -4.0, -8.0),
            row("bert", Lora, 2.0, 1.0),
        ];
        let t = BandTable::from_rows(&rows);
        let g = t.lookup(&key("gpt2", Full, Strategy::None));
        assert_eq!(g.source, "gpt2/full/none");
        assert!(g.measured && !g.widened);
        // Three rows are too few to bound the next at 1 in 40: the pool's bounds widen the
        // band (four rows: its least and greatest), the median stays the mode's own.
        assert_eq!(g.pooled_with.as_deref(), Some("text:*/full/none"));
        assert_eq!(
            (g.reserved.min, g.reserved.median, g.reserved.max),
            (-8.0, -0.0, 3.0)
        );
        assert_eq!((g.allocated.min, g.allocated.max), (-4.0, 1.0));
        assert!(
            g.describe()
                .contains("widened to the 1-in-40 bounds of text:*/full/none")
        );
        // Two rows of bert: the coarser level.
        let b = t.lookup(&key("bert", Full, Strategy::None));
        assert_eq!(
            (b.source.as_str(), b.rows, b.mode_rows),
            ("text:*/full/none", 4, 1)
        );
        assert!(b.measured && !b.widened);
        // No rows at all: widened from the global level, at least the global worst.
        let u = t.lookup(&key("vit", Lora, Strategy::Fsdp2));
        assert!(!u.measured && u.widened);
        assert_eq!(u.source, GLOBAL_KEY);
        assert_eq!(u.reserved.min, -16.0);
        assert_eq!(u.reserved.max, 6.0);
        assert!(u.describe().contains("no measurements for this mode"));
        // Rounding is outward.
        let s = ErrorStats::of(&[-0.004, 0.001]);
        assert_eq!((s.min, s.max), (-0.01, 0.01));
        // The JSON round-trips.
        let back: BandTable = serde_json::from_str(&t.to_json()).expect("json");
        assert_eq!(back, t);
    }

    #[test]
    fn a_mode_pools_with_the_families_of_its_modality_first() {
        use FineTuneMode::Full;
        let image = |family: &str, r: f64| BandRow {
            mode: ModeKey {
                modality: Modality::Image,
                ..key(family, Full, Strategy::None)
            },
            ..row(family, Full, 0.0, r)
        };
        let rows = vec![
            row("gpt2", Full, 0.0, -1.0),
            row("gpt2", Full, 0.0, 1.0),
            row("gpt2", Full, 0.0, 0.5),
            row("llama", Full, 0.0, -3.0),
            image("resnet", -1.0),
            image("resnet", 0.2),
            image("resnet", 0.4),
            image("convnext", -20.0),
        ];
        let t = BandTable::from_rows(&rows);
        // GPT-2 (3 rows) is widened by the language models' bound, not the CNN's −20 %.
        let g = t.lookup(&key("gpt2", Full, Strategy::None));
        assert_eq!(g.pooled_with.as_deref(), Some("text:*/full/none"));
        assert_eq!(g.reserved.min, -3.0);
        // A ResNet (3 rows) by the vision models'.
        let r = t.lookup(&ModeKey {
            modality: Modality::Image,
            ..key("resnet", Full, Strategy::None)
        });
        assert_eq!(r.pooled_with.as_deref(), Some("image:*/full/none"));
        assert_eq!(r.reserved.min, -20.0);
        // A vision family with one row takes its modality's band; one with none, widened.
        let c = t.lookup(&ModeKey {
            modality: Modality::Image,
            ..key("convnext", Full, Strategy::None)
        });
        assert_eq!((c.source.as_str(), c.rows), ("image:*/full/none", 4));
        let v = t.lookup(&ModeKey {
            modality: Modality::Image,
            ..key("vit", Full, Strategy::None)
        });
        assert!(v.widened && v.source == "image:*/full/none");
    }

    #[test]
    fn tails_are_the_order_statistics_at_the_risk() {
        // n = 79: k = ⌊80 / 40⌋ = 2, the second least and second greatest.
        let v: Vec<f64> = (0..79).map(|i| f64::from(i) - 39.0).collect();
        assert_eq!(
            Tail::of(&v),
            Tail {
                low: -38.0,
                high: 38.0
            }
        );
        // n = 78: k = 1, the extremes; one row: itself.
        assert_eq!(
            Tail::of(&v[..78]),
            Tail {
                low: -39.0,
                high: 38.0
            }
        );
        assert_eq!(
            Tail::of(&[1.5]),
            Tail {
                low: 1.5,
                high: 1.5
            }
        );
        // A mode with RISK − 1 rows keeps its own band.
        let rows: Vec<BandRow> = (0..RISK - 1)
            .map(|i| row("gpt2", FineTuneMode::Full, 0.0, -f64::from(i) / 100.0))
            .chain([row("bert", FineTuneMode::Full, -9.0, -30.0)])
            .collect();
        let g =
            BandTable::from_rows(&rows).lookup(&key("gpt2", FineTuneMode::Full, Strategy::None));
        assert_eq!((g.pooled_with, g.reserved.min), (None, -0.38));
    }

    #[test]
    fn upper_edge_covers_the_worst_under_prediction() {
        let s = ErrorStats {
            median: 0.0,
            min: -20.0,
            max: 10.0,
        };
        // Planned 80 under by 20 % → measured 100.
        assert_eq!(s.upper(Bytes(80)), Bytes(100));
        assert!(s.lower(Bytes(220)).0.abs_diff(200) <= 1);
        assert_eq!(s.cap_for_upper(Bytes(100)), Bytes(80));
        let over = ErrorStats {
            median: 1.0,
            min: 0.5,
            max: 2.0,
        };
        assert_eq!(over.upper(Bytes(80)), Bytes(80));
    }

    #[test]
    fn the_embedded_table_parses_and_has_every_level() {
        let t = BandTable::builtin().expect("presets/error_bands.json parses");
        assert!(t.modes.contains_key(GLOBAL_KEY));
        assert!(t.sources.iter().all(|f| !f.contains("untouched")));
    }
}
