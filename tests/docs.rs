//! The documentation, checked: every relative link in README.md, ARCHITECTURE.md,
//! CHANGELOG.md, RELIABILITY.md and docs/*.md resolves to a file (and a `#anchor` to a
//! heading of the Markdown file it names), the README stays a front page, and
//! ARCHITECTURE.md names every source file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown files whose links are checked, relative to the repository root.
fn checked_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CHANGELOG.md",
        "RELIABILITY.md",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| Path::new("docs").join(p.file_name().expect("name")))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The text outside fenced code blocks, with inline code spans blanked (links in code are
/// examples, not links).
fn prose(md: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if fenced {
            out.push('\n');
            continue;
        }
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                out.push(' ');
            } else {
                out.push(if in_code { ' ' } else { c });
            }
        }
        out.push('\n');
    }
    out
}

/// Every `](target)` of a Markdown text (links and images), outside code.
fn link_targets(md: &str) -> Vec<String> {
    let text = prose(md);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) => {
                let target = after[..j].split_whitespace().next().unwrap_or("");
                out.push(target.to_string());
                rest = &after[j..];
            }
            None => break,
        }
    }
    out
}

/// GitHub's heading anchor: lower case, letters, digits, `-` and `_` kept, spaces to `-`,
/// everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings (a repeated heading gets `-1`, `-2`, … as on
/// GitHub).
fn anchors(md: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let mut s = base.clone();
        let mut n = 0;
        while !seen.insert(s.clone()) {
            n += 1;
            s = format!("{base}-{n}");
        }
    }
    seen
}

/// The broken relative links of `page` (a path relative to `root`), one message each.
fn broken_links(root: &Path, page: &Path, md: &str) -> Vec<String> {
    let dir = page.parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for target in link_targets(md) {
        if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let file = if path.is_empty() {
            page.to_path_buf()
        } else {
            dir.join(path)
        };
        let full = root.join(&file);
        if !full.exists() {
            broken.push(format!(
                "{}: `{target}`: {} does not exist",
                page.display(),
                file.display()
            ));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        if full.extension().is_none_or(|x| x != "md") {
            continue;
        }
        let text = if path.is_empty() {
            md.to_string()
        } else {
            std::fs::read_to_string(&full).unwrap_or_default()
        };
        if !anchors(&text).contains(anchor) {
            broken.push(format!(
                "{}: `{target}`: no heading with anchor #{anchor} in {}",
                page.display(),
                file.display()
            ));
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let mut broken = Vec::new();
    let mut links = 0;
    for page in checked_pages() {
        let md = std::fs::read_to_string(root.join(&page))
            .unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        links += link_targets(&md).len();
        broken.extend(broken_links(&root, &page, &md));
    }
    assert!(
        links >= 50,
        "only {links} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The checker itself: a missing file, a missing heading and a link inside code.
#[test]
fn the_link_checker_finds_broken_links() {
    let root = root();
    let md = "# Title\n\n## A `code` heading (x|y)\n\nSee [ok](../README.md), [here](#title), \
              [h](#a-code-heading-xy), [gone](missing.md), [bad](#nowhere), \
              [arch](../ARCHITECTURE.md#no-such-heading).\n\n`[not a link](nothing.md)`\n\n\
              ```\n[also not](nothing.md)\n```\n";
    let page = Path::new("docs/README.md");
    let broken = broken_links(&root, page, md);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("missing.md"));
    assert!(broken[1].contains("#nowhere"));
    assert!(broken[2].contains("#no-such-heading"));
    assert_eq!(
        slug("Validation without `torch.no_grad()` (`--step eval|eval-grad`)"),
        "validation-without-torchno_grad---step-evaleval-grad"
    );
}

#[test]
fn the_readme_is_a_front_page() {
    let len = std::fs::read(root().join("README.md"))
        .expect("README.md")
        .len();
    assert!(
        len <= 15 * 1024,
        "README.md is {len} bytes; keep it ≤ 15 KB, move the rest to docs/"
    );
    let pages = checked_pages()
        .iter()
        .filter(|p| p.starts_with("docs"))
        .count();
    assert!(pages >= 6, "only {pages} docs pages");
}

fn rust_files(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(root()).expect("under the root");
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

#[test]
fn architecture_names_every_source_file() {
    let root = root();
    let arch = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    for e in std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .filter_map(|e| e.ok())
    {
        rust_files(&e.path().join("src"), &mut files);
    }
    assert!(
        files.len() >= 100,
        "only {} source files found",
        files.len()
    );
    let missing: Vec<&String> = files
        .iter()
        .filter(|f| !arch.contains(&format!("`{f}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's \"Every file\" list lacks (add one line each):\n{}",
        missing
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The outputs README.md and docs/cli.md show are real: each `$ vramlab …` block is this
/// build's output (a JSON block may be abridged: every field it shows must equal the real one).
#[test]
fn the_readme_outputs_are_this_builds() {
    assert_eq!(
        shown_outputs_are_real("README.md"),
        3,
        "the README shows three real outputs"
    );
    assert_eq!(shown_outputs_are_real("docs/cli.md"), 3);
    assert_eq!(shown_outputs_are_real("docs/inference.md"), 9);
}

/// Checks every `$ vramlab …` block of `page`; returns how many there are.
fn shown_outputs_are_real(page: &str) -> usize {
    let readme = std::fs::read_to_string(root().join(page)).expect(page);
    let mut blocks = 0;
    for block in readme.split("```").skip(1).step_by(2) {
        let block = block.trim_start_matches(|c: char| c.is_alphanumeric());
        let block = block.trim_start_matches('\n');
        let Some(command) = block
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("$ vramlab "))
        else {
            continue;
        };
        blocks += 1;
        let shown: String = block.lines().skip(1).collect::<Vec<_>>().join("\n");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vramlab"))
            .args(command.split_whitespace())
            .current_dir(root())
            .output()
            .expect("run vramlab");
        assert!(out.status.success(), "`vramlab {command}` failed");
        let real = String::from_utf8(out.stdout).expect("utf-8");
        if command.contains("--json") {
            let shown: serde_json::Value = serde_json::from_str(&shown).expect("README JSON");
            let real: serde_json::Value = serde_json::from_str(&real).expect("real JSON");
            for (k, v) in shown.as_object().expect("an object") {
                assert_eq!(
                    Some(v),
                    real.get(k),
                    "{page}'s `vramlab {command}` shows {k} = {v}; this build prints another"
                );
            }
        } else {
            assert_eq!(
                shown.trim_end(),
                real.trim_end(),
                "{page}'s `vramlab {command}` output differs from this build's; paste it again"
            );
        }
    }
    blocks
}
