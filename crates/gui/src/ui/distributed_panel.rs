//! The "More than one GPU" section of the left panel: GPUs per node × nodes (of the card
//! chosen above), the strategy, CPU offload and FSDP2's options. Returns a
//! `Command::SetConfig` when something changed, like the other inputs.

use egui::{DragValue, Ui};

use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::distributed::{FsdpMixedPrecision, Offload, Strategy};

use super::{Command, PlannerState, emit};

/// Largest GPUs per node the drag value offers.
const MAX_GPUS_PER_NODE: u32 = 64;
/// Largest node count the drag value offers.
const MAX_NODES: u32 = 1024;

const TIP_STRATEGY: &str = "DDP replicates everything; torch-zero1 (ZeroRedundancyOptimizer) and ZeRO-1 partition optimizer state; ZeRO-2 also gradients; ZeRO-3 and FSDP2 also parameters: FSDP2 gathers one block at a time (plus the prefetched next), ZeRO-3 the running module plus what its prefetcher brings in, up to stage3_max_live_parameters. Peaks are per rank.";
const TIP_OFFLOAD: &str = "Keep optimizer state (and with params, the parameters) in host RAM: less GPU memory, host RAM per rank instead (ZeRO / FSDP2 only).";
const TIP_RESHARD: &str = "FSDP2 reshard_after_forward: free each block's gathered parameters after its forward (off keeps them until backward, like ZeRO-2).";
const TIP_MP: &str = "FSDP2 MixedPrecisionPolicy(param_dtype, reduce_dtype=float32): fp32 shards, 16-bit gathered copies and activations.";

/// The section; emits `SetConfig` on a change.
pub fn distributed_section(state: &PlannerState, ui: &mut Ui, cmd: &mut Option<Command>) {
    let mut cfg: TrainConfig = state.config;
    let changed = egui::CollapsingHeader::new("More than one GPU")
        .id_salt("distributed_section")
        .default_open(cfg.distributed.active())
        .show(ui, |ui| distributed_ui(&mut cfg, ui))
        .body_returned
        .unwrap_or(false);
    if changed && cfg != state.config && cfg.validate().is_ok() {
        emit(cmd, Command::SetConfig(cfg));
    }
}

fn distributed_ui(cfg: &mut TrainConfig, ui: &mut Ui) -> bool {
    let d = &mut cfg.distributed;
    let mut changed = false;
    ui.horizontal(|ui| {
        let l = ui.label("GPUs per node");
        changed |= ui
            .add(DragValue::new(&mut d.gpus_per_node).range(1..=MAX_GPUS_PER_NODE))
            .labelled_by(l.id)
            .changed();
        let l = ui.label("× nodes");
        changed |= ui
            .add(DragValue::new(&mut d.nodes).range(1..=MAX_NODES))
            .labelled_by(l.id)
            .changed();
    });
    ui.horizontal(|ui| {
        let l = ui.label("Strategy").on_hover_text(TIP_STRATEGY);
        egui::ComboBox::from_id_salt("strategy_combo")
            .selected_text(d.strategy.label())
            .show_ui(ui, |ui| {
                for st in Strategy::ALL {
                    changed |= ui
                        .selectable_value(&mut d.strategy, st, st.label())
                        .changed();
                }
            })
            .response
            .labelled_by(l.id);
    });
    if d.strategy.shards_state() {
        ui.horizontal(|ui| {
            ui.label("Offload").on_hover_text(TIP_OFFLOAD);
            for o in Offload::ALL {
                if o == Offload::Params && !d.strategy.shards_params() {
                    continue;
                }
                changed |= ui.radio_value(&mut d.offload, o, o.as_str()).changed();
            }
        });
    } else if d.offload != Offload::None {
        d.offload = Offload::None;
        changed = true;
    }
    if d.offload == Offload::Params && !d.strategy.shards_params() {
        d.offload = Offload::Optimizer;
        changed = true;
    }
    if d.strategy == Strategy::Fsdp2 {
        changed |= ui
            .checkbox(&mut d.reshard_after_forward, "reshard_after_forward")
            .on_hover_text(TIP_RESHARD)
            .changed();
        ui.horizontal(|ui| {
            ui.label("Mixed precision").on_hover_text(TIP_MP);
            for mp in [
                FsdpMixedPrecision::None,
                FsdpMixedPrecision::Bf16,
                FsdpMixedPrecision::Fp16,
            ] {
                changed |= ui
                    .radio_value(&mut d.mixed_precision, mp, mp.as_str())
                    .changed();
            }
        });
    }
    if d.active() {
        ui.label(format!(
            "{} · peaks are per rank · global batch {} × {} × {} = {}",
            d.describe(),
            cfg.batch,
            cfg.accum,
            d.world(),
            cfg.global_batch()
        ));
    }
    changed
}
