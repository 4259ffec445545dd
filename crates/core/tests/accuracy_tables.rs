//! `docs/accuracy.md`'s tables are generated from `tests/data` (vramlab_core::accuracy) and
//! cannot go stale: the committed page must equal the regeneration byte for byte.

use vramlab_core::accuracy::{END, REGENERATE, measured_files, splice, tables};

fn page_path() -> std::path::PathBuf {
    crate::data("../../docs/accuracy.md")
}

fn regenerated(page: &str) -> String {
    // Rows of imported models name their config.json relative to the repository root.
    std::env::set_current_dir(crate::data("..").join("..")).expect("repository root");
    let files = measured_files(std::path::Path::new("tests/data")).expect("every row plans");
    assert!(files.len() >= 25, "only {} measured files", files.len());
    splice(page, &tables(&files))
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
    assert_eq!(new, format!("intro\n{BEGIN}\n\nnew table\n\n{END}\noutro\n"));
    assert_ne!(splice(&new, "old table\n"), Some(new.clone()));
    assert_eq!(splice("no markers", "x"), None);
}
