//! The doctor's snapshot report, byte for byte, for every snapshot under
//! `tests/data/doctor/` (the H200 recordings, the stack-format fixtures and a training loop
//! written by `lab/cpu/make_big_snapshot.py --steps 3`). The `.report.json` files under
//! `tests/data/doctor/golden/` were written by the reader before issue 32's faster one
//! (`VRAMLAB_BLESS=1 cargo test -p vramlab-core --test tests snapshot_golden` writes them
//! again): the report must not change when the reader gets faster.

use vramlab_core::answer::doctor_report::load_snapshot;

fn snapshots() -> Vec<std::path::PathBuf> {
    let dir = crate::data("doctor");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/data/doctor")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".snapshot.pickle"))
        .collect();
    v.sort();
    v
}

#[test]
fn snapshot_reports_equal_the_golden_files() {
    let bless = std::env::var_os("VRAMLAB_BLESS").is_some();
    let files = snapshots();
    assert!(files.len() >= 20, "{} snapshots", files.len());
    let mut differ = Vec::new();
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".snapshot.pickle"))
            .expect("a snapshot name");
        let report = load_snapshot(path, None, &mut |_, _| true).expect("a readable snapshot");
        let json = serde_json::to_string(&report).expect("json") + "\n";
        let golden = crate::data(&format!("doctor/golden/{name}.report.json"));
        if bless {
            std::fs::create_dir_all(golden.parent().expect("golden dir")).expect("mkdir");
            std::fs::write(&golden, &json).expect("write golden");
            continue;
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
        if want != json {
            differ.push(name.to_string());
        }
    }
    assert!(
        differ.is_empty(),
        "reports differ from the golden files: {differ:?}"
    );
}

/// The reader before issue 32 (`doctor::legacy`, a generic tree and string-keyed frames)
/// and the current one type every snapshot identically: the H200 recordings and fixtures
/// as they are, and truncated or with bytes changed (deterministic draws), where both must
/// agree on whether the file reads and, when it does, on every field.
#[test]
fn legacy_and_current_readers_agree_on_every_snapshot() {
    use vramlab_core::doctor::{legacy::read_snapshot_legacy, read_snapshot};
    let typed = |b: &[u8]| {
        let new = read_snapshot(b, &mut |_| true).map(|s| format!("{s:?}"));
        let old = read_snapshot_legacy(b, &mut |_| true).map(|s| format!("{s:?}"));
        (new, old)
    };
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut draw = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n.max(1) as u64) as usize
    };
    let (mut read, mut refused) = (0, 0);
    for path in snapshots() {
        let bytes = std::fs::read(&path).expect("snapshot");
        let mut variants = vec![bytes.clone()];
        for _ in 0..6 {
            variants.push(bytes[..draw(bytes.len())].to_vec());
            let mut b = bytes.clone();
            for _ in 0..1 + draw(4) {
                let at = draw(b.len());
                b[at] = draw(256) as u8;
            }
            variants.push(b);
        }
        for (i, b) in variants.iter().enumerate() {
            match typed(b) {
                (Ok(n), Ok(o)) => {
                    assert!(n == o, "{} variant {i}: the readers differ", path.display());
                    read += 1;
                }
                (Err(_), Err(_)) => refused += 1,
                (n, o) => panic!(
                    "{} variant {i}: current {:?}, legacy {:?}",
                    path.display(),
                    n.err(),
                    o.err()
                ),
            }
        }
    }
    // The unchanged files all read; most truncations do not.
    assert!(
        read >= 24 && refused >= 24,
        "{read} read, {refused} refused"
    );
}
