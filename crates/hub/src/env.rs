//! The huggingface_hub environment variables, read as huggingface_hub 1.x reads them
//! (`huggingface_hub/constants.py`).

use std::path::PathBuf;
use std::time::Duration;

/// The Hub endpoint when `HF_ENDPOINT` is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Seconds a download may take when `HF_HUB_DOWNLOAD_TIMEOUT` is not set (huggingface_hub's
/// default).
pub const DEFAULT_TIMEOUT_SECS: u64 = 10;

/// Where and how a Hub id is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubEnv {
    /// `HF_ENDPOINT` without a trailing `/`.
    pub endpoint: String,
    /// `HF_HUB_CACHE` (or the legacy `HUGGINGFACE_HUB_CACHE`), else `$HF_HOME/hub`; `HF_HOME`
    /// defaults to `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
    pub cache: PathBuf,
    /// `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is 1, ON, YES or TRUE: the cache only.
    pub offline: bool,
    /// `HF_TOKEN` (or the legacy `HUGGING_FACE_HUB_TOKEN`), else the token file
    /// (`HF_TOKEN_PATH`, default `$HF_HOME/token`, which `hf auth login` writes).
    pub token: Option<String>,
    /// `HF_HUB_DOWNLOAD_TIMEOUT` in seconds.
    pub timeout: Duration,
}

fn is_true(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.to_ascii_uppercase().as_str(), "1" | "ON" | "YES" | "TRUE"))
}

impl HubEnv {
    /// From this process's environment.
    pub fn from_env() -> HubEnv {
        HubEnv::from_lookup(|k| std::env::var(k).ok())
    }

    /// From a variable lookup (empty values count as unset).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> HubEnv {
        let get = |k: &str| get(k).filter(|v| !v.trim().is_empty());
        let home_dir = || {
            get("HOME")
                .or_else(|| get("USERPROFILE"))
                .map_or_else(|| PathBuf::from("."), PathBuf::from)
        };
        let hf_home = get("HF_HOME").map_or_else(
            || {
                get("XDG_CACHE_HOME")
                    .map_or_else(|| home_dir().join(".cache"), PathBuf::from)
                    .join("huggingface")
            },
            PathBuf::from,
        );
        let cache = get("HF_HUB_CACHE")
            .or_else(|| get("HUGGINGFACE_HUB_CACHE"))
            .map_or_else(|| hf_home.join("hub"), PathBuf::from);
        let token_path = get("HF_TOKEN_PATH").map_or_else(|| hf_home.join("token"), PathBuf::from);
        let token = get("HF_TOKEN")
            .or_else(|| get("HUGGING_FACE_HUB_TOKEN"))
            .or_else(|| read_token_file(&token_path))
            .map(|t| t.trim().to_string());
        let timeout = get("HF_HUB_DOWNLOAD_TIMEOUT")
            .and_then(|t| t.trim().parse::<f64>().ok())
            .filter(|t| t.is_finite() && *t > 0.0)
            .map_or(
                Duration::from_secs(DEFAULT_TIMEOUT_SECS),
                Duration::from_secs_f64,
            );
        HubEnv {
            endpoint: get("HF_ENDPOINT")
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
                .trim_end_matches('/')
                .to_string(),
            cache,
            offline: is_true(get("HF_HUB_OFFLINE")) || is_true(get("TRANSFORMERS_OFFLINE")),
            token,
            timeout,
        }
    }
}

/// The token file's first line (a token is a few dozen bytes: more is not a token file).
fn read_token_file(path: &std::path::Path) -> Option<String> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 4096 {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .next()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_follow_huggingface_hub() {
        let env = HubEnv::from_lookup(|k| (k == "HOME").then(|| "/home/u".to_string()));
        assert_eq!(env.cache, PathBuf::from("/home/u/.cache/huggingface/hub"));
        assert_eq!(env.endpoint, DEFAULT_ENDPOINT);
        assert!(!env.offline && env.token.is_none());
        let env = HubEnv::from_lookup(|k| match k {
            "HF_HOME" => Some("/hf".into()),
            "HF_ENDPOINT" => Some("http://127.0.0.1:9/".into()),
            "HF_HUB_OFFLINE" => Some("yes".into()),
            "HF_TOKEN" => Some(" hf_x \n".into()),
            "HF_HUB_DOWNLOAD_TIMEOUT" => Some("2.5".into()),
            _ => None,
        });
        assert_eq!(env.cache, PathBuf::from("/hf/hub"));
        assert_eq!(env.endpoint, "http://127.0.0.1:9");
        assert!(env.offline);
        assert_eq!(env.token.as_deref(), Some("hf_x"));
        assert_eq!(env.timeout, Duration::from_millis(2500));
        let env = HubEnv::from_lookup(|k| match k {
            "HF_HOME" => Some("/hf".into()),
            "HF_HUB_CACHE" => Some("/c".into()),
            "HF_HUB_OFFLINE" => Some("0".into()),
            _ => None,
        });
        assert_eq!(env.cache, PathBuf::from("/c"));
        assert!(!env.offline);
    }
}
