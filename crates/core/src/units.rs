//! Byte quantities with IEC display; arithmetic is checked, never wraps.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A number of bytes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

/// One kibibyte, mebibyte and gibibyte in bytes.
pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

impl Bytes {
    pub const ZERO: Bytes = Bytes(0);

    /// `n` gibibytes.
    pub const fn gib(n: u64) -> Self {
        Bytes(n * GIB)
    }

    /// `n` mebibytes.
    pub const fn mib(n: u64) -> Self {
        Bytes(n * MIB)
    }

    /// The value in GiB as a float, for plots and display only.
    pub fn as_gib_f64(self) -> f64 {
        self.0 as f64 / GIB as f64
    }

    /// Checked addition.
    pub fn checked_add(self, other: Bytes) -> Option<Bytes> {
        self.0.checked_add(other.0).map(Bytes)
    }

    /// Saturating subtraction.
    pub fn saturating_sub(self, other: Bytes) -> Bytes {
        Bytes(self.0.saturating_sub(other.0))
    }

    /// Parses "24GiB", "24 GB" (taken as GiB for GPU sizes is wrong, so GB = 10^9), "512MiB", "1234".
    pub fn parse(text: &str) -> Option<Bytes> {
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
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b < KIB {
            write!(f, "{b} B")
        } else if b < MIB {
            write!(f, "{:.2} KiB", b as f64 / KIB as f64)
        } else if b < GIB {
            write!(f, "{:.2} MiB", b as f64 / MIB as f64)
        } else if b < 1024 * GIB {
            write!(f, "{:.2} GiB", b as f64 / GIB as f64)
        } else {
            write!(f, "{:.2} TiB", b as f64 / (1024 * GIB) as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_iec_units() {
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(1536).to_string(), "1.50 KiB");
        assert_eq!(Bytes(5_744_000_000).to_string(), "5.35 GiB");
        assert_eq!(Bytes::gib(24).to_string(), "24.00 GiB");
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(Bytes::parse("24GiB"), Some(Bytes::gib(24)));
        assert_eq!(Bytes::parse("512 MiB"), Some(Bytes::mib(512)));
        assert_eq!(Bytes::parse("80GB"), Some(Bytes(80_000_000_000)));
        assert_eq!(Bytes::parse("12"), Some(Bytes(12)));
        assert_eq!(Bytes::parse("lots"), None);
        assert_eq!(Bytes::parse("1e400"), None);
        assert_eq!(Bytes::parse("-3GiB"), None);
    }

    #[test]
    fn arithmetic_is_checked() {
        assert_eq!(Bytes(u64::MAX).checked_add(Bytes(1)), None);
        assert_eq!(Bytes(3).saturating_sub(Bytes(5)), Bytes(0));
    }
}
