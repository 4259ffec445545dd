//! `docs/accuracy.md`'s tables are generated from `tests/data` (vramlab_core::accuracy) and
//! cannot go stale: the committed page must equal the regeneration byte for byte.

use std::sync::OnceLock;

use vramlab_core::accuracy::{
    END, MeasuredFile, REGENERATE, measured_files, overall, splice, tables,
};

fn page_path() -> std::path::PathBuf {
    crate::data("../../docs/accuracy.md")
}

/// Every measured file, replayed once per test binary.
fn files() -> &'static [MeasuredFile] {
    static FILES: OnceLock<Vec<MeasuredFile>> = OnceLock::new();
    FILES.get_or_init(|| {
        // Rows of imported models name their config.json relative to the repository root.
        std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
        let files = measured_files(std::path::Path::new("tests/data")).expect("every row plans");
        assert!(files.len() >= 25, "only {} measured files", files.len());
        files
    })
}

fn regenerated(page: &str) -> String {
    splice(page, &tables(files()))
        .unwrap_or_else(|| panic!("docs/accuracy.md lacks the accuracy markers (… {END})"))
}

/// Rewrites the generated part of `docs/accuracy.md` (after adding measured rows or
/// changing the estimator).
#[test]
#[ignore = "writes docs/accuracy.md"]
fn write_accuracy_tables() {
    let page = std::fs::read_to_string(page_path()).expect("docs/accuracy.md");
    std::fs::write(page_path(), regenerated(&page)).expect("write docs/accuracy.md");
}

#[test]
fn committed_accuracy_tables_equal_those_regenerated_from_tests_data() {
    let page = std::fs::read_to_string(page_path()).expect("docs/accuracy.md");
    let fresh = regenerated(&page);
    if page != fresh {
        let line = page
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .map_or(page.lines().count().min(fresh.lines().count()), |i| i);
        panic!(
            "docs/accuracy.md's tables differ from tests/data (first at line {}): regenerate them with `{REGENERATE}`",
            line + 1
        );
    }
}

/// The splice replaces only the text between the markers, so a stale table is caught.
#[test]
fn splice_replaces_only_between_the_markers() {
    use vramlab_core::accuracy::BEGIN;
    let page = format!("intro\n{BEGIN}\n\nold table\n{END}\noutro\n");
    let new = splice(&page, "new table\n").expect("markers");
    assert_eq!(
        new,
        format!("intro\n{BEGIN}\n\nnew table\n\n{END}\noutro\n")
    );
    assert_ne!(splice(&new, "old table\n"), Some(new.clone()));
    assert_eq!(splice("no markers", "x"), None);
}

/// The README's one accuracy sentence is the generated overall summary.
#[test]
fn readme_quotes_the_generated_overall_summary() {
    let readme = std::fs::read_to_string(crate::data("../../README.md")).expect("README.md");
    let line = overall(files());
    assert!(
        readme.contains(&line),
        "README.md's accuracy summary differs from tests/data; paste this line into its Accuracy section: {line}"
    );
}
