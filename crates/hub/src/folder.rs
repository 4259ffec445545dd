//! A model folder (a `git clone` of a Hub repository, a `save_pretrained` output): its
//! `config.json`, the stored dtypes its safetensors headers list, and whether its
//! `quantization_config` says the checkpoint is pre-quantized.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use vramlab_core::fsutil::{self, FileKind};

use crate::error::HubError;
use crate::resolve::check_config;

/// The most bytes of a safetensors header read (the `safetensors` library's
/// `MAX_HEADER_SIZE`: a header above it is refused there too).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// What a model folder holds.
#[derive(Debug, Clone)]
pub struct Folder {
    pub config_path: PathBuf,
    pub text: String,
    /// The folder's name (the repository's name in a clone).
    pub name: String,
    /// The safetensors weights, when the folder has them.
    pub weights: Option<Weights>,
    /// The config's `quantization_config`, when it has one.
    pub prequantized: Option<Prequantized>,
}

/// The tensors the safetensors headers list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Weights {
    pub files: usize,
    pub tensors: u64,
    /// Elements stored per safetensors dtype name (`BF16`, `F32`, `U8`, …).
    pub elements: BTreeMap<String, u64>,
    /// Bytes stored per dtype name (the tensors' data, headers excluded).
    pub bytes: BTreeMap<String, u64>,
}

/// A checkpoint whose weights are stored quantized (`quantization_config.quant_method`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prequantized {
    /// bitsandbytes 4-bit: `bnb_4bit_quant_type` (nf4 or fp4) and
    /// `bnb_4bit_use_double_quant`.
    Bnb4 {
        quant_type: String,
        double_quant: bool,
    },
    /// bitsandbytes LLM.int8.
    Bnb8,
    /// Any other method (gptq, awq, fp8, compressed-tensors, …), by name.
    Other(String),
}

impl Prequantized {
    /// The QLoRA base this storage is, with its double quantization: bitsandbytes 4-bit
    /// (`nf4` / `fp4`) or LLM.int8; `None` for storage the planner does not model.
    pub fn qlora_base(&self) -> Option<(vramlab_core::plan::finetune_mode::Quant, bool)> {
        use vramlab_core::plan::finetune_mode::Quant;
        match self {
            Prequantized::Bnb4 {
                quant_type,
                double_quant,
            } => match quant_type.as_str() {
                "nf4" => Some((Quant::Nf4, *double_quant)),
                "fp4" => Some((Quant::Fp4, *double_quant)),
                _ => None,
            },
            Prequantized::Bnb8 => Some((Quant::Int8, false)),
            Prequantized::Other(_) => None,
        }
    }
}

impl std::fmt::Display for Prequantized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Prequantized::Bnb4 {
                quant_type,
                double_quant,
            } => write!(
                f,
                "bitsandbytes 4-bit {quant_type}{}",
                if *double_quant {
                    ", double quantization"
                } else {
                    ""
                }
            ),
            Prequantized::Bnb8 => f.write_str("bitsandbytes 8-bit (LLM.int8)"),
            Prequantized::Other(m) => write!(f, "{m}"),
        }
    }
}

fn folder_err(path: &Path, reason: impl Into<String>) -> HubError {
    HubError::Folder {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Reads a model folder: `config.json` (required, with a `model_type`), then the
/// safetensors headers of `model.safetensors.index.json`'s files or of `model.safetensors`.
pub fn read(dir: &Path) -> Result<Folder, HubError> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(folder_err(
            dir,
            "a directory without a config.json: a model folder must hold one (the \
             transformers model config: a clone or `save_pretrained` output of a Hub model)",
        ));
    }
    let text = fsutil::read_bounded_string(&config_path, FileKind::Model)
        .map_err(|e| folder_err(&config_path, e.to_string()))?;
    check_config(&text, &config_path.display().to_string())?;
    let name = dir
        .canonicalize()
        .ok()
        .as_deref()
        .unwrap_or(dir)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("model")
        .to_string();
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| folder_err(&config_path, e.to_string()))?;
    Ok(Folder {
        prequantized: prequantized(&v),
        weights: weights(dir)?,
        config_path,
        text,
        name,
    })
}

/// The config's `quantization_config`, read as transformers' quantizers read it.
pub fn prequantized(config: &serde_json::Value) -> Option<Prequantized> {
    let q = config.get("quantization_config")?;
    let method = q
        .get("quant_method")
        .and_then(|m| m.as_str())
        .unwrap_or("unknown")
        .to_string();
    let flag = |k: &str| {
        q.get(k)
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false)
    };
    Some(match method.as_str() {
        "bitsandbytes" if flag("load_in_4bit") => Prequantized::Bnb4 {
            quant_type: q
                .get("bnb_4bit_quant_type")
                .and_then(|t| t.as_str())
                .unwrap_or("fp4")
                .to_string(),
            double_quant: flag("bnb_4bit_use_double_quant"),
        },
        "bitsandbytes" if flag("load_in_8bit") => Prequantized::Bnb8,
        _ => Prequantized::Other(method),
    })
}

/// The shard names `model.safetensors.index.json` lists (its `weight_map` values), each a
/// file name in the folder (a path elsewhere is refused), sorted and without repeats.
pub fn parse_index(text: &str) -> Result<Vec<String>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no `weight_map` object")?;
    let mut names = BTreeSet::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| format!("weight_map.{tensor}: not a file name"))?;
        // A shard is a file of this folder: a path elsewhere is refused.
        if file.is_empty() || file.contains(['/', '\\', '\0']) || file == ".." || file == "." {
            return Err(format!(
                "weight_map.{tensor}: `{file}` is not a file name in this folder"
            ));
        }
        names.insert(file.to_string());
    }
    Ok(names.into_iter().collect())
}

/// The safetensors files of the folder: the index's shards, else `model.safetensors`.
fn weights(dir: &Path) -> Result<Option<Weights>, HubError> {
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if index.is_file() {
        let text = fsutil::read_bounded_string(&index, FileKind::Model)
            .map_err(|e| folder_err(&index, e.to_string()))?;
        parse_index(&text)
            .map_err(|e| folder_err(&index, e))?
            .into_iter()
            .map(|n| dir.join(n))
            .collect()
    } else if dir.join("model.safetensors").is_file() {
        vec![dir.join("model.safetensors")]
    } else {
        return Ok(None);
    };
    let mut w = Weights {
        files: files.len(),
        ..Weights::default()
    };
    for f in &files {
        let file = std::fs::File::open(f).map_err(|e| folder_err(f, e.to_string()))?;
        parse_header(file, &mut w).map_err(|e| folder_err(f, e))?;
    }
    Ok(Some(w))
}

/// Adds one safetensors file's tensors to `w`, reading at most `8 + MAX_HEADER_BYTES`
/// bytes of it: an 8-byte little-endian header length, then that many bytes of JSON
/// (`{"name": {"dtype", "shape", "data_offsets"}, "__metadata__": {…}}`).
pub fn parse_header(r: impl Read, w: &mut Weights) -> Result<(), String> {
    let mut file = r.take(8 + MAX_HEADER_BYTES);
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .map_err(|e| format!("not a safetensors file (no 8-byte header length: {e})"))?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES {
        return Err(format!(
            "not a safetensors file: its header length says {n} bytes, above the \
             {MAX_HEADER_BYTES}-byte limit safetensors itself sets"
        ));
    }
    let mut header = Vec::new();
    (&mut file)
        .take(n)
        .read_to_end(&mut header)
        .map_err(|e| e.to_string())?;
    if header.len() as u64 != n {
        return Err(format!(
            "safetensors header cut short: {} of the {n} bytes its length says",
            header.len()
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&header)
        .map_err(|e| format!("safetensors header is not JSON: {e}"))?;
    let obj = v
        .as_object()
        .ok_or("safetensors header is not a JSON object")?;
    for (name, t) in obj.iter().filter(|(k, _)| *k != "__metadata__") {
        let bad = |what: &str| format!("tensor {name}: {what}");
        let dtype = t
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad("no dtype"))?;
        let shape = t
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("no shape"))?;
        let elements = shape.iter().try_fold(1u64, |acc, d| {
            d.as_u64()
                .and_then(|d| acc.checked_mul(d))
                .ok_or_else(|| bad("shape is not a list of sizes"))
        })?;
        let bytes = match t
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .map(Vec::as_slice)
        {
            Some([a, b]) => match (a.as_u64(), b.as_u64()) {
                (Some(a), Some(b)) if b >= a => b - a,
                _ => return Err(bad("data_offsets are not [start, end]")),
            },
            _ => return Err(bad("no data_offsets")),
        };
        w.tensors += 1;
        let e = w.elements.entry(dtype.to_string()).or_default();
        *e = e.saturating_add(elements);
        let b = w.bytes.entry(dtype.to_string()).or_default();
        *b = b.saturating_add(bytes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn safetensors(header: &str) -> Vec<u8> {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b
    }

    #[test]
    fn folders_report_stored_dtypes_and_quantization() {
        let dir = std::env::temp_dir().join(format!("vramlab-folder-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        assert!(read(&dir).is_err());
        std::fs::write(
            dir.join("config.json"),
            r#"{"model_type":"llama","quantization_config":{"quant_method":"bitsandbytes",
                "load_in_4bit":true,"bnb_4bit_quant_type":"nf4","bnb_4bit_use_double_quant":true}}"#,
        )
        .expect("config");
        std::fs::write(
            dir.join("a.safetensors"),
            safetensors(
                r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[4,8],"data_offsets":[0,64]},
                    "q":{"dtype":"U8","shape":[16,1],"data_offsets":[64,80]}}"#,
            ),
        )
        .expect("shard");
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"weight_map":{"w":"a.safetensors","q":"a.safetensors"}}"#,
        )
        .expect("index");
        let f = read(&dir).expect("folder");
        let w = f.weights.expect("weights");
        assert_eq!((w.files, w.tensors), (1, 2));
        assert_eq!(w.elements.get("BF16"), Some(&32));
        assert_eq!(w.bytes.get("U8"), Some(&16));
        assert_eq!(
            f.prequantized,
            Some(Prequantized::Bnb4 {
                quant_type: "nf4".into(),
                double_quant: true
            })
        );
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            r#"{"weight_map":{"w":"../a.safetensors"}}"#,
        )
        .expect("index");
        assert!(read(&dir).is_err());
        std::fs::write(dir.join("config.json"), r#"{"architectures":["X"]}"#).expect("config");
        let e = read(&dir).expect_err("no model_type").to_string();
        assert!(e.contains("no `model_type`"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_headers_are_clear_errors_read_within_the_bound() {
        let mut w = Weights::default();
        // A length above the limit: refused before anything is read.
        let huge = u64::MAX.to_le_bytes();
        let e = parse_header(&huge[..], &mut w).expect_err("huge");
        assert!(e.contains("above the 100000000-byte limit"), "{e}");
        let e = parse_header(&[1u8, 2][..], &mut w).expect_err("short");
        assert!(e.contains("no 8-byte header length"), "{e}");
        let mut cut = 100u64.to_le_bytes().to_vec();
        cut.extend_from_slice(b"{}");
        let e = parse_header(&cut[..], &mut w).expect_err("cut");
        assert!(e.contains("cut short: 2 of the 100 bytes"), "{e}");
        let e = parse_header(&safetensors("{\"a\":")[..], &mut w).expect_err("json");
        assert!(e.contains("not JSON"), "{e}");
        let e = parse_header(&safetensors("[]")[..], &mut w).expect_err("array");
        assert!(e.contains("not a JSON object"), "{e}");
        for (bad, says) in [
            (
                r#"{"t":{"shape":[1],"data_offsets":[0,2]}}"#,
                "tensor t: no dtype",
            ),
            (
                r#"{"t":{"dtype":"F16","shape":[-1],"data_offsets":[0,2]}}"#,
                "not a list of sizes",
            ),
            (
                r#"{"t":{"dtype":"F16","shape":[4294967296,4294967296],"data_offsets":[0,2]}}"#,
                "not a list of sizes",
            ),
            (
                r#"{"t":{"dtype":"F16","shape":[1],"data_offsets":[2,0]}}"#,
                "not [start, end]",
            ),
            (r#"{"t":{"dtype":"F16","shape":[1]}}"#, "no data_offsets"),
        ] {
            let e = parse_header(&safetensors(bad)[..], &mut w).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(
            w,
            Weights::default(),
            "nothing counted from refused headers"
        );
        // A header of exactly its length, data after it not read.
        let mut ok = safetensors(r#"{"t":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}}"#);
        ok.extend_from_slice(&[0xff; 6]);
        parse_header(&ok[..], &mut w).expect("header");
        assert_eq!((w.tensors, w.elements.get("F16")), (1, Some(&3)));
        // The index: shards of this folder only.
        assert_eq!(
            parse_index(
                r#"{"weight_map":{"a":"x.safetensors","b":"x.safetensors","c":"y.safetensors"}}"#
            ),
            Ok(vec![
                "x.safetensors".to_string(),
                "y.safetensors".to_string()
            ])
        );
        for bad in [
            "{}",
            "[",
            r#"{"weight_map":{"a":3}}"#,
            r#"{"weight_map":{"a":""}}"#,
            r#"{"weight_map":{"a":"/etc/passwd"}}"#,
            r#"{"weight_map":{"a":"..\\x"}}"#,
        ] {
            assert!(parse_index(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// Any bytes: stored dtypes or an error, never a panic (a length prefix may claim
        /// anything).
        #[test]
        fn any_bytes_are_an_answer_or_an_error(
            data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..96),
            claimed in proptest::prelude::any::<u64>(),
        ) {
            let mut w = Weights::default();
            let _ = parse_header(&data[..], &mut w);
            let mut prefixed = claimed.to_le_bytes().to_vec();
            prefixed.extend_from_slice(&data);
            let _ = parse_header(&prefixed[..], &mut w);
            let _ = parse_index(&String::from_utf8_lossy(&data));
        }

        /// Headers written as safetensors writes them read back: every tensor counted, its
        /// elements and bytes summed per dtype.
        #[test]
        fn written_headers_read_back(
            tensors in proptest::collection::vec(
                (0..3usize, proptest::collection::vec(0u64..50, 0..4)),
                0..8,
            ),
        ) {
            const DTYPES: [(&str, u64); 3] = [("BF16", 2), ("F32", 4), ("U8", 1)];
            let mut entries = vec![r#""__metadata__":{"format":"pt"}"#.to_string()];
            let mut want = Weights { files: 0, ..Weights::default() };
            let mut offset = 0u64;
            for (i, (d, shape)) in tensors.iter().enumerate() {
                let (dtype, size) = DTYPES[*d];
                let n: u64 = shape.iter().product();
                entries.push(format!(
                    r#""t{i}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{offset},{}]}}"#,
                    offset + n * size
                ));
                offset += n * size;
                want.tensors += 1;
                *want.elements.entry(dtype.to_string()).or_default() += n;
                *want.bytes.entry(dtype.to_string()).or_default() += n * size;
            }
            let mut file = safetensors(&format!("{{{}}}", entries.join(",")));
            file.extend(std::iter::repeat_n(0u8, offset as usize));
            let mut got = Weights::default();
            proptest::prop_assert_eq!(parse_header(&file[..], &mut got), Ok(()));
            proptest::prop_assert_eq!(got, want);
        }
    }
}
