//! Every export format × fine-tuning mode (full, LoRA, QLoRA) × strategy (one GPU, DDP,
//! ZeRO-1/2/3, FSDP2, torch-zero1) is well-formed: Python parses (`ast.parse` in
//! `python3`), JSON loads, shell lines pass `sh -n`, the accelerate YAML is `key: value`
//! lines. A LoRA / QLoRA plan's trainer-argument formats are refused, not written without
//! the adapters. Without `python3` the test fails (CI installs it in `.ci/run`).

use std::io::Write as _;
use std::process::{Command, Stdio};

use vramlab_core::export::{ExportError, Format, VramlabConfig, render};
use vramlab_core::model::preset::find_builtin;
use vramlab_core::plan::config::{Optimizer, Precision};
use vramlab_core::plan::distributed::{Distributed, Strategy};
use vramlab_core::plan::finetune::{FineTune, FineTuneMode};
use vramlab_core::plan::{Planner, TrainConfig};

enum Kind {
    Python,
    Json,
    Shell,
    Yaml,
}

fn kind(f: Format) -> Kind {
    match f {
        Format::PyTorch | Format::Peft | Format::Fsdp2 => Kind::Python,
        Format::Vramlab | Format::DeepSpeed | Format::HuggingFace | Format::Lightning => Kind::Json,
        Format::Env | Format::Torchrun => Kind::Shell,
        Format::Accelerate => Kind::Yaml,
    }
}

/// The settings each combination is exported under: plain fp32, and bf16 AMP with
/// checkpointing (reentrant on one GPU) and a paged 8-bit optimizer (the branches with
/// extra lines).
fn variants(mode: FineTuneMode, strategy: Strategy) -> Vec<TrainConfig> {
    let distributed = match strategy {
        Strategy::None => Distributed::default(),
        s => Distributed::new(4, s),
    };
    let finetune = FineTune {
        mode,
        ..FineTune::default()
    };
    let plain = TrainConfig {
        batch: 2,
        accum: 4,
        distributed,
        finetune,
        ..TrainConfig::default()
    };
    let busy = TrainConfig {
        precision: Precision::AmpBf16,
        checkpointing: true,
        // Reentrant checkpointing is planned on one GPU only.
        checkpoint_reentrant: strategy == Strategy::None,
        optimizer: Optimizer::PagedAdamW8bit,
        ..plain
    };
    vec![plain, busy]
}

/// Runs `python3` over the sources (a JSON list on stdin); the failures it prints.
fn python_ast_failures(sources: &[(String, String)]) -> String {
    const CHECK: &str = r#"
import ast, json, sys
bad = []
for name, src in json.load(sys.stdin):
    try:
        ast.parse(src)
    except SyntaxError as e:
        bad.append(f"{name}: line {e.lineno}: {e.msg}: {e.text!r}")
print("\n".join(bad))
"#;
    let child = Command::new("python3")
        .args(["-c", CHECK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => panic!(
            "python3 could not be started ({e}): the export check parses every Python export \
             with python3's ast module; install python3 (.ci/run installs it)"
        ),
    };
    let input = serde_json::to_vec(sources).expect("json");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&input)
        .expect("write to python3");
    let out = child.wait_with_output().expect("python3");
    assert!(
        out.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn sh_n(name: &str, text: &str) {
    let mut child = Command::new("sh")
        .arg("-n")
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sh");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to sh");
    let out = child.wait_with_output().expect("sh -n");
    assert!(
        out.status.success(),
        "{name}: sh -n: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn yaml_lines(name: &str, text: &str) {
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (key, _) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("{name}: not a `key: value` line: {line}\n{text}"));
        let key = key.trim_start();
        assert!(
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "{name}: bad key in {line}\n{text}"
        );
    }
}

#[test]
fn every_export_parses() {
    let preset = find_builtin("gpt2").expect("gpt2");
    let mut python = Vec::new();
    let mut checked = 0;
    let mut refused = Vec::new();
    for strategy in Strategy::ALL {
        for mode in FineTuneMode::ALL {
            for (v, cfg) in variants(mode, strategy).into_iter().enumerate() {
                let plan = match Planner::new(&preset, &cfg).and_then(|p| p.plan(cfg.batch)) {
                    Ok(p) => p,
                    Err(e) => {
                        refused.push(format!("{} {} #{v}: {e}", strategy.as_str(), mode.as_str()));
                        continue;
                    }
                };
                let doc =
                    VramlabConfig::new(&preset, false, cfg, "h100", 0.05, Some(&plan)).to_json();
                let formats: Vec<Format> = if strategy == Strategy::None {
                    Format::ALL.to_vec()
                } else {
                    Format::ALL.into_iter().chain(Format::DISTRIBUTED).collect()
                };
                for f in formats {
                    let name = format!(
                        "--format {} --finetune {} --strategy {} (variant {v})",
                        f.as_str(),
                        mode.as_str(),
                        strategy.as_str()
                    );
                    let text = match render(f, &cfg, &plan, &doc, preset.hub_id()) {
                        Ok(t) => t,
                        Err(e @ ExportError::AdaptersNotCarried { .. }) => {
                            assert!(
                                mode.has_adapters()
                                    && matches!(f, Format::HuggingFace | Format::Lightning),
                                "{name}: refused: {e}"
                            );
                            assert!(e.to_string().contains("--format peft"), "{e}");
                            continue;
                        }
                    };
                    assert!(
                        !text.contains("your/model-id"),
                        "{name}: gpt2's id is known\n{text}"
                    );
                    match kind(f) {
                        Kind::Python => python.push((name, text)),
                        Kind::Json => {
                            if let Err(e) = serde_json::from_str::<serde_json::Value>(&text) {
                                panic!("{name}: not JSON: {e}\n{text}");
                            }
                        }
                        Kind::Shell => sh_n(&name, &text),
                        Kind::Yaml => yaml_lines(&name, &text),
                    }
                    checked += 1;
                }
            }
        }
    }
    // Every strategy plans gpt2 in every mode: nothing may be skipped silently.
    assert!(refused.is_empty(), "not planned:\n{}", refused.join("\n"));
    // The checker itself catches the defect it is for (a comment swallowing a parenthesis).
    let broken = "LoraConfig(target_modules=None  # comment, task_type=\"CAUSAL_LM\")\n";
    assert!(!python_ast_failures(&[("broken".into(), broken.into())]).is_empty());
    let bad = python_ast_failures(&python);
    assert!(bad.is_empty(), "Python exports that do not parse:\n{bad}");
    assert!(
        checked > 300 && python.len() > 100,
        "{checked} checked, {} Python",
        python.len()
    );
}
