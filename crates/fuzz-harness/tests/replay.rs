//! Every input the fuzzers kept (`fuzz/corpus/<target>/`) and every crash they ever found
//! (`fuzz/artifacts/<target>/`, once fixed) replayed through the fuzz targets' bodies: the
//! fuzzers' findings stay fixed in an ordinary `cargo test`, without cargo-fuzz or nightly.

use std::path::Path;

use vramlab_fuzz_harness::TARGETS;

fn inputs(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_input_and_past_crash_replays_without_a_panic() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    let mut total = 0;
    for (name, target) in TARGETS {
        let mut files = inputs(&fuzz.join("corpus").join(name));
        assert!(!files.is_empty(), "fuzz/corpus/{name} is empty or missing");
        files.extend(inputs(&fuzz.join("artifacts").join(name)));
        for f in &files {
            let data = std::fs::read(f).expect("read corpus file");
            let outcome = std::panic::catch_unwind(|| target(&data));
            assert!(outcome.is_ok(), "{name}: {} panics", f.display());
        }
        println!("{name}: {} inputs", files.len());
        total += files.len();
    }
    assert!(total > 100, "only {total} corpus inputs");
}
