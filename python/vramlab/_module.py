"""``vramlab.plan_module``: a live ``torch.nn.Module`` planned in-process.

The training step is captured on fake tensors by the tracing code of ``vramlab capture``
(``runners/capture.py`` and its siblings, embedded in the native module as the CLI embeds
them, run here as modules of their own: nothing is written to disk), then the core plans
the captured graph as ``vramlab plan --model captured.vramlab-graph.json`` does.
"""

from __future__ import annotations

import copy
import json
import types
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Sequence, Tuple

from . import _vramlab

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from . import Plan

_RUNNERS: Dict[str, types.ModuleType] = {}


def _runners() -> types.ModuleType:
    """The capture module (its siblings given to it), loaded once from the embedded source."""
    if "capture" in _RUNNERS:
        return _RUNNERS["capture"]
    for name, source in _vramlab.capture_sources():
        mod = types.ModuleType(f"vramlab._runners.{name}")
        mod.__file__ = f"<vramlab>/runners/{name}.py"
        code = compile(source, f"runners/{name}.py", "exec")
        exec(code, mod.__dict__)
        if name == "capture":
            mod.SIBLINGS.update(_RUNNERS)
        _RUNNERS[name] = mod
    return _RUNNERS["capture"]


def _tensors(x: Any) -> Sequence[Any]:
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [v for v in x.values() if isinstance(v, torch.Tensor)]
    if isinstance(x, (tuple, list)):
        return [v for v in x if isinstance(v, torch.Tensor)]
    return []


def _remake(example: Any, batch: int, device: Any, float_dtype: Any) -> Any:
    """The example input at `batch`: every tensor's per-sample shape (its first dimension is
    the batch), new storages on the capture's device (integer inputs keep their dtype,
    floating ones take the step's input dtype, as the capture's inputs do)."""
    import torch

    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        dtype = float_dtype if t.is_floating_point() else t.dtype
        return torch.zeros((batch, *t.shape[1:]), dtype=dtype, device=device)

    if isinstance(example, dict):
        return {k: one(v) for k, v in example.items()}
    if isinstance(example, (tuple, list)):
        return type(example)(one(v) for v in example)
    return one(example)


def _call(model: Any, x: Any) -> Any:
    if isinstance(x, dict):
        return model(**x)
    if isinstance(x, (tuple, list)):
        return model(*x)
    return model(x)


def _fake_copy(model: "torch.nn.Module") -> Callable[[], "torch.nn.Module"]:
    """A factory for the capture: the module's structure copied without its data (every
    parameter and buffer a meta tensor of its shape, dtype and ``requires_grad``; tied
    parameters stay tied), then given fresh storages on the capture's (fake) device in
    module order. Under pure bf16 (the default dtype bf16 while the factory runs) the
    floating tensors are made in bf16, as the capture's own models are."""
    import torch

    def factory() -> "torch.nn.Module":
        dtype = torch.get_default_dtype()
        memo: Dict[int, Any] = {}
        with torch.utils._python_dispatch._disable_current_modes():

            def meta(t: Any) -> Any:
                d = dtype if (t.is_floating_point() and dtype != torch.float32) else t.dtype
                return torch.empty(t.shape, dtype=d, device="meta")

            for p in model.parameters():
                if id(p) not in memo:
                    memo[id(p)] = torch.nn.Parameter(meta(p), requires_grad=p.requires_grad)
            for b in model.buffers():
                if id(b) not in memo:
                    memo[id(b)] = meta(b)
            copied = copy.deepcopy(model, memo)
        return copied.to_empty(device=torch.get_default_device())

    return factory


def plan_module(
    model: "torch.nn.Module",
    example_input: Any,
    batch: int,
    *,
    precision: str = "amp-bf16",
    optimizer: str = "adamw",
    checkpointing: bool = False,
    loop: str = "plain",
    loss_fn: Optional[Callable[[Any, Any], Any]] = None,
    batches: Tuple[int, ...] = (2, 4, 6),
    device: Optional[str] = None,
    gpu: Optional[str] = None,
    margin: Optional[float] = None,
    timeline: bool = False,
    name: Optional[str] = None,
    **settings: Any,
) -> "Plan":
    """Plans one training step of a live module, in-process, without a GPU.

    The step (``zero_grad``, the forward under autocast, the loss, ``backward``, the
    optimizer step, twice: a warm-up and the measured one) runs on fake tensors
    (``FakeTensorMode``: no memory, no data; the module's weights are not copied) at the
    batch sizes ``batches`` with the tracing code of ``vramlab capture``; the core fits
    each allocation as ``per_sample × batch + fixed`` and plans the captured graph at
    ``batch`` as ``vramlab plan --model captured.vramlab-graph.json`` does. The module is
    not changed (the capture runs on a copy of its structure).

    ``example_input``: what the module is called with — a tensor (``model(x)``), a tuple or
    list (``model(*x)``) or a dict (``model(**x)``: ``{"input_ids": ids, "labels": ids}``
    for a Hugging Face model); the first dimension of every tensor is the batch (its size
    does not matter), the rest the per-sample shape. ``loss_fn(output, inputs)`` returns the
    scalar loss [default: the output's ``loss``, else cross-entropy of the logits over
    dimension 1]. ``precision`` (fp32, amp-bf16, amp-fp16, bf16), ``optimizer`` (adamw,
    adam, sgd, sgd-momentum), ``checkpointing`` (the module's blocks: Hugging Face's
    ``gradient_checkpointing_enable``, timm's ``set_grad_checkpointing``, else the longest
    ``nn.Sequential`` / ``nn.ModuleList``) and ``loop`` (plain, trainer) are the captured
    step's. ``device``: the fake device [default: cuda where CUDA is available, else cpu,
    with CUDA's autocast lists, SDPA backend and fused dropout mirrored for the capture and
    taken back after]. ``gpu``, ``margin``, ``timeline`` and the other keywords of
    :func:`vramlab.plan` (``accum``, ``expandable_segments``, …) plan the captured graph.
    ``name``: the model's name in the plan [default: its class name].

    Raises ``ImportError`` without torch, ``ValueError`` for bad settings or a step the
    capture cannot record (an op whose output shape depends on data, allocations that do
    not scale with the batch).
    """
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised where torch is absent
        raise ImportError(
            f"vramlab.plan_module needs PyTorch ({e}); install torch, or plan a preset or a "
            "config.json with vramlab.plan"
        ) from None
    from . import Plan, _settings

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    tensors = _tensors(example_input)
    if not tensors or any(t.dim() < 1 for t in tensors):
        raise TypeError(
            "example_input: expected a tensor, or a tuple / list / dict of tensors, whose "
            "first dimension is the batch"
        )
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch: must be a whole number of at least 1, got {batch!r}")
    prec, opt, loop_shape, notes = _vramlab.capture_words(precision, optimizer, loop)
    try:
        sizes = sorted({int(b) for b in batches})
    except (TypeError, ValueError):
        raise TypeError(f"batches: expected whole numbers, got {batches!r}") from None
    cap = _runners()
    first = tensors[0]
    tokens = not first.is_floating_point()
    name = name or type(model).__name__
    args = types.SimpleNamespace(
        precision=prec,
        optimizer=opt,
        loop=loop_shape,
        checkpointing=bool(checkpointing),
        batches=",".join(str(b) for b in sizes),
        real_cpu=False,
        in_process=True,
        device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
        input=None,
        sample_shape=list(first.shape[1:]),
        graph_kind="tokens" if tokens else "image",
        make_batch=lambda b, dev, dtype: _remake(example_input, b, dev, dtype),
        call=_call,
        loss_fn=loss_fn,
    )
    # the input's size as the planner reads it: a sequence's length, an image's side
    size = int(first.shape[1]) if first.dim() >= 2 else 1
    if not tokens and first.dim() >= 2:
        size = int(first.shape[-1])
    try:
        doc, _recs = cap.capture_graph(args, _fake_copy(model), "given", size, name)
    except cap.CaptureError as e:
        raise ValueError(f"capture: {e.msg}") from None
    finally:
        cap.release_cpu_policies()
    graph = json.dumps(doc, separators=(",", ":"))
    s = _settings(model=name, gpu=gpu, margin=margin, **settings)
    handle = _vramlab.plan(s, batch, timeline, graph)
    p = Plan(handle, s, batch, graph)
    p.notes = notes + p.notes
    return p
