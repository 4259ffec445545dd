//! What can go wrong resolving a Hub id or reading a model folder, each saying what to do.

use std::path::PathBuf;

/// How to give vramlab a token, said wherever one is missing or refused.
pub const TOKEN_HELP: &str = "set HF_TOKEN to a read token (`export HF_TOKEN=hf_…`, made at \
     https://huggingface.co/settings/tokens) or run `hf auth login`, which writes \
     $HF_HOME/token";

/// A Hub id or model folder that cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("`{id}` is not a Hub model id ({reason}); expected ORG/NAME or ORG/NAME@REVISION")]
    BadId { id: String, reason: String },
    #[error(
        "{id}: HF_HUB_OFFLINE is set and its config.json is not in the Hugging Face cache \
         {}; run once with the network (HF_HUB_OFFLINE unset) or point HF_HUB_CACHE / HF_HOME \
         at a cache that has it",
        cache.display()
    )]
    Offline { id: String, cache: PathBuf },
    #[error(
        "{id}: {endpoint} refused access (HTTP {status}): the repository is gated; accept \
             its terms on its page ({endpoint}/{repo}) with your account, then {TOKEN_HELP}"
    )]
    Gated {
        id: String,
        repo: String,
        endpoint: String,
        status: u16,
    },
    #[error(
        "{id}: {endpoint} refused the token (HTTP {status}): check that HF_TOKEN (or \
             $HF_HOME/token) is a valid token with access to this repository (a gated one \
             needs its terms accepted)"
    )]
    TokenRefused {
        id: String,
        endpoint: String,
        status: u16,
    },
    #[error(
        "{id}: {endpoint} answered HTTP {status} without a token: the repository does not \
             exist, or it is private or gated; check the id, and if you have access, {TOKEN_HELP}"
    )]
    NeedsToken {
        id: String,
        endpoint: String,
        status: u16,
    },
    #[error("{id}: not found on {endpoint} (revision {revision}): {detail}")]
    NotFound {
        id: String,
        endpoint: String,
        revision: String,
        detail: String,
    },
    #[error("{id}: {endpoint} answered HTTP {status}{detail}")]
    Http {
        id: String,
        endpoint: String,
        status: u16,
        detail: String,
    },
    #[error(
        "{id}: no answer from {endpoint} within {secs} s; check the network and \
             HF_ENDPOINT, raise HF_HUB_DOWNLOAD_TIMEOUT, or use a cached copy with \
             HF_HUB_OFFLINE=1"
    )]
    Timeout {
        id: String,
        endpoint: String,
        secs: f64,
    },
    #[error(
        "{id}: cannot reach {endpoint} ({error}); check the network and HF_ENDPOINT, or \
             use a cached copy with HF_HUB_OFFLINE=1"
    )]
    Unreachable {
        id: String,
        endpoint: String,
        error: String,
    },
    #[error(
        "{id}: the config.json {endpoint} sent is larger than the {limit} limit for a \
             model file"
    )]
    TooLarge {
        id: String,
        endpoint: String,
        limit: vramlab_core::units::Bytes,
    },
    #[error(
        "{id}: {endpoint} does not answer like the Hugging Face Hub ({reason}); check \
             HF_ENDPOINT"
    )]
    NotAHub {
        id: String,
        endpoint: String,
        reason: String,
    },
    #[error("{what}: {reason}")]
    Malformed { what: String, reason: String },
    #[error("{what}: config.json has no `model_type`, so it is not a transformers model \
             config (a sentence-transformers, diffusers or adapter repository's?); vramlab \
             imports the model types {}", vramlab_core::model::hf::SUPPORTED.join(", "))]
    NoModelType { what: String },
    #[error("reading the Hugging Face cache: {0}")]
    Cache(String),
    #[error(
        "{id}: this vramlab was built without Hub downloads (the `hub` feature) and the \
             config is not in the Hugging Face cache; download it with `hf download {id} \
             config.json` or pass a config.json path"
    )]
    NoDownload { id: String },
    #[error("{}: {reason}", path.display())]
    Folder { path: PathBuf, reason: String },
    #[error("{what}: {error}")]
    Import {
        what: String,
        #[source]
        error: vramlab_core::model::ModelError,
    },
}
