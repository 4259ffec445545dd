//! `--model ORG/NAME[@REVISION]` against a loopback server that answers in the Hugging Face
//! Hub's URL layout (`/ORG/NAME/resolve/REV/config.json`): the download plans exactly like
//! the same local file, lands in the huggingface_hub cache layout, is reused without a
//! request and offline, and each failure says what to do. Variables are set on the child
//! only.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/hf_configs");
const COMMIT: &str = "8faed761d45a263340a0528343f099c05c9a4323";
const ETAG: &str = "a4bd2bc1b3a5b9d8b3b07c1d2c2e4a3b1e1f0c9d";
const TOKEN: &str = "hf_loopbacktesttoken";

/// A Hub on 127.0.0.1 serving a few repositories; stops when dropped.
struct Hub {
    endpoint: String,
    requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hub {
    fn start() -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        listener.set_nonblocking(true).expect("nonblocking");
        let requests = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        r.fetch_add(1, Ordering::SeqCst);
                        std::thread::spawn(move || serve(stream));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Hub {
            endpoint,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn respond(mut stream: TcpStream, status: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

/// One request: the path and the `Authorization` header decide the answer.
fn serve(stream: TcpStream) {
    let _ = stream.set_nonblocking(false);
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut line = String::new();
    let _ = reader.read_line(&mut line);
    let path = line.split(' ').nth(1).unwrap_or("").to_string();
    let mut auth = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("authorization")
        {
            auth = Some(v.trim().to_string());
        }
    }
    let file = |name: &str| std::fs::read(format!("{DIR}/{name}")).expect("config");
    let ok = |body: &[u8]| {
        let etag = format!("\"{ETAG}\"");
        respond(
            stream.try_clone().expect("clone"),
            "200 OK",
            &[("X-Repo-Commit", COMMIT), ("ETag", &etag)],
            body,
        )
    };
    match path.as_str() {
        "/Qwen/Qwen2.5-1.5B/resolve/main/config.json" => ok(&file("Qwen2.5-1.5B.json")),
        "/Qwen/Qwen2.5-1.5B/resolve/nope/config.json" => respond(
            stream,
            "404 Not Found",
            &[("X-Error-Code", "RevisionNotFound")],
            b"",
        ),
        "/gated/Llama-3.2-1B/resolve/main/config.json" => {
            if auth.as_deref() == Some(&format!("Bearer {TOKEN}")) {
                ok(&file("Llama-3.2-1B.json"));
            } else {
                respond(
                    stream,
                    "401 Unauthorized",
                    &[("X-Error-Code", "GatedRepo")],
                    b"",
                );
            }
        }
        "/sentence/encoder/resolve/main/config.json" => ok(br#"{"architectures": ["X"]}"#),
        "/slow/model/resolve/main/config.json" => std::thread::sleep(Duration::from_secs(4)),
        _ => respond(
            stream,
            "404 Not Found",
            &[("X-Error-Code", "RepoNotFound")],
            b"",
        ),
    }
}

/// A temporary HF_HOME, removed when dropped.
struct Home(PathBuf);

impl Home {
    fn new(tag: &str) -> Home {
        let p = std::env::temp_dir().join(format!("vramlab-hub-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("home");
        Home(p)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// vramlab with HF_HOME and HF_ENDPOINT set on the child, the caller's Hub variables
/// removed, and `extra` variables added.
fn vramlab(
    home: &Path,
    endpoint: &str,
    extra: &[(&str, &str)],
    args: &[&str],
) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vramlab"));
    for k in [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_TOKEN_PATH",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DOWNLOAD_TIMEOUT",
    ] {
        cmd.env_remove(k);
    }
    cmd.env("HF_HOME", home).env("HF_ENDPOINT", endpoint);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.args(args).output().expect("run vramlab");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    )
}

const PLAN: [&str; 7] = ["plan", "--json", "--batch", "4", "--seq", "512", "--model"];

fn plan(
    home: &Path,
    endpoint: &str,
    extra: &[(&str, &str)],
    model: &str,
) -> (bool, String, String) {
    let mut args = PLAN.to_vec();
    args.push(model);
    vramlab(home, endpoint, extra, &args)
}

#[test]
fn a_hub_id_plans_like_the_local_file_then_from_the_cache_and_offline() {
    let home = Home::new("qwen");
    // The same config as a local clone's config.json, and as the clone's folder.
    let clone = home.0.join("clone/Qwen2.5-1.5B");
    std::fs::create_dir_all(&clone).expect("clone");
    std::fs::copy(
        format!("{DIR}/Qwen2.5-1.5B.json"),
        clone.join("config.json"),
    )
    .expect("copy");
    let hub = Hub::start();
    let local_file = clone.join("config.json");
    let (ok, local, err) = plan(
        &home.0,
        &hub.endpoint,
        &[],
        local_file.to_str().expect("utf-8"),
    );
    assert!(ok, "{err}");
    assert!(local.contains("Qwen2.5-1.5B"), "{local}");
    let (ok, folder, err) = plan(&home.0, &hub.endpoint, &[], clone.to_str().expect("utf-8"));
    assert!(ok, "{err}");
    assert_eq!(folder, local, "the folder plans like its config.json");
    assert_eq!(hub.requests(), 0);

    let (ok, fetched, err) = plan(&home.0, &hub.endpoint, &[], "Qwen/Qwen2.5-1.5B");
    assert!(ok, "{err}");
    assert_eq!(
        fetched, local,
        "the Hub id plans byte-identically to the local file"
    );
    assert!(
        err.contains("downloaded into the Hugging Face cache"),
        "{err}"
    );
    assert_eq!(hub.requests(), 1);

    // huggingface_hub's layout: the ref names the commit, the snapshot links to the blob.
    let repo = home.0.join("hub/models--Qwen--Qwen2.5-1.5B");
    assert_eq!(
        std::fs::read_to_string(repo.join("refs/main")).expect("ref"),
        COMMIT
    );
    let snapshot = repo.join("snapshots").join(COMMIT).join("config.json");
    assert_eq!(
        std::fs::read(&snapshot).expect("snapshot"),
        std::fs::read(format!("{DIR}/Qwen2.5-1.5B.json")).expect("config")
    );
    assert!(repo.join("blobs").join(ETAG).is_file());
    #[cfg(unix)]
    assert_eq!(
        std::fs::read_link(&snapshot).expect("a link"),
        Path::new("../../blobs").join(ETAG)
    );

    // Cached: no request, even online.
    let (ok, again, err) = plan(&home.0, &hub.endpoint, &[], "Qwen/Qwen2.5-1.5B");
    assert!(ok, "{err}");
    assert_eq!(again, local);
    assert!(err.contains("from the Hugging Face cache"), "{err}");
    assert_eq!(hub.requests(), 1);

    // Offline, the server gone: the same plan from the cache, by branch and by commit.
    let endpoint = hub.endpoint.clone();
    drop(hub);
    let offline = [("HF_HUB_OFFLINE", "1")];
    let (ok, cached, err) = plan(&home.0, &endpoint, &offline, "Qwen/Qwen2.5-1.5B");
    assert!(ok, "{err}");
    assert_eq!(cached, local);
    let pinned = format!("Qwen/Qwen2.5-1.5B@{COMMIT}");
    let (ok, cached, err) = plan(&home.0, &endpoint, &offline, &pinned);
    assert!(ok, "{err}");
    assert_eq!(cached, local);

    // The server gone and not offline, for an id not cached: the endpoint is named.
    let (ok, _, err) = plan(&home.0, &endpoint, &[], "Qwen/Qwen2.5-0.5B");
    assert!(!ok);
    assert!(err.contains(&format!("cannot reach {endpoint}")), "{err}");
    assert!(err.contains("HF_HUB_OFFLINE=1"), "{err}");
    // Offline without a cached copy.
    let (ok, _, err) = plan(&home.0, &endpoint, &offline, "Qwen/Qwen2.5-0.5B");
    assert!(!ok);
    assert!(
        err.contains("Qwen/Qwen2.5-0.5B: HF_HUB_OFFLINE is set and its config.json is not in the Hugging Face cache"),
        "{err}"
    );
}

#[test]
fn a_gated_repository_needs_the_token() {
    let home = Home::new("gated");
    let hub = Hub::start();
    let (ok, _, err) = plan(&home.0, &hub.endpoint, &[], "gated/Llama-3.2-1B");
    assert!(!ok);
    assert!(err.contains("gated") && err.contains("HF_TOKEN"), "{err}");
    let (ok, out, err) = plan(
        &home.0,
        &hub.endpoint,
        &[("HF_TOKEN", TOKEN)],
        "gated/Llama-3.2-1B",
    );
    assert!(ok, "{err}");
    let (_, local, _) = plan(
        &home.0,
        &hub.endpoint,
        &[],
        &format!("{DIR}/Llama-3.2-1B.json"),
    );
    assert_eq!(out, local);
    // The token file `hf auth login` writes works too.
    let home = Home::new("gated-file");
    std::fs::write(home.0.join("token"), format!("{TOKEN}\n")).expect("token");
    let (ok, _, err) = plan(&home.0, &hub.endpoint, &[], "gated/Llama-3.2-1B");
    assert!(ok, "{err}");
}

#[test]
fn hub_errors_say_what_to_do() {
    let home = Home::new("errors");
    let hub = Hub::start();
    let (ok, _, err) = plan(&home.0, &hub.endpoint, &[], "nobody/no-such-model");
    assert!(!ok);
    assert!(
        err.contains("nobody/no-such-model: not found on") && err.contains("revision main"),
        "{err}"
    );
    let (ok, _, err) = plan(&home.0, &hub.endpoint, &[], "Qwen/Qwen2.5-1.5B@nope");
    assert!(!ok);
    assert!(err.contains("no revision `nope`"), "{err}");
    let (ok, _, err) = plan(&home.0, &hub.endpoint, &[], "sentence/encoder");
    assert!(!ok);
    assert!(err.contains("config.json has no `model_type`"), "{err}");
    let (ok, _, err) = plan(
        &home.0,
        &hub.endpoint,
        &[("HF_HUB_DOWNLOAD_TIMEOUT", "1")],
        "slow/model",
    );
    assert!(!ok);
    assert!(
        err.contains(&format!("no answer from {} within 1 s", hub.endpoint)),
        "{err}"
    );
    let (ok, _, err) = plan(&home.0, &hub.endpoint, &[], "org/bad name");
    assert!(!ok);
    assert!(err.contains("not a Hub model id"), "{err}");
    // A preset name with a slash stays the preset.
    let (ok, out, err) = vramlab(
        &home.0,
        &hub.endpoint,
        &[],
        &["plan", "--model", "ViT-B/16", "--batch", "2"],
    );
    assert!(ok, "{err}");
    assert!(out.contains("vit_b_16"), "{out}");
}
