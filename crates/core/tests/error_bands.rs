//! The planner's measured error bands (`presets/error_bands.json`): computed by code from
//! every measured row in `tests/data/*.jsonl`, never typed in, never stale; and a verdict
//! that cannot lie on any of those rows.

use std::sync::OnceLock;

use vramlab_core::plan::band::{BandTable, ErrorBand};
use vramlab_core::plan::search::Budget;
use vramlab_core::units::Bytes;
use vramlab_core::validate::{Row, band_rows, replay_dir};

/// Every measured row, replayed once per test binary.
fn replayed() -> &'static [(String, Row)] {
    static ROWS: OnceLock<Vec<(String, Row)>> = OnceLock::new();
    ROWS.get_or_init(|| {
        // Rows of imported models name their config.json relative to the repository root.
        std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
        replay_dir(std::path::Path::new("tests/data")).expect("every measured row plans")
    })
}

fn bands_path() -> std::path::PathBuf {
    crate::data("../../presets/error_bands.json")
}

fn computed() -> BandTable {
    BandTable::from_rows(&band_rows(replayed()))
}

/// Writes `presets/error_bands.json` from `tests/data` (run after adding measured rows or
/// changing the estimator).
#[test]
#[ignore = "writes presets/error_bands.json"]
fn write_error_bands() {
    let t = computed();
    std::fs::write(bands_path(), t.to_json()).expect("write error_bands.json");
    for (k, b) in &t.modes {
        println!(
            "{k:<40} {:>4} rows  alloc {:+6.2} (med {:+6.2}) {:+6.2}  reserved {:+6.2} (med {:+6.2}) {:+6.2}",
            b.rows,
            b.allocated.min,
            b.allocated.median,
            b.allocated.max,
            b.reserved.min,
            b.reserved.median,
            b.reserved.max
        );
    }
}

/// The committed (and embedded) table is exactly what `tests/data` gives today.
#[test]
fn committed_error_bands_equal_those_recomputed_from_tests_data() {
    let t = computed();
    let committed = std::fs::read_to_string(bands_path()).expect("presets/error_bands.json");
    assert!(
        committed == t.to_json(),
        "presets/error_bands.json is stale or was edited by hand; regenerate it: {}",
        t.regenerate
    );
    assert_eq!(BandTable::builtin(), Some(&t));
    assert!(t.sources.iter().any(|f| f.contains("holdout")));
    assert!(t.sources.iter().all(|f| !f.contains("untouched")));
    assert!(t.sources.len() >= 20, "{:?}", t.sources);
}

/// The never-lies check: for every measured row, the measured peak reserved is within the
/// upper edge of the band its plan is shown with, so a plan that "fits at margin m" (its
/// upper edge plus the CUDA context within the card's capacity less m) never measured above
/// the capacity less m.
#[test]
fn no_measured_row_is_above_the_upper_edge_of_its_band() {
    let rows = replayed();
    assert!(rows.len() >= 700, "only {} measured rows", rows.len());
    let mut worst = 0.0f64;
    for (file, r) in rows {
        let mode = r.mode.as_ref().expect("mode");
        let band = ErrorBand::of(mode);
        let planned = Bytes(r.predicted_reserved);
        let upper = band.reserved.upper(planned);
        let measured = Bytes(r.measured_reserved);
        assert!(
            measured <= upper,
            "{file} {} {}: measured reserved {measured} above the band's upper edge {upper} ({})",
            r.model,
            r.config,
            band.describe()
        );
        assert!(Bytes(r.measured_allocated) <= band.allocated.upper(Bytes(r.predicted_allocated)));
        let context = Bytes(r.predicted_nvml - r.predicted_reserved);
        for margin in [0.0, 0.05, 0.1, 0.2] {
            // The smallest card on which this plan fits at this margin.
            let need = upper.0 + context.0;
            let capacity = Bytes((need as f64 / (1.0 - margin)).ceil() as u64 + 1);
            let budget = Budget { capacity, margin };
            assert!(
                upper <= budget.allocator_cap(context),
                "{file} {}",
                r.config
            );
            assert!(
                measured.0 + context.0 <= budget.usable().0,
                "{file} {} {}: fits at margin {margin} yet measured above it",
                r.model,
                r.config
            );
        }
        worst = worst.max(100.0 * (upper.0 as f64 / measured.0 as f64 - 1.0));
    }
    println!(
        "{} rows; the widest upper edge is {worst:.1} % above its measurement",
        rows.len()
    );
}
