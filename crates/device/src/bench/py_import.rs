//! Whether a Python can import a module (`python -c "import M"`), bounded in time: a
//! runner that needs a package (DeepSpeed) is refused before it starts, never left hanging.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long an import may take before it counts as failed (DeepSpeed's import probes the
/// accelerator and its op builders: seconds, not minutes).
pub const IMPORT_TIMEOUT: Duration = Duration::from_secs(120);

/// `Ok(())` when `python -c "import {module}"` exits 0 within `timeout` with the extra
/// environment `env`; else why not, in a few words (the import's last message, the exit, or
/// the timeout). The process is killed at the timeout.
pub fn check_import(
    python: &str,
    env: &[(String, String)],
    module: &str,
    timeout: Duration,
) -> Result<(), String> {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let err_path = std::env::temp_dir().join(format!(
        "vramlab-import-{}-{}-{module}.log",
        std::process::id(),
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let err_file = std::fs::File::create(&err_path)
        .map_err(|e| format!("creating {}: {e}", err_path.display()))?;
    let mut child = Command::new(python)
        .args(["-c", &format!("import {module}")])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err_file)
        .spawn()
        .map_err(|e| format!("`{python}` could not be started: {e}"))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if started.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!(
                    "`import {module}` gave no answer in {} s",
                    timeout.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                break Err(format!("waiting for `import {module}`: {e}"));
            }
        }
    };
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_file(&err_path);
    let status = status?;
    if status.success() {
        return Ok(());
    }
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    Err(if last.is_empty() {
        format!("`import {module}` failed: {status}")
    } else {
        last.to_string()
    })
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn script(dir: &std::path::Path, body: &str) -> String {
        let p = dir.join("python");
        crate::testing::write_executable(&p, &format!("#!/bin/sh\n{body}\n")).expect("script");
        p.display().to_string()
    }

    #[test]
    fn an_import_that_works_fails_or_hangs() {
        let tmp = super::super::torch::TempDir::named("import-test").expect("temp dir");
        let ok = script(
            &tmp.0,
            "[ \"$2\" = \"import deepspeed\" ] && exit 0; exit 3",
        );
        assert_eq!(
            check_import(&ok, &[], "deepspeed", Duration::from_secs(20)),
            Ok(())
        );
        let missing = script(
            &tmp.0,
            "echo 'Traceback (most recent call last):' >&2\n\
             echo \"ModuleNotFoundError: No module named 'deepspeed'\" >&2\nexit 1",
        );
        assert_eq!(
            check_import(&missing, &[], "deepspeed", Duration::from_secs(20)),
            Err("ModuleNotFoundError: No module named 'deepspeed'".into())
        );
        let env = vec![("FAKE_EXIT".to_string(), "4".to_string())];
        let silent = script(&tmp.0, "exit $FAKE_EXIT");
        let e =
            check_import(&silent, &env, "deepspeed", Duration::from_secs(20)).expect_err("exit 4");
        assert!(e.contains("failed") && e.contains('4'), "{e}");
        let hang = script(&tmp.0, "exec sleep 30");
        let start = Instant::now();
        let e =
            check_import(&hang, &[], "deepspeed", Duration::from_millis(300)).expect_err("hang");
        assert!(e.contains("no answer"), "{e}");
        assert!(start.elapsed() < Duration::from_secs(10));
        let e = check_import("/nonexistent/python3", &[], "deepspeed", IMPORT_TIMEOUT)
            .expect_err("absent");
        assert!(e.contains("could not be started"), "{e}");
    }
}
