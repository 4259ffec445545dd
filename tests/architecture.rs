//! The crate boundaries of ARCHITECTURE.md, checked: the core's dependency tree (from
//! Cargo.lock, so it needs no network) holds no GUI, GPU, windowing or dialog crate, and
//! no file of the core names a crate above it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `name -> dependency names` for every package in Cargo.lock.
fn lock_graph() -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(root().join("Cargo.lock")).expect("Cargo.lock");
    let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for block in text.split("[[package]]").skip(1) {
        let mut name = None;
        let mut deps = Vec::new();
        let mut in_deps = false;
        for line in block.lines() {
            let line = line.trim();
            if let Some(v) = line.strip_prefix("name = ") {
                name = Some(v.trim_matches('"').to_string());
            } else if line.starts_with("dependencies = [") {
                in_deps = true;
            } else if in_deps && line == "]" {
                in_deps = false;
            } else if in_deps {
                // `"name"` or `"name version"` (when two versions are locked).
                let dep = line.trim_matches(|c| c == '"' || c == ',');
                let dep = dep.split(' ').next().unwrap_or(dep);
                deps.push(dep.to_string());
            }
        }
        let name = name.expect("package without a name in Cargo.lock");
        graph.entry(name).or_default().extend(deps);
    }
    graph
}

/// Every package reachable from `start` through normal, build and dev dependencies
/// (Cargo.lock does not tell them apart, so this over-approximates the core's tree).
fn reachable(graph: &BTreeMap<String, Vec<String>>, start: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![start.to_string()];
    while let Some(p) = todo.pop() {
        if seen.insert(p.clone()) {
            todo.extend(graph.get(&p).into_iter().flatten().cloned());
        }
    }
    seen
}

const FORBIDDEN_IN_CORE: [&str; 10] = [
    "egui",
    "eframe",
    "egui_plot",
    "egui_kittest",
    "wgpu",
    "winit",
    "cudarc",
    "nvml-wrapper",
    "rfd",
    "vramlab-device",
];

#[test]
fn the_core_depends_on_no_gui_or_gpu_crate() {
    let graph = lock_graph();
    let tree = reachable(&graph, "vramlab-core");
    assert!(tree.len() > 1, "vramlab-core not found in Cargo.lock");
    let bad: Vec<_> = FORBIDDEN_IN_CORE
        .iter()
        .chain(&["vramlab-gui", "vramlab"])
        .filter(|c| tree.contains(**c))
        .collect();
    assert!(bad.is_empty(), "vramlab-core's tree contains {bad:?}");
}

/// Network code lives in `vramlab-hub` (Hub ids), called by the binary and the GUI: the core
/// stays free of HTTP and TLS crates, and the hub crate's download is a feature.
#[test]
fn the_core_depends_on_no_network_crate() {
    let graph = lock_graph();
    let tree = reachable(&graph, "vramlab-core");
    for c in [
        "vramlab-hub",
        "ureq",
        "rustls",
        "hyper",
        "reqwest",
        "webpki-roots",
    ] {
        assert!(!tree.contains(c), "vramlab-core's tree contains {c}");
    }
    let hub = reachable(&graph, "vramlab-hub");
    assert!(hub.contains("ureq"), "the Hub download is ureq's");
    let manifest =
        std::fs::read_to_string(root().join("crates/hub/Cargo.toml")).expect("hub manifest");
    assert!(
        manifest.contains("download = [\"dep:ureq\"]") && manifest.contains("optional = true"),
        "ureq is behind the hub crate's `download` feature"
    );
}

#[test]
fn the_device_crate_depends_on_no_gui_crate() {
    let tree = reachable(&lock_graph(), "vramlab-device");
    for c in ["egui", "eframe", "wgpu", "winit", "rfd", "vramlab-gui"] {
        assert!(!tree.contains(c), "vramlab-device's tree contains {c}");
    }
}

/// The words crate reads what users type into the core's types: over the core only, so the
/// CLI, the GUI and the Python bindings can all stand on it.
#[test]
fn the_words_crate_depends_on_the_core_only() {
    let tree = reachable(&lock_graph(), "vramlab-words");
    assert!(
        tree.contains("vramlab-core"),
        "vramlab-words not found in Cargo.lock"
    );
    let bad: Vec<_> = FORBIDDEN_IN_CORE
        .iter()
        .chain(&[
            "vramlab-gui",
            "vramlab",
            "vramlab-hub",
            "vramlab-python",
            "pyo3",
            "clap",
        ])
        .filter(|c| tree.contains(**c))
        .collect();
    assert!(bad.is_empty(), "vramlab-words' tree contains {bad:?}");
}

/// The Python bindings are the core behind a Python API: no GUI, GPU or Hub crate, and not
/// the binary (the words they read are `vramlab-words`', as the CLI's are). (anyhow is a
/// dev-dependency of the core: Cargo.lock does not tell those apart.)
#[test]
fn the_python_bindings_depend_on_the_core_only() {
    let tree = reachable(&lock_graph(), "vramlab-python");
    assert!(
        tree.contains("pyo3"),
        "vramlab-python not found in Cargo.lock"
    );
    assert!(tree.contains("vramlab-core") && tree.contains("vramlab-words"));
    let bad: Vec<_> = FORBIDDEN_IN_CORE
        .iter()
        .chain(&["vramlab-gui", "vramlab", "vramlab-hub", "clap"])
        .filter(|c| tree.contains(**c))
        .collect();
    assert!(bad.is_empty(), "vramlab-python's tree contains {bad:?}");
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_core_file_names_a_crate_above_it() {
    let mut files = Vec::new();
    rust_files(&root().join("crates/core/src"), &mut files);
    assert!(files.len() > 20);
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        // Paths, not words: a label may say "cudarc" (the native engine's name).
        for needle in [
            "vramlab_device",
            "vramlab_gui",
            "vramlab_hub",
            "vramlab_words",
            "ureq::",
            "egui::",
            "egui_plot::",
            "eframe::",
            "cudarc::",
            "nvml_wrapper::",
            "rfd::",
            "wgpu::",
            "winit::",
        ] {
            let hit = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .any(|l| l.contains(needle));
            assert!(!hit, "{} names `{needle}`", f.display());
        }
    }
}
