//! One `config.json` downloaded from the Hub (`GET {endpoint}/{repo}/resolve/{revision}/
//! config.json`, as huggingface_hub's `hf_hub_url` builds it) with a bounded body.

use std::time::Duration;

use vramlab_core::fsutil::FileKind;

use crate::env::HubEnv;
use crate::error::HubError;
use crate::id::HubId;

/// A downloaded file and the headers that place it in the cache.
#[derive(Debug, Clone)]
pub struct Downloaded {
    pub bytes: Vec<u8>,
    /// `X-Repo-Commit`: the commit the revision resolved to.
    pub commit: String,
    /// `X-Linked-Etag` or `ETag`, unquoted: the blob's name in the cache.
    pub etag: String,
}

/// huggingface_hub's `quote(revision, safe="")` for the characters a revision may hold.
fn quote_revision(rev: &str) -> String {
    rev.replace('/', "%2F")
}

/// `ETag: W/"abc"` → `abc` (huggingface_hub's `_normalize_etag`).
fn normalize_etag(e: &str) -> String {
    e.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_string()
}

/// Downloads `id`'s `config.json` at its revision.
pub fn config(id: &HubId, env: &HubEnv) -> Result<Downloaded, HubError> {
    let url = format!(
        "{}/{}/resolve/{}/config.json",
        env.endpoint,
        id.repo,
        quote_revision(id.revision())
    );
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .timeout_global(Some(env.timeout))
            .timeout_connect(Some(env.timeout.min(Duration::from_secs(10))))
            .http_status_as_error(false)
            // A renamed repository answers with a redirect to its new name on the same Hub:
            // the token goes along there (over HTTPS), never to another host.
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
            .user_agent(concat!("vramlab/", env!("CARGO_PKG_VERSION")))
            .build(),
    );
    let mut req = agent.get(&url);
    if let Some(t) = &env.token {
        req = req.header("Authorization", format!("Bearer {t}"));
    }
    let transport = |e: ureq::Error| match e {
        ureq::Error::Timeout(_) => HubError::Timeout {
            id: id.to_string(),
            endpoint: env.endpoint.clone(),
            secs: env.timeout.as_secs_f64(),
        },
        ureq::Error::BodyExceedsLimit(_) => HubError::TooLarge {
            id: id.to_string(),
            endpoint: env.endpoint.clone(),
            limit: FileKind::Model.limit(),
        },
        other => HubError::Unreachable {
            id: id.to_string(),
            endpoint: env.endpoint.clone(),
            error: other.to_string(),
        },
    };
    let mut resp = req.call().map_err(transport)?;
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let error_code = header("x-error-code").unwrap_or_default();
    let error_message = header("x-error-message");
    match status {
        200 => {}
        401 | 403 if error_code == "GatedRepo" => {
            return Err(HubError::Gated {
                id: id.to_string(),
                repo: id.repo.clone(),
                endpoint: env.endpoint.clone(),
                status,
            });
        }
        401 | 403 if env.token.is_some() => {
            return Err(HubError::TokenRefused {
                id: id.to_string(),
                endpoint: env.endpoint.clone(),
                status,
            });
        }
        401 | 403 => {
            return Err(HubError::NeedsToken {
                id: id.to_string(),
                endpoint: env.endpoint.clone(),
                status,
            });
        }
        404 => {
            let detail = match error_code.as_str() {
                "RevisionNotFound" => format!(
                    "the repository has no revision `{}` (a branch, tag or commit)",
                    id.revision()
                ),
                "EntryNotFound" => "the repository has no config.json at this revision (an \
                                    adapter-only repository has adapter_config.json instead: \
                                    pass its base model, `base_model_name_or_path`)"
                    .to_string(),
                _ => format!(
                    "check the id `{}` and the revision `{}` (ORG/NAME[@REVISION], as on the \
                     model's Hub page)",
                    id.repo,
                    id.revision()
                ),
            };
            return Err(HubError::NotFound {
                id: id.to_string(),
                endpoint: env.endpoint.clone(),
                revision: id.revision().to_string(),
                detail,
            });
        }
        _ => {
            return Err(HubError::Http {
                id: id.to_string(),
                endpoint: env.endpoint.clone(),
                status,
                detail: error_message.map(|m| format!(": {m}")).unwrap_or_default(),
            });
        }
    }
    let not_a_hub = |reason: &str| HubError::NotAHub {
        id: id.to_string(),
        endpoint: env.endpoint.clone(),
        reason: reason.to_string(),
    };
    let commit = header("x-repo-commit")
        .ok_or_else(|| not_a_hub("no X-Repo-Commit header"))?
        .trim()
        .to_string();
    if !crate::id::is_commit(&commit) {
        return Err(not_a_hub("its X-Repo-Commit header is not a commit hash"));
    }
    let etag = header("x-linked-etag")
        .or_else(|| header("etag"))
        .map(|e| normalize_etag(&e))
        .ok_or_else(|| not_a_hub("no ETag header"))?;
    if !crate::cache::safe_name(&etag) {
        return Err(not_a_hub("its ETag is not a hexadecimal name"));
    }
    let bytes = resp
        .body_mut()
        .with_config()
        .limit(FileKind::Model.limit().0)
        .read_to_vec()
        .map_err(transport)?;
    Ok(Downloaded {
        bytes,
        commit,
        etag,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_and_revisions_as_huggingface_hub_writes_them() {
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("\"abc\""), "abc");
        assert_eq!(quote_revision("refs/pr/1"), "refs%2Fpr%2F1");
    }
}
