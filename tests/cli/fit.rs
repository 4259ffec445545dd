//! Making a job fit: remedies, `fit`'s ranked answers and the exit code 3 when nothing fits.

use super::{fails_with, vramlab, vramlab_code};

#[test]
fn max_batch_when_nothing_fits_exits_3_with_the_shortfall() {
    let (code, out, err) = vramlab_code(&[
        "max-batch",
        "--model",
        "Llama-2-13b-hf",
        "--seq",
        "2048",
        "--precision",
        "fp32",
        "--gpu",
        "t4",
    ]);
    assert_eq!(code, Some(3), "{out} {err}");
    assert!(out.contains("even at batch 1: batch 1 needs"), "{out}");
    assert!(out.contains("short"), "{out}");
    assert!(err.contains("nothing fits"), "{err}");
    let (code, out, _) = vramlab_code(&[
        "max-batch",
        "--model",
        "Llama-2-13b-hf",
        "--seq",
        "2048",
        "--precision",
        "fp32",
        "--gpu",
        "t4",
        "--json",
    ]);
    assert_eq!(code, Some(3));
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert!(v["max_batch"].is_null());
    let need = v["batch1_nvidia_smi_bytes"].as_u64().expect("need");
    let usable = v["usable_bytes"].as_u64().expect("usable");
    assert_eq!(v["shortfall_bytes"].as_u64(), Some(need - usable));
}

/// A remedy that frees allocated memory the cache keeps reserved says so, and a remedy
/// that does not fit at the batch says which batch it allows.
#[test]
fn remedies_show_allocated_savings_and_the_batch_they_allow() {
    let (ok, out, err) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "16",
        "--seq",
        "1024",
        "--precision",
        "amp-bf16",
        "--optimizer",
        "adamw",
        "--gpu",
        "rtx-4090",
        "--json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["fits"], false);
    let remedies = v["remedies"].as_array().expect("remedies");
    let adam8 = remedies
        .iter()
        .find(|r| r["name"] == "8-bit Adam")
        .expect("8-bit Adam");
    let alloc = adam8["allocated_saving"]
        .as_i64()
        .expect("allocated saving");
    let smi = adam8["saving"].as_i64().expect("saving");
    assert!(alloc > 0 && smi < alloc / 2, "{adam8}");
    assert!(
        adam8["note"]
            .as_str()
            .is_some_and(|n| n.contains("caching allocator"))
    );
    for r in remedies {
        if r["fits"] == false
            && let Some(b) = r["fits_up_to"].as_u64()
        {
            assert!(b < r["config"]["batch"].as_u64().expect("batch"), "{r}");
            // The batch it allows really fits.
            let c = &r["config"];
            let (b, accum) = (b.to_string(), c["accum"].to_string());
            let mut args = vec![
                "plan", "--model", "gpt2", "--batch", &b, "--seq", "1024", "--gpu", "rtx-4090",
                "--json", "--accum", &accum,
            ];
            args.extend(["--precision", c["precision"].as_str().expect("precision")]);
            args.extend(["--optimizer", c["optimizer"].as_str().expect("optimizer")]);
            args.extend(["--loop", c["loop"].as_str().expect("loop")]);
            if c["checkpointing"] == true {
                args.push("--checkpointing");
            }
            if c["allocator"]["expandable_segments"] == true {
                args.push("--expandable-segments");
            }
            let (ok, out, err) = vramlab(&args);
            assert!(ok, "{err}");
            let p: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
            assert_eq!(p["fits"], true, "{} at {b}", r["name"]);
        }
    }
    let (ok, out, _) = vramlab(&[
        "plan",
        "--model",
        "gpt2",
        "--batch",
        "16",
        "--seq",
        "1024",
        "--optimizer",
        "adamw",
        "--precision",
        "amp-bf16",
        "--gpu",
        "rtx-4090",
    ]);
    assert!(ok);
    assert!(out.contains("fits at micro-batch up to 12"), "{out}");
    assert!(out.contains("so nvidia-smi moves by"), "{out}");
}

#[test]
fn max_batch_when_nothing_fits_points_to_vramlab_fit() {
    let args = [
        "max-batch",
        "--model",
        "Meta-Llama-3-8B",
        "--seq",
        "2048",
        "--gpu",
        "rtx-4090",
    ];
    let (code, out, _) = vramlab_code(&args);
    assert_eq!(code, Some(3), "{out}");
    let want = "vramlab fit --model Meta-Llama-3-8B --seq 2048 --gpu rtx-4090";
    assert!(out.contains(want), "{out}");
    let (_, json, _) = vramlab_code(&[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    assert_eq!(v["fit_command"], want);
    // The command it prints runs and answers.
    let fit_args: Vec<&str> = want.split(' ').skip(1).collect();
    let (code, out, err) = vramlab_code(&fit_args);
    assert_eq!(code, Some(0), "{out} {err}");
    assert!(out.contains("LoRA"), "{out}");
}

#[test]
fn fit_answers_llama3_8b_on_a_4090_in_text_and_json() {
    let base = [
        "fit",
        "--model",
        "Meta-Llama-3-8B",
        "--seq",
        "2048",
        "--batch",
        "4",
        "--accum",
        "4",
        "--gpu",
        "rtx-4090",
    ];
    let (code, out, err) = vramlab_code(&base);
    assert_eq!(code, Some(0), "{out} {err}");
    assert!(out.contains("effective batch 16"), "{out}");
    assert!(out.contains("ms/sample"), "{out}");
    // At the upper edge of llama/lora/none's reserved band LoRA in bf16 no longer fits 24 GB;
    // QLoRA does.
    assert!(
        out.contains("full fine-tuning → QLoRA nf4 r8 on attn"),
        "{out}"
    );
    let (code, json, err) = vramlab_code(&[&base[..], &["--json", "--top", "3"]].concat());
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(json.trim()).expect("json");
    let list = v["candidates"].as_array().expect("candidates");
    assert!(!list.is_empty() && list.len() <= 3);
    let usable = v["usable_bytes"].as_u64().expect("usable");
    let mut last = 0.0;
    for c in list {
        let cfg = &c["config"];
        assert_eq!(
            cfg["batch"].as_u64().expect("batch") * cfg["accum"].as_u64().expect("accum"),
            16
        );
        assert!(c["nvidia_smi"].as_u64().expect("smi") <= usable);
        let mode = cfg["finetune"]["mode"].as_str().expect("mode");
        assert!(mode == "lora" || mode == "qlora", "{mode}");
        let t = c["time"]["ms_per_sample"].as_f64().expect("time");
        assert!(t >= last);
        last = t;
        assert!(!c["changes"].as_array().expect("changes").is_empty());
    }
    assert!(v["reason"].is_null());
}

#[test]
fn fit_keeps_the_users_config_first_and_refuses_bad_flags() {
    let (code, out, err) = vramlab_code(&[
        "fit", "--model", "gpt2", "--seq", "512", "--batch", "4", "--gpu", "rtx-4090", "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert_eq!(v["candidates"][0]["is_user_config"], true);
    assert_eq!(v["candidates"][0]["config"]["batch"], 4);
    fails_with(
        &["fit", "--model", "gpt2", "--gpu", "rtx-4090", "--top", "0"],
        "--top",
    );
    fails_with(
        &["fit", "--model", "gpt2", "--effective-batch", "0"],
        "at least 1",
    );
    fails_with(&["fit", "--model", "gpt-9"], "gpt");
}

#[test]
fn fit_when_nothing_fits_exits_3_with_a_reason() {
    let (code, out, err) = vramlab_code(&[
        "fit",
        "--model",
        "Llama-2-13b-hf",
        "--seq",
        "2048",
        "--gpu",
        "rtx-4090",
        "--margin",
        "0.85",
    ]);
    assert_eq!(code, Some(3), "{out} {err}");
    assert!(out.contains("nothing fits"), "{out}");
    assert!(err.contains("nothing fits"), "{err}");
}

/// Nothing fits and no single remedy does: `plan` prints the fit search's best answer in
/// one line, the `vramlab fit` command with the same arguments, and LoRA / QLoRA.
#[test]
fn plan_points_to_fit_when_no_remedy_fits() {
    let args = [
        "plan",
        "--model",
        "Meta-Llama-3-8B",
        "--seq",
        "2048",
        "--batch",
        "4",
        "--gpu",
        "rtx-4090",
    ];
    let (ok, out, err) = vramlab(&args);
    assert!(ok, "{err}");
    assert!(out.contains("DOES NOT FIT"), "{out}");
    assert!(out.contains("Next step: no single remedy fits."), "{out}");
    assert!(out.contains("  best combination: "), "{out}");
    assert!(
        out.contains("vramlab fit --model Meta-Llama-3-8B --seq 2048 --batch 4 --gpu rtx-4090"),
        "{out}"
    );
    // Remedies that add memory come after the rest, as costs.
    if let Some(at) = out.find("adds memory here (costs, not remedies):") {
        let costs = &out[at..out.find("Next step").unwrap_or(out.len())];
        assert!(!costs.contains(" fits"), "{costs}");
    }
    let (ok, out, err) = vramlab(&[&args[..], &["--json"]].concat());
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("json");
    assert!(
        v["fit_command"]
            .as_str()
            .is_some_and(|c| c.starts_with("vramlab fit --model Meta-Llama-3-8B")),
        "{v}"
    );
}
