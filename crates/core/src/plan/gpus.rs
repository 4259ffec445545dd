//! The GPU catalog (`presets/gpus.json`).

use serde::{Deserialize, Serialize};

use crate::units::Bytes;

/// One GPU model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub id: String,
    pub name: String,
    /// Total device memory in MiB as the driver reports it.
    pub memory_mib: u64,
    pub fp32_tflops: f64,
    pub fp16_tflops: f64,
    pub bf16_tflops: f64,
    pub bandwidth_gbps: f64,
    /// Whether `memory_mib` was read off a real device (else the datasheet).
    pub measured: bool,
    /// Memory the driver keeps from CUDA even on an idle device: NVML's total minus
    /// `cuMemGetInfo`'s (measured: H200 616 MiB, H100 80GB HBM3 480 MiB); 0 where unknown.
    #[serde(default)]
    pub driver_reserved_mib: u64,
}

impl Gpu {
    /// Memory a process can allocate: the driver's total less its idle reservation.
    pub fn memory(&self) -> Bytes {
        Bytes(
            self.memory_mib
                .saturating_sub(self.driver_reserved_mib)
                .saturating_mul(1 << 20),
        )
    }

    /// Whether the card is known to lack bf16 tensor cores (T4, V100: pre-Ampere), where
    /// bf16 matmuls are emulated or refused. Unknown throughput (a detected card) is not
    /// taken as lacking.
    pub fn lacks_bf16(&self) -> bool {
        self.bf16_tflops == 0.0 && self.fp16_tflops > 0.0
    }

    /// A GPU detected at run time (NVML name and total bytes). The driver's idle reservation
    /// (which NVML's total includes) is taken from the `catalog` entry of the same name or the
    /// same total, where there is one.
    pub fn detected(name: &str, total: Bytes, catalog: &[Gpu]) -> Gpu {
        let memory_mib = total.0 >> 20;
        let known = catalog.iter().find(|g| {
            g.driver_reserved_mib > 0
                && (g.name.eq_ignore_ascii_case(name) || g.memory_mib == memory_mib)
        });
        Gpu {
            id: "detected".into(),
            name: name.to_string(),
            memory_mib,
            fp32_tflops: 0.0,
            fp16_tflops: 0.0,
            bf16_tflops: 0.0,
            bandwidth_gbps: 0.0,
            measured: true,
            driver_reserved_mib: known.map_or(0, |g| g.driver_reserved_mib),
        }
    }
}

#[derive(Deserialize)]
struct Catalog {
    #[allow(dead_code)]
    source: String,
    gpus: Vec<Gpu>,
}

const CATALOG: &str = include_str!("../../../../presets/gpus.json");

/// The built-in catalog.
pub fn catalog() -> Vec<Gpu> {
    serde_json::from_str::<Catalog>(CATALOG)
        .map(|c| c.gpus)
        .unwrap_or_default()
}

/// The catalog's card with this id, for the core's tests (the names users type for a card
/// are read by `vramlab-words`).
#[cfg(test)]
pub(crate) fn card(id: &str) -> Result<Gpu, String> {
    catalog()
        .into_iter()
        .find(|g| g.id == id)
        .ok_or_else(|| format!("no card `{id}` in the catalog"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_parses_and_is_ordered_by_memory_sensibly() {
        let c = catalog();
        assert!(c.len() >= 10);
        assert!(c.iter().any(|g| g.id == "t4"));
        assert!(c.iter().all(|g| g.memory_mib > 8000));
    }

    #[test]
    fn a_detected_h200_loses_the_driver_reservation() {
        let total = Bytes(143_771 << 20);
        let g = Gpu::detected("NVIDIA H200", total, &catalog());
        assert_eq!(g.memory(), Bytes((143_771 - 616) << 20));
        // Unknown cards keep NVML's total.
        let other = Gpu::detected("Some GPU", Bytes(10_000 << 20), &catalog());
        assert_eq!(other.memory(), Bytes(10_000 << 20));
    }
}
