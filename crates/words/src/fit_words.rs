//! `vramlab fit` and `vramlab export` from words: the "make it fit" search's answer (the
//! report `fit --json` prints) and each candidate's settings as words again, so a front end
//! can plan a candidate with the same call it plans the user's configuration with (the
//! Python bindings' `FitCandidate.apply()`); and an export's text. One implementation for
//! the CLI and the bindings.

use serde_json::Value;

use crate::train_words::{Detect, DistWords, Remark, Resolved, Sink, TrainWords};
use vramlab_core::answer::error::{AnswerError, Ctx};
use vramlab_core::answer::warnings;
use vramlab_core::model::Preset;
use vramlab_core::plan::TrainConfig;
use vramlab_core::plan::distributed::{
    DS_BUCKET_ELEMS, DS_MAX_LIVE_PARAMS, DS_PERSISTENCE_THRESHOLD, DS_PREFETCH_ELEMS, Distributed,
    FsdpMixedPrecision, Offload, Strategy,
};
use vramlab_core::plan::fit::cost::Speed;
use vramlab_core::plan::fit::{FitReport, FitRequest, fit};
use vramlab_core::plan::gpus::Gpu;
use vramlab_core::plan::{Attention, Planner};

/// What `vramlab fit` was asked for besides the words.
#[derive(Clone, Copy)]
pub struct FitAsk<'a> {
    /// The micro-batch to start from (`None`: 1, or the saved config's).
    pub batch: Option<u64>,
    /// Samples per optimizer step to keep (`None`: batch × accumulation).
    pub effective_batch: Option<u64>,
    /// Candidates to return at most (at least 1).
    pub top: usize,
    /// Where the step times come from for the card (the CLI: a measured profile when one
    /// was saved, else the catalog's datasheet).
    pub speed: &'a dyn Fn(&Gpu) -> Speed,
}

/// `vramlab fit`'s answer: the search's report and what it was searched for.
#[derive(Debug, Clone)]
pub struct FitAnswer {
    pub report: FitReport,
    pub preset: Preset,
    /// The user's configuration as resolved.
    pub config: TrainConfig,
    pub gpu: Gpu,
    pub budget: vramlab_core::plan::search::Budget,
    /// The words the search started from (a candidate's words are these, changed).
    pub words: TrainWords,
}

impl FitAnswer {
    /// `fit --json`'s object: the report with the model, the card, the usable bytes and the
    /// user's configuration.
    pub fn to_json(&self) -> Result<Value, AnswerError> {
        let mut v = serde_json::to_value(&self.report).plain()?;
        if let Some(o) = v.as_object_mut() {
            o.insert("model".into(), serde_json::json!(self.preset.id));
            o.insert("gpu".into(), serde_json::json!(self.gpu.id));
            o.insert(
                "usable_bytes".into(),
                serde_json::json!(self.budget.usable().0),
            );
            o.insert(
                "user_config".into(),
                serde_json::to_value(self.config).plain()?,
            );
        }
        Ok(v)
    }

    /// The words of candidate `i` (with its micro-batch: [`words_for_config`]).
    pub fn candidate_words(&self, i: usize) -> Result<(TrainWords, u64), AnswerError> {
        let Some(c) = self.report.candidates.get(i) else {
            return Err(AnswerError::new(format!(
                "candidate {i}: the answer has {} candidates",
                self.report.candidates.len()
            )));
        };
        Ok((
            words_for_config(&self.words, &self.preset, &c.config)?,
            c.config.batch,
        ))
    }
}

impl TrainWords {
    /// `vramlab fit`: the words resolved (at micro-batch 1 unless `ask.batch` or a saved
    /// config gives one), the card's warnings said, and the combinations of remedies that
    /// fit, ranked by predicted time per sample.
    pub fn fit_answer(
        &self,
        ask: FitAsk<'_>,
        detect: Detect<'_>,
        sink: Sink<'_>,
    ) -> Result<FitAnswer, AnswerError> {
        if ask.top == 0 {
            return Err(AnswerError::new("--top: must be at least 1"));
        }
        let batch = ask
            .batch
            .or(if self.config.is_some() { None } else { Some(1) });
        let Resolved {
            preset,
            config,
            gpu,
            budget,
            ..
        } = self.resolve(batch, detect, sink)?;
        for w in warnings::for_config(&config, &gpu) {
            sink(Remark::Warning(w));
        }
        let mut req = FitRequest::for_gpu(&gpu, budget.margin);
        req.budget = budget;
        req.effective_batch = ask.effective_batch;
        req.speed = (ask.speed)(&gpu);
        req.top = ask.top;
        let report = fit(&preset, &config, &req).plain()?;
        Ok(FitAnswer {
            report,
            preset,
            config,
            gpu,
            budget,
            words: self.clone(),
        })
    }

    /// `vramlab export --format FORMAT`: the words resolved at `batch`, the step planned
    /// (in the loop the framework runs), and the text of the export. `hub_repo`: the Hub
    /// repository the model came from (exports name it). Returns the text and the format's
    /// name.
    pub fn export(
        &self,
        format: &str,
        batch: Option<u64>,
        hub_repo: Option<&str>,
        detect: Detect<'_>,
        sink: Sink<'_>,
    ) -> Result<(String, &'static str), AnswerError> {
        let format = crate::vocabulary::format(format).ctx("--format")?;
        if let Some(n) = &format.note {
            sink(Remark::Note(n.clone()));
        }
        let format = format.value;
        let Resolved {
            preset,
            config: mut cfg,
            gpu,
            budget,
            custom,
        } = self.resolve(batch, detect, sink)?;
        // HF Trainer, Lightning and the exported PyTorch loop release the model output
        // before backward: what they run is the trainer loop shape, whatever was planned.
        if let Some(loop_shape) = vramlab_core::export::frameworks::implied_loop(format) {
            cfg.loop_shape = loop_shape;
        }
        let plan = Planner::new(&preset, &cfg)
            .plain()?
            .plan(cfg.batch)
            .plain()?;
        let doc = vramlab_core::export::VramlabConfig::new(
            &preset,
            custom,
            cfg,
            &gpu.id,
            budget.margin,
            Some(&plan),
        )
        .to_json();
        // A custom preset may reuse a built-in id for other weights: only built-ins, and a
        // model given by its Hub id, name a Hub id.
        let hub_id = match hub_repo {
            Some(repo) => Some(repo),
            None if custom => None,
            None => preset.hub_id(),
        };
        let text = vramlab_core::export::render(format, &cfg, &plan, &doc, hub_id).plain()?;
        Ok((text, format.as_str()))
    }
}

/// The words that resolve to `cfg` for `preset`: `base`'s model, GPU and margin, and every
/// training setting of `cfg` (defaults left out). [`TrainWords::config`] of the answer at
/// `cfg.batch` is `cfg` again (tested over fit candidates). A saved `--config` file has no
/// words for its training settings: it is refused.
pub fn words_for_config(
    base: &TrainWords,
    preset: &Preset,
    cfg: &TrainConfig,
) -> Result<TrainWords, AnswerError> {
    if base.config.is_some() {
        return Err(AnswerError::new(
            "--config: a saved plan's settings are not words; plan the candidate from its \
             `config` instead",
        ));
    }
    let ft = &cfg.finetune;
    let adapters = ft.mode.has_adapters();
    let qlora = ft.mode == vramlab_core::plan::finetune::FineTuneMode::Qlora;
    let default_ft = vramlab_core::plan::finetune::FineTune::default();
    let tokens = preset.input.is_tokens();
    Ok(TrainWords {
        model: base.model.clone(),
        config: None,
        precision: Some(cfg.precision.as_str().to_string()),
        optimizer: Some(cfg.optimizer.as_str().to_string()),
        seq: cfg.size.filter(|_| tokens),
        target_seq: cfg.target_seq,
        image: cfg.size.filter(|_| !tokens),
        accum: cfg.accum,
        checkpointing: cfg.checkpointing,
        checkpointing_reentrant: cfg.checkpoint_reentrant,
        attention: match cfg.attention {
            Attention::Eager => "eager",
            Attention::Sdpa => "sdpa",
        }
        .to_string(),
        loop_shape: Some(cfg.loop_shape.as_str().to_string()),
        step: (!cfg.step.is_train()).then(|| cfg.step.as_str().to_string()),
        finetune: (ft.mode != default_ft.mode).then(|| ft.mode.as_str().to_string()),
        lora_rank: (adapters && ft.lora_rank != default_ft.lora_rank).then_some(ft.lora_rank),
        lora_targets: (adapters && ft.lora_targets != default_ft.lora_targets)
            .then(|| ft.lora_targets.to_string()),
        lora_dropout: (adapters && !ft.lora_dropout.is_zero()).then(|| ft.lora_dropout.p()),
        freeze_embeddings: ft.freeze_embeddings,
        freeze_blocks: (ft.freeze_blocks > 0).then_some(ft.freeze_blocks),
        lora_merged: ft.lora_merged,
        quant: (qlora && ft.quant != default_ft.quant).then(|| ft.quant.as_str().to_string()),
        no_double_quant: qlora && !ft.double_quant,
        moe_imbalance: (cfg.moe_imbalance != 1.0).then_some(cfg.moe_imbalance),
        expandable_segments: cfg.allocator.expandable_segments,
        max_split_size_mb: cfg.allocator.max_split_size_mb,
        gpu: base.gpu.clone(),
        margin: base.margin,
        dist: dist_words(&cfg.distributed, base.dist.max_gpus),
        preloaded: base.preloaded.clone(),
    })
}

/// The multi-GPU words of `d` (none for one GPU without a strategy).
fn dist_words(d: &Distributed, max_gpus: u64) -> DistWords {
    let mut w = DistWords {
        max_gpus,
        ..DistWords::default()
    };
    if *d == Distributed::default() {
        return w;
    }
    let dflt = Distributed::default();
    let given = |v: u64, default: u64| (v != default).then_some(v);
    w.gpus = Some(d.gpus_per_node.to_string());
    w.nodes = (d.nodes != 1).then_some(d.nodes);
    w.strategy = Some(d.strategy.as_str().to_string());
    w.offload = (d.offload != Offload::None).then(|| d.offload.as_str().to_string());
    if d.strategy == Strategy::Fsdp2 {
        w.no_reshard_after_forward = !d.reshard_after_forward;
        w.fsdp_mixed_precision = (d.mixed_precision != FsdpMixedPrecision::None)
            .then(|| d.mixed_precision.as_str().to_string());
    }
    if d.strategy.uses_ddp() {
        w.bucket_cap_mb = given(d.bucket_cap_mb, dflt.bucket_cap_mb);
        w.gradient_as_bucket_view = d.gradient_as_bucket_view;
    }
    if d.strategy.is_deepspeed() {
        w.reduce_bucket_size = given(d.zero_bucket_elems, DS_BUCKET_ELEMS);
        w.allgather_bucket_size = d.allgather_bucket_elems;
        w.overlap_comm = d.overlap_comm;
        w.no_contiguous_gradients = !d.contiguous_gradients;
    }
    if d.strategy == Strategy::Zero3 {
        w.stage3_prefetch_bucket_size = given(d.prefetch_elems, DS_PREFETCH_ELEMS);
        w.stage3_max_live_parameters = given(d.max_live_params, DS_MAX_LIVE_PARAMS);
        w.stage3_max_reuse_distance = d.max_reuse_distance;
        w.stage3_param_persistence_threshold =
            given(d.persistence_threshold, DS_PERSISTENCE_THRESHOLD);
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_gpu() -> Option<Gpu> {
        None
    }

    fn catalog(g: &Gpu) -> Speed {
        Speed::catalog(g)
    }

    fn ask() -> FitAsk<'static> {
        FitAsk {
            batch: None,
            effective_batch: None,
            top: 10,
            speed: &catalog,
        }
    }

    /// Every candidate's words resolve to the candidate's configuration: over single-GPU
    /// searches (precision, checkpointing, LoRA, optimizer, loop changes) and a multi-GPU
    /// one (strategy switches).
    #[test]
    fn candidate_words_resolve_to_the_candidate() {
        let cases = [
            TrainWords {
                model: Some("Meta-Llama-3-8B".into()),
                seq: Some(2048),
                gpu: Some("rtx-4090".into()),
                ..TrainWords::default()
            },
            TrainWords {
                model: Some("gpt2-large".into()),
                seq: Some(1024),
                precision: Some("fp32".into()),
                gpu: Some("rtx-3060".into()),
                margin: 0.1,
                ..TrainWords::default()
            },
            TrainWords {
                model: Some("Llama-2-13b-hf".into()),
                seq: Some(2048),
                gpu: Some("a100-80gb".into()),
                finetune: Some("lora".into()),
                lora_rank: Some(64),
                lora_dropout: Some(0.1),
                ..TrainWords::default()
            },
            TrainWords {
                model: Some("Llama-2-13b-hf".into()),
                seq: Some(2048),
                gpu: Some("a100-40gb".into()),
                dist: DistWords {
                    gpus: Some("4".into()),
                    strategy: Some("ddp".into()),
                    bucket_cap_mb: Some(50),
                    ..DistWords::default()
                },
                ..TrainWords::default()
            },
            TrainWords {
                model: Some("resnet50".into()),
                image: Some(224),
                gpu: Some("t4".into()),
                ..TrainWords::default()
            },
        ];
        let mut checked = 0;
        for w in cases {
            let a = w
                .fit_answer(
                    FitAsk {
                        batch: Some(8),
                        ..ask()
                    },
                    &no_gpu,
                    &mut |_| {},
                )
                .expect("searches");
            assert!(!a.report.candidates.is_empty(), "{:?}", a.report.reason);
            for (i, c) in a.report.candidates.iter().enumerate() {
                let (cw, batch) = a.candidate_words(i).expect("words");
                let r = cw
                    .resolve(Some(batch), &no_gpu, &mut |_| {})
                    .expect("resolves");
                assert_eq!(r.config, c.config, "candidate {i} of {:?}: {cw:?}", w.model);
                assert_eq!(r.gpu.id, a.gpu.id);
                assert_eq!(r.budget, a.budget);
                checked += 1;
            }
        }
        assert!(checked >= 15, "{checked}");
    }

    #[test]
    fn a_saved_config_and_a_bad_top_are_refused() {
        let w = TrainWords {
            model: Some("gpt2".into()),
            ..TrainWords::default()
        };
        let e = w
            .fit_answer(FitAsk { top: 0, ..ask() }, &no_gpu, &mut |_| {})
            .expect_err("top 0");
        assert_eq!(e.message(), "--top: must be at least 1");
        let saved = TrainWords {
            config: Some("x.vramlab.json".into()),
            ..TrainWords::default()
        };
        let preset = vramlab_core::model::preset::find_builtin("gpt2").expect("gpt2");
        let e = words_for_config(&saved, &preset, &TrainConfig::default()).expect_err("saved");
        assert!(e.message().starts_with("--config"), "{e}");
    }

    #[test]
    fn export_names_the_format_and_refuses_an_unknown_one() {
        let w = TrainWords {
            model: Some("gpt2".into()),
            ..TrainWords::default()
        };
        let mut said = Vec::new();
        let (text, name) = w
            .export("ds", Some(4), None, &no_gpu, &mut |r| said.push(r))
            .expect("exports");
        assert_eq!(name, "deepspeed");
        assert!(text.contains("train_micro_batch_size_per_gpu"), "{text}");
        assert_eq!(said.len(), 1, "{said:?}");
        let e = w
            .export("deepspeeed", Some(4), None, &no_gpu, &mut |_| {})
            .expect_err("typo");
        assert!(e.message().starts_with("--format: "), "{e}");
        assert!(e.message().contains("deepspeed"), "{e}");
    }
}
