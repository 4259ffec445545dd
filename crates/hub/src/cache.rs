//! The huggingface_hub cache layout (`huggingface_hub/file_download.py`):
//! `models--ORG--NAME/refs/REVISION` holds a commit hash,
//! `models--ORG--NAME/snapshots/COMMIT/config.json` links to `../../blobs/ETAG`. What is
//! written here transformers finds again, and the other way round.

use std::path::{Path, PathBuf};

use crate::id::HubId;

/// `CACHE/models--ORG--NAME`.
pub fn repo_dir(cache: &Path, id: &HubId) -> PathBuf {
    cache.join(format!("models--{}", id.repo.replace('/', "--")))
}

/// `CACHE/models--ORG--NAME/snapshots/COMMIT/config.json`.
pub fn snapshot_path(cache: &Path, id: &HubId, commit: &str) -> PathBuf {
    repo_dir(cache, id)
        .join("snapshots")
        .join(commit)
        .join("config.json")
}

/// The cached `config.json` of `id`'s revision and the commit it is at: the revision's ref
/// names the commit (a revision not in `refs/` is taken as a commit, as huggingface_hub's
/// `try_to_load_from_cache` does).
pub fn cached(cache: &Path, id: &HubId) -> Option<(PathBuf, String)> {
    let rev = id.revision();
    let ref_file = repo_dir(cache, id).join("refs").join(rev);
    // A ref holds one commit hash: a larger file is not a ref (nor read whole).
    let commit = match std::fs::metadata(&ref_file) {
        Ok(m) if m.is_file() && m.len() <= 256 => std::fs::read_to_string(&ref_file)
            .map(|t| t.trim().to_string())
            .unwrap_or_default(),
        Ok(_) => return None,
        Err(_) => rev.to_string(),
    };
    if !safe_name(&commit) {
        return None;
    }
    let path = snapshot_path(cache, id, &commit);
    path.is_file().then_some((path, commit))
}

/// A name that can be one path component: letters and digits only (commit hashes and
/// ETags are hexadecimal), so a server's header can never name a path outside the cache.
pub fn safe_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.chars().all(|c| c.is_ascii_alphanumeric())
}

/// Writes a downloaded `config.json` into the cache as huggingface_hub does: the blob
/// (atomically), the snapshot entry (a relative symbolic link, a copy where links cannot be
/// made) and, for a branch or tag, the ref. Returns the snapshot path.
pub fn store(
    cache: &Path,
    id: &HubId,
    commit: &str,
    etag: &str,
    bytes: &[u8],
) -> std::io::Result<PathBuf> {
    let invalid = |what: &str, v: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{what} `{v}` is not a hexadecimal name"),
        )
    };
    if !safe_name(commit) {
        return Err(invalid("commit", commit));
    }
    if !safe_name(etag) {
        return Err(invalid("ETag", etag));
    }
    let repo = repo_dir(cache, id);
    let blob = repo.join("blobs").join(etag);
    std::fs::create_dir_all(repo.join("blobs"))?;
    vramlab_core::fsutil::write_atomic(&blob, bytes)?;
    let snapshot = snapshot_path(cache, id, commit);
    let dir = snapshot
        .parent()
        .ok_or_else(|| std::io::Error::other("snapshot without a folder"))?;
    std::fs::create_dir_all(dir)?;
    link_or_copy(&blob, &snapshot, etag, bytes)?;
    let rev = id.revision();
    if rev != commit {
        let ref_file = repo.join("refs").join(rev);
        if let Some(parent) = ref_file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        vramlab_core::fsutil::write_atomic(&ref_file, commit.as_bytes())?;
    }
    Ok(snapshot)
}

#[cfg(unix)]
fn link_or_copy(_blob: &Path, snapshot: &Path, etag: &str, bytes: &[u8]) -> std::io::Result<()> {
    // A link made beside the target, then renamed over it: atomic like the blob.
    let tmp = snapshot.with_file_name(format!(".config.json.link-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let target = Path::new("../../blobs").join(etag);
    match std::os::unix::fs::symlink(&target, &tmp).and_then(|()| std::fs::rename(&tmp, snapshot)) {
        Ok(()) => Ok(()),
        Err(_) => {
            let _ = std::fs::remove_file(&tmp);
            vramlab_core::fsutil::write_atomic(snapshot, bytes)
        }
    }
}

#[cfg(not(unix))]
fn link_or_copy(_blob: &Path, snapshot: &Path, _etag: &str, bytes: &[u8]) -> std::io::Result<()> {
    // huggingface_hub copies too where symbolic links are not available.
    vramlab_core::fsutil::write_atomic(snapshot, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_configs_are_found_again() {
        let cache = std::env::temp_dir().join(format!("vramlab-hub-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&cache);
        let id = HubId::parse("Org/Model").expect("id");
        assert!(cached(&cache, &id).is_none());
        let commit = "0123456789abcdef0123456789abcdef01234567";
        let path =
            store(&cache, &id, commit, "abc123", b"{\"model_type\":\"gpt2\"}").expect("store");
        assert_eq!(
            path,
            cache
                .join("models--Org--Model/snapshots")
                .join(commit)
                .join("config.json")
        );
        assert_eq!(
            std::fs::read_to_string(cache.join("models--Org--Model/refs/main")).expect("ref"),
            commit
        );
        assert_eq!(
            cached(&cache, &id),
            Some((path.clone(), commit.to_string()))
        );
        // The commit itself as the revision finds the same snapshot.
        let pinned = HubId::parse(&format!("Org/Model@{commit}")).expect("id");
        assert_eq!(cached(&cache, &pinned).map(|c| c.0), Some(path));
        assert!(store(&cache, &id, "../x", "e", b"{}").is_err());
        let _ = std::fs::remove_dir_all(&cache);
    }
}
