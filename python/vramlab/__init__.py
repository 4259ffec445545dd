"""vramlab: will this training run fit on my GPU, and with which batch size?

The planner of the ``vramlab`` command line, in-process. Every function takes the CLI's
words with the CLI's defaults (``--seq`` is ``seq=``, ``--lora-rank`` is ``lora_rank=``,
``--loop`` is ``loop=``) and answers with what ``vramlab … --json`` prints::

    >>> import vramlab
    >>> p = vramlab.plan(model="gpt2", batch=8, seq=1024, precision="amp-bf16")
    >>> p.peak_allocated_bytes          # torch.cuda.max_memory_allocated() of one step
    >>> p.fits("a100-40gb")             # judged at the upper edge of the measured band
    >>> p.to_json()                     # == `vramlab plan --model gpt2 … --json`

The rest of the CLI's planning answers: :func:`max_batch`, :func:`fit` (the ranked
combinations of remedies that fit, each with ``apply()`` giving :func:`plan`'s keywords),
:func:`export` (DeepSpeed, HF, peft, Lightning, PyTorch, … the CLI's bytes),
:func:`doctor`; and :func:`plan_module`, a live ``torch.nn.Module`` planned in-process on
fake tensors (no GPU).

Bad settings raise ``ValueError`` (the message names the setting and the closest valid
value), an unreadable file ``OSError``, a value of the wrong type or an unknown keyword
``TypeError``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Union

from . import _vramlab

__all__ = [
    "Band",
    "Doctor",
    "ErrorBand",
    "Fit",
    "FitCandidate",
    "MaxBatch",
    "Plan",
    "Remedy",
    "TimelinePoint",
    "doctor",
    "export",
    "fit",
    "gpus",
    "max_batch",
    "models",
    "plan",
    "plan_module",
]

__version__: str = _vramlab.__version__

@dataclass(frozen=True)
class Band:
    """The measured error of one peak for plans of this mode: the planned bytes and the
    range the measured value fell in (``lower_bytes`` … ``upper_bytes``)."""

    planned_bytes: int
    lower_bytes: int
    upper_bytes: int
    min_error_pct: float
    median_error_pct: float
    max_error_pct: float

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> "Band":
        return cls(
            planned_bytes=d["planned_bytes"],
            lower_bytes=d["lower_bytes"],
            upper_bytes=d["upper_bytes"],
            min_error_pct=d["min_error_pct"],
            median_error_pct=d["median_error_pct"],
            max_error_pct=d["max_error_pct"],
        )


@dataclass(frozen=True)
class ErrorBand:
    """How far plans like this one were from measured runs (``plan --json``'s
    ``error_band``): the allocated and reserved bands, and which measured rows they come
    from."""

    allocated: Band
    reserved: Band
    measured: bool
    mode: str
    mode_rows: int
    rows: int
    source: str
    widened: bool
    note: str
    #: The level whose 1-in-40 bounds widen the band of a mode with fewer than 39
    #: measured rows (``text:*/lora/none``), else ``None``.
    pooled_with: Optional[str] = None

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> "ErrorBand":
        return cls(
            allocated=Band._of(d["allocated"]),
            reserved=Band._of(d["reserved"]),
            measured=d["measured"],
            mode=d["mode"],
            mode_rows=d["mode_rows"],
            rows=d["rows"],
            source=d["source"],
            widened=d["widened"],
            note=d["note"],
            pooled_with=d.get("pooled_with"),
        )


class TimelinePoint(NamedTuple):
    """Allocated bytes after one event of the planned step."""

    index: int
    phase: str
    micro: int
    allocated: int


@dataclass(frozen=True)
class Remedy:
    """A change planned against the configuration: what it saves (negative: adds), and
    whether it fits (``fits_up_to``: the largest micro-batch it fits at, when not at the
    configured one)."""

    name: str
    description: str
    fits: bool
    fits_up_to: Optional[int]
    nvidia_smi: int
    peak_allocated: int
    saving: int
    allocated_saving: int
    adds_memory: bool
    note: Optional[str]
    config: Dict[str, Any]

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> "Remedy":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def _settings(**kw: Any) -> Dict[str, Any]:
    """The keywords given (``None``: not given, the CLI's default applies; ``False``: a flag
    not given, but ``overlap_comm=False``, a value)."""
    return {
        k: v
        for k, v in kw.items()
        if v is not None and (v is not False or k == "overlap_comm")
    }


class Plan:
    """One planned training step on one GPU: ``vramlab plan``'s answer.

    The attributes are ``plan --json``'s keys, typed; :meth:`to_json` is that JSON. The
    peaks, the breakdown, the band and :meth:`fits` are planned at once; the largest
    micro-batch and the remedies (``max_batch``, ``remedies``, ``fit_command``,
    :meth:`to_json`) plan the configuration many times more, on first use. ``notes`` holds
    what the CLI would print on standard error (aliases read as their canonical name,
    fallbacks)."""

    __slots__ = (
        "_handle", "_data", "_report", "_settings", "_batch", "_timeline", "_graph", "notes"
    )

    def __init__(
        self,
        handle: Any,
        settings: Dict[str, Any],
        batch: Optional[int],
        graph: Optional[str] = None,
    ) -> None:
        self._handle = handle
        self._graph = graph
        self._data: Dict[str, Any] = json.loads(handle.summary_json())
        self._report: Optional[Dict[str, Any]] = None
        self._settings = settings
        self._batch = batch
        self._timeline: Optional[List[TimelinePoint]] = None
        self.notes: List[str] = handle.notes

    def _full(self) -> Dict[str, Any]:
        if self._report is None:
            self._report = json.loads(self._handle.report_json())
        return self._report

    # Peaks ---------------------------------------------------------------------------
    @property
    def peak_allocated_bytes(self) -> int:
        """``torch.cuda.max_memory_allocated()`` of the step."""
        return self._data["peak_allocated_bytes"]

    @property
    def peak_reserved_bytes(self) -> int:
        """``torch.cuda.max_memory_reserved()`` of the step (the caching allocator's
        segments)."""
        return self._data["peak_reserved_bytes"]

    @property
    def nvidia_smi_bytes(self) -> int:
        """What nvidia-smi shows for the process: reserved plus the CUDA context."""
        return self._data["nvidia_smi_bytes"]

    @property
    def nvidia_smi_upper_bytes(self) -> int:
        """nvidia-smi at the upper edge of the measured band (what the verdict judges)."""
        return self._data["nvidia_smi_upper_bytes"]

    @property
    def cuda_context_bytes(self) -> int:
        return self._data["cuda_context_bytes"]

    @property
    def peak_phase(self) -> str:
        """The phase of the step where allocated memory peaks (forward, backward, …)."""
        return self._data["peak_phase"]

    @property
    def peak_layer(self) -> str:
        return self._data["peak_layer"]

    @property
    def breakdown(self) -> Dict[str, int]:
        """Bytes at the peak by category (parameters, gradients, optimizer_state,
        activations, …)."""
        return dict(self._data["breakdown"])

    @property
    def error_band(self) -> ErrorBand:
        """How far plans like this were from measured runs."""
        return ErrorBand._of(self._data["error_band"])

    @property
    def timeline(self) -> List[TimelinePoint]:
        """Allocated bytes after every event of the step (in :meth:`to_json` only with
        ``timeline=True``, as ``--timeline``)."""
        if self._timeline is None:
            self._timeline = [
                TimelinePoint(p["index"], p["phase"], p["micro"], p["allocated"])
                for p in json.loads(self._handle.timeline_json())
            ]
        return list(self._timeline)

    # The model, the configuration, the GPU --------------------------------------------
    @property
    def model(self) -> str:
        return self._data["model"]

    @property
    def params(self) -> int:
        return self._data["params"]

    @property
    def trainable_params(self) -> Optional[int]:
        """Parameters that train, when not all do (LoRA, frozen blocks)."""
        return self._data.get("trainable_params")

    @property
    def config(self) -> Dict[str, Any]:
        """The training configuration planned (``plan --json``'s ``config``)."""
        return json.loads(json.dumps(self._data["config"]))

    @property
    def batch(self) -> int:
        return self._data["config"]["batch"]

    @property
    def effective_batch(self) -> int:
        return self._data["effective_batch"]

    @property
    def gpu(self) -> str:
        """The catalog id of the GPU planned for."""
        return self._data["gpu"]

    @property
    def gpu_memory_bytes(self) -> int:
        return self._data["gpu_memory_bytes"]

    @property
    def usable_bytes(self) -> int:
        """The GPU's memory less the margin kept free."""
        return self._data["usable_bytes"]

    # Answers -------------------------------------------------------------------------
    @property
    def max_batch(self) -> Optional[int]:
        """The largest micro-batch that fits this GPU (``None``: not even 1)."""
        return self._full()["max_batch"]

    @property
    def remedies(self) -> List[Remedy]:
        """Every applicable remedy, planned: those that save memory first."""
        return [Remedy._of(r) for r in self._full()["remedies"]]

    @property
    def warnings(self) -> List[str]:
        """Settings the card runs badly or not at all."""
        return list(self._data["warnings"])

    @property
    def assumed(self) -> Dict[str, str]:
        """Settings left to their defaults (``{"gpu": "rtx-4090", …}``)."""
        return dict(self._data["assumed"])

    @property
    def fit_command(self) -> Optional[str]:
        """When neither the plan nor a single remedy fits: the ``vramlab fit`` command."""
        return self._full().get("fit_command")

    def fits(self, gpu: Optional[str] = None, *, margin: Optional[float] = None) -> bool:
        """Whether the step fits, judged at the upper edge of the measured band.

        ``gpu`` (a catalog id or name, ``"h100"``, ``"A100 80GB"``) and ``margin`` judge the
        same configuration on another card; without them, the GPU planned for."""
        if gpu is None and margin is None:
            return bool(self._data["fits"])
        s = dict(self._settings)
        if gpu is not None:
            s["gpu"] = gpu
        if margin is not None:
            s["margin"] = margin
        other = _vramlab.plan(s, self._batch, False, self._graph)
        return bool(json.loads(other.summary_json())["fits"])

    def to_json(self) -> str:
        """``vramlab plan … --json``'s line (without its newline)."""
        return self._handle.report_json()

    def to_dict(self) -> Dict[str, Any]:
        """``to_json()`` parsed: every key of ``plan --json`` (the multi-GPU ones too:
        ``world``, ``global_batch``, ``host_ram_per_rank_bytes``, …)."""
        return json.loads(self._handle.report_json())

    def __repr__(self) -> str:
        gib = 1 << 30
        return (
            f"<vramlab.Plan {self.model} batch {self.batch} on {self.gpu}: "
            f"{self.peak_allocated_bytes / gib:.2f} GiB allocated, "
            f"{self.nvidia_smi_bytes / gib:.2f} GiB nvidia-smi, "
            f"{'fits' if self._data['fits'] else 'does not fit'}>"
        )


@dataclass(frozen=True)
class FitCandidate:
    """One configuration that fits, from :func:`fit` (``fit --json``'s ``candidates``):
    what it changes against yours (``changes``: empty for your own), what that costs
    besides memory, its micro-batch × accumulation, its peaks, the predicted time per
    sample. :meth:`apply` gives its settings as :func:`plan`'s keywords."""

    changes: List[str]
    costs: List[str]
    micro_batch: int
    accum: int
    max_micro_batch: int
    peak_allocated: int
    peak_reserved: int
    nvidia_smi: int
    trainable_params: int
    ms_per_sample: float
    is_user_config: bool
    config: Dict[str, Any]
    _settings: Dict[str, Any]

    def apply(self) -> Dict[str, Any]:
        """This candidate's settings as the keywords of :func:`plan` (and :func:`export`,
        :func:`max_batch` without ``batch``): ``vramlab.plan(**c.apply())`` plans it. The
        model, GPU and margin are yours; the rest is the candidate's (the core turns its
        configuration back into words)."""
        return dict(self._settings)

    @property
    def summary(self) -> str:
        """The changes in one line (``as configured`` for your own configuration)."""
        return "; ".join(self.changes) if self.changes else "as configured"


class Fit:
    """What makes the configuration fit: ``vramlab fit``'s answer. ``candidates`` are the
    combinations of remedies that fit (precision, checkpointing, micro-batch with
    accumulation keeping the effective batch, optimizer, LoRA, loop shape, allocator
    settings, a strategy on several GPUs), your own configuration first when it fits, then
    by predicted time per sample; none when nothing fits (``reason`` says why).
    :meth:`to_json` is ``fit --json``'s line. Step times come from the catalog's datasheet
    (the CLI uses a profile ``vramlab profile`` saved when there is one)."""

    __slots__ = ("_json", "_data", "candidates", "notes")

    def __init__(self, text: str, notes: List[str], words: List[Dict[str, Any]]) -> None:
        self._json = text
        self._data: Dict[str, Any] = json.loads(text)
        self.notes: List[str] = notes
        self.candidates: List[FitCandidate] = [
            FitCandidate(
                changes=list(c["changes"]),
                costs=list(c["costs"]),
                micro_batch=c["micro_batch"],
                accum=c["accum"],
                max_micro_batch=c["max_micro_batch"],
                peak_allocated=c["peak_allocated"],
                peak_reserved=c["peak_reserved"],
                nvidia_smi=c["nvidia_smi"],
                trainable_params=c["trainable_params"],
                ms_per_sample=c["time"]["ms_per_sample"],
                is_user_config=c["is_user_config"],
                config=c["config"],
                _settings=w,
            )
            for c, w in zip(self._data["candidates"], words)
        ]

    @property
    def fits(self) -> bool:
        """Whether any combination fits."""
        return bool(self.candidates)

    @property
    def best(self) -> Optional[FitCandidate]:
        """The first candidate (yours when it fits, else the fastest), or ``None``."""
        return self.candidates[0] if self.candidates else None

    @property
    def reason(self) -> Optional[str]:
        """Why nothing fits (``None`` when something does)."""
        return self._data.get("reason")

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step every candidate keeps."""
        return self._data["effective_batch"]

    @property
    def model(self) -> str:
        return self._data["model"]

    @property
    def gpu(self) -> str:
        return self._data["gpu"]

    @property
    def usable_bytes(self) -> int:
        return self._data["usable_bytes"]

    def to_json(self) -> str:
        """``vramlab fit … --json``'s line (without its newline)."""
        return self._json

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(self._json)

    def __repr__(self) -> str:
        best = self.best
        what = "nothing fits" if best is None else f"best: {best.summary}"
        return f"<vramlab.Fit {self.model} on {self.gpu}: {len(self.candidates)} candidates, {what}>"


class MaxBatch:
    """The largest micro-batch that fits a GPU: ``vramlab max-batch``'s answer.

    ``max_batch`` is ``None`` when even batch 1 does not fit (then ``shortfall_bytes`` says
    by how much); :meth:`to_json` is ``max-batch --json``'s line."""

    __slots__ = ("_json", "_data", "notes")

    def __init__(self, text: str, notes: List[str]) -> None:
        self._json = text
        self._data: Dict[str, Any] = json.loads(text)
        self.notes: List[str] = notes

    @property
    def max_batch(self) -> Optional[int]:
        return self._data["max_batch"]

    @property
    def fits(self) -> bool:
        """Whether any micro-batch fits."""
        return self._data["max_batch"] is not None

    @property
    def accumulation_steps(self) -> Optional[int]:
        """With ``target_batch``: the accumulation steps of ``max_batch`` reaching it."""
        return self._data.get("accumulation_steps")

    @property
    def peak_allocated_bytes(self) -> int:
        """At ``max_batch`` (batch 1 when nothing fits)."""
        d = self._data
        return d["peak_allocated_bytes"] if self.fits else d["batch1_peak_allocated_bytes"]

    @property
    def nvidia_smi_bytes(self) -> int:
        d = self._data
        return d["nvidia_smi_bytes"] if self.fits else d["batch1_nvidia_smi_bytes"]

    @property
    def shortfall_bytes(self) -> int:
        """How much batch 1 is over the usable memory (0 when something fits)."""
        return self._data.get("shortfall_bytes", 0)

    @property
    def error_band(self) -> Optional[ErrorBand]:
        band = self._data.get("error_band")
        return None if band is None else ErrorBand._of(band)

    @property
    def model(self) -> str:
        return self._data["model"]

    @property
    def gpu(self) -> str:
        return self._data["gpu"]

    @property
    def usable_bytes(self) -> int:
        return self._data["usable_bytes"]

    def to_json(self) -> str:
        """``vramlab max-batch … --json``'s line (without its newline)."""
        return self._json

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(self._json)

    def __repr__(self) -> str:
        return f"<vramlab.MaxBatch {self.model} on {self.gpu}: {self.max_batch}>"


def plan(
    model: Optional[Union[str, "os.PathLike[str]"]] = None,
    batch: Optional[int] = None,
    *,
    seq: Optional[int] = None,
    image: Optional[int] = None,
    target_seq: Optional[int] = None,
    precision: Optional[str] = None,
    optimizer: Optional[str] = None,
    accum: Optional[int] = None,
    checkpointing: bool = False,
    checkpointing_reentrant: bool = False,
    attention: Optional[str] = None,
    loop: Optional[str] = None,
    step: Optional[str] = None,
    finetune: Optional[str] = None,
    lora_rank: Optional[int] = None,
    lora_targets: Optional[str] = None,
    lora_dropout: Optional[float] = None,
    freeze_embeddings: bool = False,
    freeze_blocks: Optional[int] = None,
    lora_merged: bool = False,
    quant: Optional[str] = None,
    no_double_quant: bool = False,
    moe_imbalance: Optional[float] = None,
    expandable_segments: bool = False,
    max_split_size_mb: Optional[int] = None,
    gpu: Optional[str] = None,
    margin: Optional[float] = None,
    gpus: Optional[Union[int, str]] = None,
    nodes: Optional[int] = None,
    strategy: Optional[str] = None,
    offload: Optional[str] = None,
    config: Optional[Union[str, "os.PathLike[str]"]] = None,
    timeline: bool = False,
    **distributed: Any,
) -> Plan:
    """Predicts the peak memory of one training step: ``vramlab plan``.

    ``model``: a preset id or name (``"gpt2"``, ``"llama-3-8b"``), a Hugging Face
    ``config.json``, a preset JSON or a captured graph file. ``batch``: the micro-batch
    (samples per forward/backward pass). ``seq`` (language models) or ``image`` (vision
    models): the input size [default: the preset's]. ``precision``: fp32, amp-fp16,
    amp-bf16 or bf16 [amp-bf16]. ``optimizer``: sgd, sgd-momentum, adam, adamw, adafactor,
    adam8bit [adamw]. ``finetune``: full, lora or qlora [full]. ``gpu``: a catalog id or
    name [rtx-4090]. ``margin``: the fraction of GPU memory kept free [0.05]. ``gpus``,
    ``nodes``, ``strategy`` (ddp, zero1, torch-zero1, zero2, zero3, fsdp2), ``offload`` and
    the other multi-GPU keywords of ``vramlab plan --help`` (``bucket_cap_mb=…``,
    ``stage3_prefetch_bucket_size=…``) plan one rank of a data-parallel run. ``config``: a
    saved ``.vramlab.json`` instead of the model and training words. ``timeline``: keep
    the allocated timeline in :meth:`Plan.to_json` (``--timeline``).

    Every keyword mirrors the CLI flag of the same name; the defaults are the CLI's."""
    settings = _settings(
        model=None if model is None else str(model),
        config=None if config is None else str(config),
        seq=seq,
        image=image,
        target_seq=target_seq,
        precision=precision,
        optimizer=optimizer,
        accum=accum,
        checkpointing=checkpointing,
        checkpointing_reentrant=checkpointing_reentrant,
        attention=attention,
        loop=loop,
        step=step,
        finetune=finetune,
        lora_rank=lora_rank,
        lora_targets=lora_targets,
        lora_dropout=lora_dropout,
        freeze_embeddings=freeze_embeddings,
        freeze_blocks=freeze_blocks,
        lora_merged=lora_merged,
        quant=quant,
        no_double_quant=no_double_quant,
        moe_imbalance=moe_imbalance,
        expandable_segments=expandable_segments,
        max_split_size_mb=max_split_size_mb,
        gpu=gpu,
        margin=margin,
        gpus=gpus,
        nodes=nodes,
        strategy=strategy,
        offload=offload,
        **distributed,
    )
    return Plan(_vramlab.plan(settings, batch, timeline), settings, batch)


def max_batch(
    model: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    target_batch: Optional[int] = None,
    **settings: Any,
) -> MaxBatch:
    """The largest micro-batch that fits the GPU: ``vramlab max-batch``.

    Takes :func:`plan`'s keywords but ``batch`` and ``timeline``; ``target_batch``: an
    effective batch to reach with gradient accumulation (``accumulation_steps`` says how
    many steps of ``max_batch``)."""
    if model is not None:
        settings["model"] = str(model)
    if "config" in settings and settings["config"] is not None:
        settings["config"] = str(settings["config"])
    text, notes = _vramlab.max_batch_json(_settings(**settings), target_batch)
    return MaxBatch(text, notes)


def fit(
    model: Optional[Union[str, "os.PathLike[str]"]] = None,
    batch: Optional[int] = None,
    *,
    effective_batch: Optional[int] = None,
    top: int = 10,
    **settings: Any,
) -> Fit:
    """The combinations of remedies that make the configuration fit the GPU, ranked by
    predicted time per sample: ``vramlab fit``.

    Takes :func:`plan`'s keywords but ``timeline``; ``batch``: the micro-batch you would
    like [default: 1, or the saved config's]; ``effective_batch``: samples per optimizer
    step to keep [default: batch × accum]; ``top``: candidates to return at most. Each
    candidate's :meth:`FitCandidate.apply` is :func:`plan`'s keywords for it::

        >>> f = vramlab.fit("Meta-Llama-3-8B", batch=4, seq=2048, gpu="rtx-4090")
        >>> vramlab.plan(**f.best.apply()).fits()
        True
    """
    if model is not None:
        settings["model"] = str(model)
    if settings.get("config") is not None:
        settings["config"] = str(settings["config"])
    text, notes, words = _vramlab.fit_json(_settings(**settings), batch, effective_batch, top)
    return Fit(text, notes, words)


def export(plan: Plan, format: str) -> str:
    """The plan's settings as a framework's configuration: ``vramlab export --format
    FORMAT`` (the same bytes).

    ``format``: ``vramlab`` (a ``.vramlab.json`` saved plan), ``deepspeed`` (a DeepSpeed
    JSON config), ``hf`` (transformers ``TrainingArguments``), ``peft`` (``LoraConfig``,
    QLoRA's ``BitsAndBytesConfig``, TRL's ``SFTConfig``), ``lightning`` (a ``Trainer``),
    ``pytorch`` (a training loop), ``env`` (``PYTORCH_CUDA_ALLOC_CONF``); with several GPUs
    also ``accelerate``, ``torchrun`` or ``fsdp2``; the CLI's aliases too (``ds``,
    ``transformers``). The HF, Lightning and PyTorch exports plan the loop those run
    (``loop="trainer"``), as the CLI does. A format name read as an alias is not said (the
    CLI says it on standard error); an unknown one raises ``ValueError`` naming the closest.

    ``plan``'s settings are planned again at its batch (a plan of ``gpus="auto"`` exports
    one GPU, as ``vramlab export --gpus auto`` does)."""
    if not isinstance(plan, Plan):
        raise TypeError(
            f"plan: expected a vramlab.Plan (from vramlab.plan or vramlab.plan_module), got "
            f"{type(plan).__name__}"
        )
    text, _name, _notes = _vramlab.export_text(plan._settings, format, plan._batch, plan._graph)
    return text


class Doctor:
    """What ``vramlab doctor`` found in an OOM message and/or a memory snapshot: the cause
    (``diagnosis``: capacity, fragmentation, outside_allocator, other_processes,
    process_cap; ``None`` when the snapshot records no OOM), the evidence, the remedies
    (most useful first) and the figures. :meth:`to_json` is ``doctor --json``'s line."""

    __slots__ = ("_json", "_data")

    def __init__(self, text: str) -> None:
        self._json = text
        self._data: Dict[str, Any] = json.loads(text)

    @property
    def diagnosis(self) -> Optional[str]:
        return self._data["diagnosis"]

    @property
    def summary(self) -> Optional[str]:
        d = self._data["details"]
        return None if d is None else d["summary"]

    @property
    def evidence(self) -> List[str]:
        d = self._data["details"]
        return [] if d is None else list(d["evidence"])

    @property
    def remedies(self) -> List[Dict[str, Any]]:
        """Each with ``title``, ``detail`` and the ``setting`` to change (or ``None``)."""
        return json.loads(json.dumps(self._data["remedies"]))

    @property
    def figures(self) -> Optional[Dict[str, Any]]:
        f = self._data["figures"]
        return None if f is None else dict(f)

    @property
    def message(self) -> Optional[Dict[str, Any]]:
        """The OOM message as read (requested, capacity, free, allocated, reserved bytes)."""
        return self._data["message"]

    @property
    def snapshot(self) -> Optional[Dict[str, Any]]:
        """The snapshot's analysis (peaks, segment map, allocation sites at the peak)."""
        return self._data["snapshot"]

    def to_json(self) -> str:
        """``vramlab doctor … --json``'s line (without its newline)."""
        return self._json

    def to_dict(self) -> Dict[str, Any]:
        return json.loads(self._json)

    def __repr__(self) -> str:
        return f"<vramlab.Doctor {self.diagnosis}: {self.summary}>"


def doctor(
    message_or_exception: Union[str, BaseException, None] = None,
    snapshot: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    device: Optional[int] = None,
    timeline: bool = False,
) -> Doctor:
    """Explains a CUDA out-of-memory error: ``vramlab doctor`` (without ``--model``).

    ``message_or_exception``: the error's text (the whole traceback is fine) or the
    exception itself (``torch.OutOfMemoryError`` caught in the training loop).
    ``snapshot``: a ``torch.cuda.memory._dump_snapshot`` pickle; ``device``: the device whose
    trace to replay; ``timeline``: keep the snapshot's timeline in :meth:`Doctor.to_json`."""
    text: Optional[str]
    if isinstance(message_or_exception, BaseException):
        import traceback

        text = "".join(
            traceback.format_exception_only(type(message_or_exception), message_or_exception)
        )
    else:
        text = message_or_exception
    path = None if snapshot is None else os.fspath(snapshot)
    return Doctor(_vramlab.doctor_json(text, path, device, timeline))


def gpus() -> List[Dict[str, Any]]:
    """The GPU catalog (``vramlab presets --json``'s ``gpus``)."""
    return json.loads(_vramlab.gpus_json())


def models() -> List[str]:
    """The built-in model preset ids."""
    return list(_vramlab.model_ids())


from ._module import plan_module  # noqa: E402  (it uses Plan, defined above)

