//! A Hub id's `config.json`: the huggingface_hub cache first (no request), else a download
//! written into the cache; and the check that a config text is a model's.

use std::path::PathBuf;

use crate::cache;
use crate::env::HubEnv;
use crate::error::HubError;
#[cfg(feature = "download")]
use crate::fetch;
use crate::id::HubId;

/// Where a Hub config came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Already in the huggingface_hub cache: no request was made.
    Cache,
    /// Downloaded now and written into the cache.
    Downloaded,
}

/// A Hub id's `config.json`, resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The config's text (checked to be a JSON object with a `model_type`).
    pub text: String,
    /// Where it lies in the cache (`…/snapshots/COMMIT/config.json`).
    pub path: PathBuf,
    /// The commit the revision resolved to.
    pub commit: String,
    pub origin: Origin,
    /// A problem that did not stop the answer (the cache could not be written).
    pub warning: Option<String>,
}

/// Resolves a Hub id's `config.json`: the cache first (no request), then, unless
/// `HF_HUB_OFFLINE` is set, a download written into the cache in huggingface_hub's layout.
pub fn resolve(id: &HubId, env: &HubEnv) -> Result<Resolved, HubError> {
    if let Some((path, commit)) = cache::cached(&env.cache, id) {
        let text =
            vramlab_core::fsutil::read_bounded_string(&path, vramlab_core::fsutil::FileKind::Model)
                .map_err(|e| HubError::Cache(e.to_string()))?;
        check_config(&text, &id.to_string())?;
        return Ok(Resolved {
            text,
            path,
            commit,
            origin: Origin::Cache,
            warning: None,
        });
    }
    if env.offline {
        return Err(HubError::Offline {
            id: id.to_string(),
            cache: env.cache.clone(),
        });
    }
    download(id, env)
}

#[cfg(feature = "download")]
fn download(id: &HubId, env: &HubEnv) -> Result<Resolved, HubError> {
    let got = fetch::config(id, env)?;
    let text = String::from_utf8(got.bytes.clone()).map_err(|e| HubError::Malformed {
        what: id.to_string(),
        reason: format!("config.json is not UTF-8 text: {e}"),
    })?;
    check_config(&text, &id.to_string())?;
    let (path, warning) = match cache::store(&env.cache, id, &got.commit, &got.etag, &got.bytes) {
        Ok(p) => (p, None),
        Err(e) => (
            cache::snapshot_path(&env.cache, id, &got.commit),
            Some(format!(
                "could not write {id}'s config.json into the cache {}: {e}",
                env.cache.display()
            )),
        ),
    };
    Ok(Resolved {
        text,
        path,
        commit: got.commit,
        origin: Origin::Downloaded,
        warning,
    })
}

#[cfg(not(feature = "download"))]
fn download(id: &HubId, _env: &HubEnv) -> Result<Resolved, HubError> {
    Err(HubError::NoDownload { id: id.to_string() })
}

/// Refuses a `config.json` that is not a JSON object with a `model_type` (a
/// sentence-transformers, diffusers or adapter repository's, or not a config at all).
pub fn check_config(text: &str, what: &str) -> Result<(), HubError> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| HubError::Malformed {
        what: what.to_string(),
        reason: format!("config.json is not valid JSON: {e}"),
    })?;
    let Some(obj) = v.as_object() else {
        return Err(HubError::Malformed {
            what: what.to_string(),
            reason: "config.json is not a JSON object".to_string(),
        });
    };
    if !obj.contains_key("model_type") {
        return Err(HubError::NoModelType {
            what: what.to_string(),
        });
    }
    Ok(())
}
