//! Multi-GPU exports: DeepSpeed's `zero_optimization` block, accelerate config YAML for
//! FSDP and DeepSpeed, the `torchrun` command line and an FSDP2 snippet, from a plan's
//! [`Distributed`] setup. Key names follow DeepSpeed's `runtime/zero/config.py` and
//! accelerate's `config` command (`fsdp_config` / `deepspeed_config`).

use serde_json::{Value, json};

use crate::plan::TrainConfig;
use crate::plan::config::Precision;
use crate::plan::distributed::{Distributed, FsdpMixedPrecision, Offload, Strategy};
use crate::plan::finetune::FineTuneMode;

use super::python::py_bool;

/// DeepSpeed's `zero_optimization` for `d` (`{"stage": 0}` for one GPU and DDP).
pub fn zero_optimization(d: &Distributed) -> Value {
    let stage = d.strategy.zero_stage();
    if stage == 0 {
        return json!({"stage": 0});
    }
    let mut z = serde_json::Map::new();
    z.insert("stage".into(), json!(stage));
    // The value the plan ran with (DeepSpeed's default when unset: True for stage 3 only).
    z.insert("overlap_comm".into(), json!(d.overlap_comm_effective()));
    z.insert("contiguous_gradients".into(), json!(d.contiguous_gradients));
    z.insert("reduce_bucket_size".into(), json!(d.zero_bucket_elems));
    if stage < 3 {
        z.insert(
            "allgather_bucket_size".into(),
            json!(d.allgather_bucket_elems.unwrap_or(d.zero_bucket_elems)),
        );
        z.insert("reduce_scatter".into(), json!(true));
    } else {
        z.insert(
            "stage3_prefetch_bucket_size".into(),
            json!(d.prefetch_elems),
        );
        z.insert(
            "stage3_param_persistence_threshold".into(),
            json!(d.persistence_threshold),
        );
        z.insert(
            "stage3_max_live_parameters".into(),
            json!(d.max_live_params),
        );
        z.insert(
            "stage3_max_reuse_distance".into(),
            json!(d.max_reuse_distance.unwrap_or(d.max_live_params)),
        );
    }
    if d.offload != Offload::None {
        z.insert(
            "offload_optimizer".into(),
            json!({"device": "cpu", "pin_memory": true}),
        );
    }
    if d.offload == Offload::Params {
        z.insert(
            "offload_param".into(),
            json!({"device": "cpu", "pin_memory": true}),
        );
    }
    Value::Object(z)
}

fn mixed_precision(cfg: &TrainConfig) -> &'static str {
    match (cfg.precision, cfg.distributed.mixed_precision) {
        (_, FsdpMixedPrecision::Bf16) | (Precision::AmpBf16 | Precision::Bf16, _) => "bf16",
        (_, FsdpMixedPrecision::Fp16) | (Precision::AmpFp16, _) => "fp16",
        _ => "no",
    }
}

/// An accelerate config YAML (`accelerate launch --config_file …`): FSDP (version 2) for
/// FSDP2, DeepSpeed for ZeRO, MULTI_GPU for DDP.
pub fn accelerate_yaml(cfg: &TrainConfig) -> String {
    let d = cfg.distributed;
    let world = d.world();
    let kind = match d.strategy {
        Strategy::Fsdp2 => "FSDP",
        Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => "DEEPSPEED",
        Strategy::Ddp | Strategy::TorchZero1 => "MULTI_GPU",
        Strategy::None => "NO",
    };
    let mut s = String::from("compute_environment: LOCAL_MACHINE\n");
    s.push_str(&format!("distributed_type: {kind}\n"));
    s.push_str(&format!("mixed_precision: {}\n", mixed_precision(cfg)));
    s.push_str(&format!(
        "num_machines: {}\nnum_processes: {world}\nmachine_rank: 0\nmain_training_function: main\nuse_cpu: false\n",
        d.nodes
    ));
    match d.strategy {
        Strategy::Fsdp2 => {
            s.push_str("fsdp_config:\n  fsdp_version: 2\n");
            s.push_str("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n");
            s.push_str(&format!(
                "  fsdp_reshard_after_forward: {}\n",
                d.reshard_after_forward
            ));
            s.push_str(&format!(
                "  fsdp_offload_params: {}\n",
                d.offload != Offload::None
            ));
            s.push_str(&format!(
                "  fsdp_activation_checkpointing: {}\n",
                cfg.checkpointing
            ));
            s.push_str("  fsdp_state_dict_type: SHARDED_STATE_DICT\n");
            s.push_str("  fsdp_cpu_ram_efficient_loading: true\n");
        }
        Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => {
            s.push_str("deepspeed_config:\n");
            s.push_str(&format!("  zero_stage: {}\n", d.strategy.zero_stage()));
            s.push_str(&format!("  gradient_accumulation_steps: {}\n", cfg.accum));
            let dev = |on: bool| if on { "cpu" } else { "none" };
            s.push_str(&format!(
                "  offload_optimizer_device: {}\n",
                dev(d.offload != Offload::None)
            ));
            s.push_str(&format!(
                "  offload_param_device: {}\n",
                dev(d.offload == Offload::Params)
            ));
            s.push_str(&format!(
                "  zero3_init_flag: {}\n",
                d.strategy == Strategy::Zero3
            ));
        }
        Strategy::Ddp | Strategy::TorchZero1 | Strategy::None => {}
    }
    s
}

/// A DDP + `ZeroRedundancyOptimizer` snippet (PyTorch's ZeRO-1), with the planned reducer
/// options.
pub fn torch_zero1_snippet(cfg: &TrainConfig) -> String {
    let d = cfg.distributed;
    let view = py_bool(d.gradient_as_bucket_view);
    format!(
        "# {world} ranks: {launch}\
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(\"nccl\")
rank = dist.get_rank() % torch.cuda.device_count()
torch.cuda.set_device(rank)
model = build_model().cuda()  # your model
{adapters}model = DDP(model, device_ids=[rank], bucket_cap_mb={cap}, gradient_as_bucket_view={view})
# each rank keeps the optimizer state of its own parameters (greedy by size)
optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
# micro-batch {micro} per rank x accumulation {accum} x {world} ranks = global batch {global}
",
        world = d.world(),
        launch = torchrun(cfg),
        cap = d.bucket_cap_mb,
        micro = cfg.batch,
        accum = cfg.accum,
        global = cfg.global_batch(),
        adapters = adapter_lines(cfg),
    )
}

/// A LoRA / QLoRA plan's adapters, added to `model` before it is wrapped or sharded (the
/// base frozen, only the adapters train, as planned); empty for a full fine-tune.
fn adapter_lines(cfg: &TrainConfig) -> String {
    if !cfg.finetune.mode.has_adapters() {
        return String::new();
    }
    let mut s = String::from("from peft import LoraConfig, get_peft_model\n");
    if cfg.finetune.mode == FineTuneMode::Qlora {
        s.push_str(
            "# QLoRA: build_model() must load the base 4-bit (BitsAndBytesConfig + \
             prepare_model_for_kbit_training: vramlab export --format peft)\n",
        );
    }
    s.push_str(&super::peft::adapters(cfg));
    s
}

/// The `torchrun` command line for the world (`train.py` stands for the user's script).
pub fn torchrun(cfg: &TrainConfig) -> String {
    let d = cfg.distributed;
    if d.nodes > 1 {
        format!(
            "torchrun --nnodes={} --nproc-per-node={} --node-rank=$NODE_RANK --rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29500 train.py\n",
            d.nodes, d.gpus_per_node
        )
    } else {
        format!(
            "torchrun --standalone --nproc-per-node={} train.py\n",
            d.gpus_per_node
        )
    }
}

/// An FSDP2 snippet: `fully_shard` per block and the root, with the planned options; for
/// `torch-zero1`, the DDP + `ZeroRedundancyOptimizer` snippet instead.
pub fn fsdp2_snippet(cfg: &TrainConfig) -> String {
    let d = cfg.distributed;
    if d.strategy == Strategy::TorchZero1 {
        return torch_zero1_snippet(cfg);
    }
    let mp = match d.mixed_precision {
        FsdpMixedPrecision::None => "MixedPrecisionPolicy()".to_string(),
        FsdpMixedPrecision::Bf16 => {
            "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)".into()
        }
        FsdpMixedPrecision::Fp16 => {
            "MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)".into()
        }
    };
    let offload = if d.offload != Offload::None {
        ", offload_policy=CPUOffloadPolicy()"
    } else {
        ""
    };
    let reshard = py_bool(d.reshard_after_forward);
    format!(
        "# {world} ranks: {launch}\
import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

dist.init_process_group(\"nccl\")
torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
with torch.device(\"meta\"):
    model = build_model()  # your model
{adapters}mp = {mp}
for block in {layers}:  # each transformer block is one unit
    fully_shard(block, mp_policy=mp, reshard_after_forward={reshard}{offload})
fully_shard(model, mp_policy=mp, reshard_after_forward={reshard}{offload})
model.to_empty(device=\"cuda\")
model.init_weights()  # or load a sharded checkpoint
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
# micro-batch {micro} per rank x accumulation {accum} x {world} ranks = global batch {global}
",
        world = d.world(),
        launch = torchrun(cfg),
        micro = cfg.batch,
        accum = cfg.accum,
        global = cfg.global_batch(),
        adapters = adapter_lines(cfg),
        // A PeftModel wraps the model twice (PeftModel → LoraModel → the model).
        layers = if cfg.finetune.mode.has_adapters() {
            "model.base_model.model.model.layers"
        } else {
            "model.model.layers"
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(st: Strategy, gpus: u32) -> TrainConfig {
        TrainConfig {
            distributed: Distributed::new(gpus, st),
            ..TrainConfig::default()
        }
    }

    #[test]
    fn zero_block_carries_stage_offload_and_buckets() {
        let mut c = cfg(Strategy::Zero3, 8);
        c.distributed.offload = Offload::Params;
        let z = zero_optimization(&c.distributed);
        assert_eq!(z["stage"], 3);
        assert_eq!(z["offload_param"]["device"], "cpu");
        assert_eq!(z["offload_optimizer"]["device"], "cpu");
        assert_eq!(z["stage3_prefetch_bucket_size"], 50_000_000);
        let z2 = zero_optimization(&cfg(Strategy::Zero2, 4).distributed);
        assert_eq!(z2["stage"], 2);
        assert_eq!(z2["reduce_bucket_size"], 500_000_000);
        assert!(z2.get("offload_optimizer").is_none());
        assert_eq!(zero_optimization(&Distributed::default())["stage"], 0);
    }

    #[test]
    fn accelerate_torchrun_and_snippet() {
        let mut c = cfg(Strategy::Fsdp2, 4);
        c.distributed.reshard_after_forward = false;
        c.distributed.mixed_precision = FsdpMixedPrecision::Bf16;
        let y = accelerate_yaml(&c);
        assert!(y.contains("distributed_type: FSDP") && y.contains("fsdp_version: 2"));
        assert!(y.contains("fsdp_reshard_after_forward: false") && y.contains("num_processes: 4"));
        assert!(accelerate_yaml(&cfg(Strategy::Zero2, 8)).contains("zero_stage: 2"));
        assert_eq!(
            torchrun(&c),
            "torchrun --standalone --nproc-per-node=4 train.py\n"
        );
        let s = fsdp2_snippet(&c);
        assert!(s.contains("reshard_after_forward=False") && s.contains("torch.bfloat16"));
        assert!(s.contains("global batch 32"));
        let z = fsdp2_snippet(&cfg(Strategy::TorchZero1, 4));
        assert!(z.contains("ZeroRedundancyOptimizer(") && z.contains("bucket_cap_mb=25"));
        assert!(accelerate_yaml(&cfg(Strategy::TorchZero1, 4)).contains("MULTI_GPU"));
    }

    /// A LoRA plan's multi-GPU snippets add the adapters before wrapping or sharding.
    #[test]
    fn snippets_carry_lora_adapters() {
        let mut c = cfg(Strategy::Fsdp2, 4);
        c.finetune.mode = FineTuneMode::Lora;
        let s = fsdp2_snippet(&c);
        let peft = s
            .find("model = get_peft_model(model, lora_config)")
            .expect(&s);
        assert!(peft < s.find("fully_shard(block").expect(&s), "{s}");
        assert!(s.contains("model.base_model.model.model.layers"), "{s}");
        let mut z = cfg(Strategy::TorchZero1, 4);
        z.finetune.mode = FineTuneMode::Qlora;
        let s = fsdp2_snippet(&z);
        let peft = s.find("get_peft_model(model, lora_config)").expect(&s);
        assert!(peft < s.find("model = DDP(").expect(&s), "{s}");
        assert!(s.contains("--format peft"), "{s}");
        assert!(!fsdp2_snippet(&cfg(Strategy::Fsdp2, 4)).contains("peft"));
    }

    #[test]
    fn zero_knobs_are_written_as_planned() {
        // Defaults: overlap_comm False for stages 1/2, True for 3 (config.py:384-386).
        assert_eq!(
            zero_optimization(&cfg(Strategy::Zero2, 4).distributed)["overlap_comm"],
            false
        );
        assert_eq!(
            zero_optimization(&cfg(Strategy::Zero3, 4).distributed)["overlap_comm"],
            true
        );
        let mut d = Distributed::new(8, Strategy::Zero2);
        d.overlap_comm = Some(true);
        d.contiguous_gradients = false;
        d.zero_bucket_elems = 200_000_000;
        d.allgather_bucket_elems = Some(100_000_000);
        let z = zero_optimization(&d);
        assert_eq!(z["overlap_comm"], true);
        assert_eq!(z["contiguous_gradients"], false);
        assert_eq!(z["reduce_bucket_size"], 200_000_000);
        assert_eq!(z["allgather_bucket_size"], 100_000_000);
        let mut d = Distributed::new(8, Strategy::Zero3);
        d.persistence_threshold = 0;
        d.max_reuse_distance = Some(7);
        d.max_live_params = 3;
        d.prefetch_elems = 5;
        let z = zero_optimization(&d);
        assert_eq!(z["stage3_param_persistence_threshold"], 0);
        assert_eq!(z["stage3_max_reuse_distance"], 7);
        assert_eq!(z["stage3_max_live_parameters"], 3);
        assert_eq!(z["stage3_prefetch_bucket_size"], 5);
    }
}
