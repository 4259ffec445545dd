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
    fn arithmetic_is_checked() {
        assert_eq!(Bytes(u64::MAX).checked_add(Bytes(1)), None);
        assert_eq!(Bytes(3).saturating_sub(Bytes(5)), Bytes(0));
    }
}
