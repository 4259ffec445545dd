//! `bench` refusals that need no GPU: worlds it cannot run, DeepSpeed missing, inference
//! calls (`--step generate|prefill`) the engines cannot run, a Python without PyTorch.

use super::{fails_with, vramlab};
#[cfg(unix)]
use vramlab_device::testing::write_executable;

/// A multi-GPU bench the engines cannot run is refused before anything starts (no GPU
/// needed), saying what to do instead.
#[test]
fn bench_refuses_worlds_it_cannot_run() {
    let base = ["bench", "--model", "gpt2", "--batch", "4"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra.iter()).copied().collect()
    };
    fails_with(
        &with(&["--gpus", "4", "--strategy", "fsdp2", "--engine", "native"]),
        "the native engine runs one GPU; use --engine torch",
    );
    let multi = with(&[
        "--gpus",
        "4",
        "--nodes",
        "2",
        "--strategy",
        "ddp",
        "--engine",
        "torch",
    ]);
    fails_with(
        &multi,
        "python -m torch.distributed.run --nnodes 2 --nproc_per_node 4",
    );
    fails_with(&multi, "\"strategy\":\"ddp\"");
    fails_with(
        &with(&["--gpus", "2", "--strategy", "zero3", "--engine", "torch"]),
        "DeepSpeed",
    );
    fails_with(
        &with(&[
            "--gpus",
            "2",
            "--strategy",
            "fsdp2",
            "--offload",
            "optimizer",
            "--engine",
            "torch",
        ]),
        "--offload optimizer",
    );
}

/// DeepSpeed's stages go to the DeepSpeed runner: a Python without DeepSpeed is refused
/// before anything starts, saying how to install it; offload is no longer refused under
/// DeepSpeed; its own limits are (no GPU needed: a fake Python answers).
#[cfg(unix)]
#[test]
fn bench_deepspeed_needs_deepspeed_in_the_python() {
    let dir = std::env::temp_dir().join(format!("vramlab-cli-ds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let python = dir.join("python");
    write_executable(
        &python,
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'deepspeed'\" >&2\nexit 1\n",
    )
    .expect("fake python");
    let py = python.display().to_string();
    let base = [
        "bench", "--model", "gpt2", "--batch", "4", "--engine", "torch",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter()
            .chain(extra.iter())
            .map(|s| s.to_string())
            .chain(["--python".to_string(), py.clone()])
            .collect()
    };
    let run = |args: Vec<String>, needle: &str| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&refs, needle);
    };
    for s in ["zero1", "zero2", "zero3"] {
        run(
            with(&["--gpus", "2", "--strategy", s]),
            "DeepSpeed is not importable in",
        );
    }
    run(
        with(&["--gpus", "2", "--strategy", "zero2"]),
        "-m pip install deepspeed",
    );
    run(
        with(&[
            "--gpus",
            "4",
            "--strategy",
            "zero3",
            "--offload",
            "optimizer",
        ]),
        "No module named 'deepspeed'",
    );
    run(
        with(&["--gpus", "2", "--strategy", "zero2", "--optimizer", "sgd"]),
        "--optimizer sgd",
    );
    // FSDP2 still refuses offload, and does not ask for DeepSpeed.
    let (ok, _, err) = vramlab(
        &with(&[
            "--gpus",
            "2",
            "--strategy",
            "fsdp2",
            "--offload",
            "optimizer",
        ])
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert!(
        !ok && err.contains("DeepSpeed only") && !err.contains("not importable"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An inference bench (issue 29) refuses what it cannot run before anything starts, naming
/// the flag; a Python without PyTorch fails with the reason, as the training bench does.
#[cfg(unix)]
#[test]
fn bench_refuses_inference_it_cannot_run() {
    let qwen = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/hf_configs/Qwen2.5-0.5B.json"
    );
    let base = [
        "bench",
        "--model",
        qwen,
        "--step",
        "generate",
        "--seq",
        "128",
        "--new-tokens",
        "8",
        "--batch",
        "1,2",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra.iter()).copied().collect()
    };
    fails_with(
        &with(&["--engine", "native"]),
        "--engine native: the native engine replays training steps",
    );
    fails_with(&with(&["--engine", "native"]), "--engine torch");
    fails_with(
        &with(&[
            "--engine",
            "torch",
            "--quant",
            "int8",
            "--int8-outliers",
            "none",
        ]),
        "--int8-outliers none: the PyTorch engine measures random-init weights",
    );
    fails_with(
        &with(&["--engine", "torch", "--optimizer", "adamw"]),
        "--optimizer: a training setting",
    );
    fails_with(
        &with(&["--engine", "torch", "--gpus", "2", "--strategy", "ddp"]),
        "--gpus / --strategy",
    );
    fails_with(
        &[
            "bench", "--engine", "torch", "--model", "gpt2", "--step", "prefill", "--seq", "64",
            "--batch", "1",
        ],
        "not modelled yet for the gpt2 family",
    );
    fails_with(
        &[
            "bench", "--engine", "torch", "--model", qwen, "--step", "generate", "--seq", "64",
            "--batch", "1",
        ],
        "--new-tokens",
    );
    // a Python without PyTorch: the reason, no panic
    let dir = std::env::temp_dir().join(format!("vramlab-cli-infer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let python = dir.join("python");
    write_executable(
        &python,
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n",
    )
    .expect("fake python");
    let py = python.display().to_string();
    let mut args: Vec<&str> = with(&["--engine", "torch", "--python"]);
    args.push(&py);
    fails_with(&args, "No module named 'torch'");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The benchmarks a CI run can make without a GPU (`bench-plan`, `bench-fit`), once each at
/// their smallest: they run and report what they measured, with the answer they timed. Times
/// are printed, never compared (a shared CI machine is too noisy for that); the figures are
/// quoted in docs/speed.md from runs made side by side.
#[test]
fn cpu_benchmarks_run_and_report() {
    let (ok, out, err) = vramlab(&[
        "bench-plan",
        "--model",
        "gpt2",
        "--reps",
        "2",
        "--sweep-to",
        "16",
        "--json",
    ]);
    assert!(ok, "bench-plan failed: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench-plan --json");
    assert!(v["events"].as_u64().is_some_and(|n| n > 1000), "{out}");
    assert!(v["max_batch"].as_u64().is_some_and(|n| n >= 1), "{out}");
    for key in ["plan_ms", "evaluate_ms", "sweep_and_max_batch_ms"] {
        assert!(
            v[key]["median"].as_f64().is_some_and(|ms| ms > 0.0),
            "{key}: {out}"
        );
    }
    println!("bench-plan gpt2: {out}");
    let (ok, out, err) = vramlab(&[
        "bench-fit",
        "--model",
        "gpt2",
        "--size",
        "256",
        "--batch",
        "4",
        "--accum",
        "1",
        "--gpu",
        "t4",
        "--reps",
        "1",
        "--json",
    ]);
    assert!(ok, "bench-fit failed: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench-fit --json");
    assert!(v["candidates"].as_u64().is_some_and(|n| n >= 1), "{out}");
    assert!(v["planned"].as_u64().is_some_and(|n| n >= 1), "{out}");
    assert!(
        v["fit_ms"]["median"].as_f64().is_some_and(|ms| ms > 0.0),
        "{out}"
    );
    println!("bench-fit gpt2: {out}");
}
