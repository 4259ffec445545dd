//! `ORG/NAME[@REVISION]`: a Hub model id, told apart from a preset name or a file path.

use crate::error::HubError;

/// A Hugging Face Hub model repository and the revision asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubId {
    /// `ORG/NAME`.
    pub repo: String,
    /// A branch, tag or commit; `None` is `main`.
    pub revision: Option<String>,
}

/// The revision huggingface_hub uses when none is given.
pub const DEFAULT_REVISION: &str = "main";

/// A repository name part: `[A-Za-z0-9._-]`, 1–96 characters, not starting or ending with
/// `.` or `-`, without `..` or `--` (the Hub's rule, huggingface_hub's `validate_repo_id`).
fn valid_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !s.starts_with(['.', '-'])
        && !s.ends_with(['.', '-'])
        && !s.contains("..")
        && !s.contains("--")
}

/// A revision: a branch, tag or commit (`refs/pr/1` too), with no empty or `..` segment.
fn valid_revision(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 256
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
        && s.split('/')
            .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

impl HubId {
    /// Whether `s` is shaped like a Hub id: exactly one `/` before any `@`, and no `.json`
    /// suffix. The caller tries a local path and a preset name first.
    pub fn looks_like(s: &str) -> bool {
        let repo = s.split_once('@').map_or(s, |(r, _)| r);
        repo.matches('/').count() == 1 && !s.ends_with(".json")
    }

    /// Parses `ORG/NAME[@REVISION]`; errors name the part that is not valid.
    pub fn parse(s: &str) -> Result<HubId, HubError> {
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) => (r, Some(rev)),
            None => (s, None),
        };
        let bad = |reason: String| HubError::BadId {
            id: s.to_string(),
            reason,
        };
        let (org, name) = repo
            .split_once('/')
            .ok_or_else(|| bad("expected ORG/NAME".to_string()))?;
        for part in [org, name] {
            if !valid_part(part) {
                return Err(bad(format!(
                    "`{part}` is not a valid repository name part (letters, digits, `.`, `_`, \
                     `-`; at most 96; not starting or ending with `.` or `-`)"
                )));
            }
        }
        if let Some(rev) = revision
            && !valid_revision(rev)
        {
            return Err(bad(format!(
                "`{rev}` is not a valid revision (a branch, tag or commit hash after `@`)"
            )));
        }
        Ok(HubId {
            repo: repo.to_string(),
            revision: revision.map(str::to_string),
        })
    }

    /// The repository's name (after the `/`): the folder a `git clone` of it makes, and
    /// the name its imported preset takes.
    pub fn name(&self) -> &str {
        self.repo.split_once('/').map_or(&self.repo, |(_, n)| n)
    }

    /// The revision asked for, `main` by default.
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }
}

impl std::fmt::Display for HubId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.revision {
            Some(r) => write!(f, "{}@{r}", self.repo),
            None => f.write_str(&self.repo),
        }
    }
}

/// Whether `s` is a full commit hash (40 hexadecimal digits).
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_refuse() {
        let id = HubId::parse("Qwen/Qwen2.5-1.5B").expect("id");
        assert_eq!((id.name(), id.revision()), ("Qwen2.5-1.5B", "main"));
        let id = HubId::parse("meta-llama/Llama-3.2-1B@refs/pr/3").expect("id");
        assert_eq!(id.revision(), "refs/pr/3");
        assert_eq!(id.to_string(), "meta-llama/Llama-3.2-1B@refs/pr/3");
        for bad in [
            "a/b@", "a/b@../x", "-a/b", "a/b c", "a/", "a/b--c", "a/b@x//y",
        ] {
            assert!(HubId::parse(bad).is_err(), "{bad}");
        }
        assert!(HubId::looks_like("Qwen/Qwen2.5-1.5B@main"));
        assert!(!HubId::looks_like("models/x.json"));
        assert!(!HubId::looks_like("a/b/c"));
        assert!(!HubId::looks_like("gpt2"));
        assert!(is_commit("0123456789abcdef0123456789abcdef01234567"));
        assert!(!is_commit("main"));
    }
}
