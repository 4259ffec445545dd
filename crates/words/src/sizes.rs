//! Sizes as users type them: for `--max-gpu-memory` / `--max-cpu-memory` (`10GiB`, `500MB`,
//! `12345`), read as accelerate reads `max_memory`, and byte sizes with units (`24GiB`,
//! `80 GB`); the planner takes the bytes.

use vramlab_core::plan::PlanError;
use vramlab_core::units::{Bytes, GIB, KIB, MIB};

/// accelerate 1.15 `convert_file_size_to_int`: an integer is bytes; `GiB` / `MiB` / `KiB`
/// (any case) are powers of 1024, `GB` / `MB` / `KB` powers of 1000, and a lowercase final
/// `b` (`"8Gb"`) counts bits (the bytes are divided by 8); the result is truncated to whole
/// bytes (`int(float(...) * unit)`).
pub fn max_memory_bytes(text: &str) -> Result<u64, PlanError> {
    let t = text.trim();
    let err = || PlanError::Field {
        field: "max_memory",
        reason: format!(
            "`{text}` is not a size accelerate reads: give bytes (an integer) or a number with \
             GiB, MiB, KiB, GB, MB or KB (e.g. 10GiB, 500MB, 1.5GB)"
        ),
    };
    if let Ok(b) = t.parse::<u64>() {
        return Ok(b);
    }
    let upper = t.to_ascii_uppercase();
    let units: [(&str, f64, bool); 6] = [
        ("GIB", (1u64 << 30) as f64, false),
        ("MIB", (1u64 << 20) as f64, false),
        ("KIB", 1024.0, false),
        ("GB", 1e9, true),
        ("MB", 1e6, true),
        ("KB", 1e3, true),
    ];
    for (unit, mult, bits) in units {
        if let Some(num) = upper.strip_suffix(unit) {
            let v: f64 = num.trim().parse().map_err(|_| err())?;
            let bytes = v * mult;
            if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
                return Err(err());
            }
            let b = bytes as u64;
            return Ok(if bits && t.ends_with('b') { b / 8 } else { b });
        }
    }
    Err(err())
}

/// A byte size with a unit: "24GiB", "512 MiB", "80GB" (GB = 10^9: a GPU's "GB" taken as
/// GiB would be wrong), "1234" (bytes).
pub fn bytes(text: &str) -> Option<Bytes> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "k" => KIB as f64,
        "mib" | "m" => MIB as f64,
        "gib" | "g" => GIB as f64,
        "tib" | "t" => (GIB * 1024) as f64,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return None,
    };
    let bytes = value * mult;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return None;
    }
    Some(Bytes(bytes.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_accelerate_reads_them() {
        assert_eq!(max_memory_bytes("455MiB").ok(), Some(455 << 20));
        assert_eq!(max_memory_bytes("10GiB").ok(), Some(10 << 30));
        assert_eq!(max_memory_bytes("1.5GB").ok(), Some(1_500_000_000));
        assert_eq!(max_memory_bytes("500MB").ok(), Some(500_000_000));
        assert_eq!(max_memory_bytes("8Gb").ok(), Some(1_000_000_000));
        assert_eq!(max_memory_bytes("12345").ok(), Some(12345));
        // int(0.3 * 2**30) truncates
        assert_eq!(max_memory_bytes("0.3GiB").ok(), Some(322_122_547));
        assert!(max_memory_bytes("lots").is_err());
        assert!(max_memory_bytes("10G").is_err());
    }

    #[test]
    fn byte_sizes_parse_with_their_units() {
        assert_eq!(bytes("24GiB"), Some(Bytes::gib(24)));
        assert_eq!(bytes("512 MiB"), Some(Bytes::mib(512)));
        assert_eq!(bytes("80GB"), Some(Bytes(80_000_000_000)));
        assert_eq!(bytes("12"), Some(Bytes(12)));
        assert_eq!(bytes("lots"), None);
        assert_eq!(bytes("1e400"), None);
        assert_eq!(bytes("-3GiB"), None);
    }
}
