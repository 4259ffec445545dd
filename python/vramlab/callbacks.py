"""Checking a training run against its plan, live: plan at the start (warn, or stop, when
it will not fit), compare ``torch.cuda.max_memory_allocated/reserved`` with the plan after
the first steps (warn past the upper edge of the measured band), and on a CUDA OOM run the
doctor on the exception.

:class:`PlanCheck` does the work and needs no framework; :func:`lightning_callback` and
:func:`trainer_callback` wrap it as a Lightning ``Callback`` and a transformers
``TrainerCallback`` (each imports its framework only when called)::

    plan = vramlab.plan(model="gpt2", batch=8, seq=1024, gpu="a100-40gb", loop="trainer")
    trainer = Trainer(..., callbacks=[vramlab.callbacks.trainer_callback(plan)])

A Lightning run is planned with ``loop="lightning"``: Lightning's closure zeroes the
gradients after ``training_step`` (lightning 2.x ``loops/optimization/automatic.py``), so the
last step's gradients live through the forward; :func:`lightning_callback` says so when the
plan has another loop.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, List, Optional

from . import Doctor, Plan, doctor


class PlanDoesNotFit(RuntimeError):
    """Raised at the start of training by ``on_not_fitting="stop"``."""


class PlanCheck:
    """The plan-vs-measured checks, framework-free.

    ``check_after_steps``: compare after this many optimizer steps (the first steps warm
    the caching allocator up). ``on_not_fitting``: ``"warn"`` or ``"stop"`` (raise
    :class:`PlanDoesNotFit` at the start). ``log``: where the lines go (default:
    ``warnings.warn`` for warnings, ``print`` for the comparison; a ``log`` given gets the
    warnings too)."""

    def __init__(
        self,
        plan: Plan,
        *,
        check_after_steps: int = 3,
        on_not_fitting: str = "warn",
        device: Optional[int] = None,
        log: Optional[Callable[[str], None]] = None,
    ) -> None:
        if on_not_fitting not in ("warn", "stop"):
            raise ValueError(f"on_not_fitting: `{on_not_fitting}` is not warn or stop")
        if check_after_steps < 1:
            raise ValueError(f"check_after_steps: must be at least 1, got {check_after_steps}")
        self.plan = plan
        self.check_after_steps = check_after_steps
        self.on_not_fitting = on_not_fitting
        self.device = device
        self.log = log if log is not None else print
        self.custom_log = log is not None
        self.lines: List[str] = []
        self.checked = False
        self.diagnosis: Optional[Doctor] = None

    def _say(self, line: str, warn: bool = False) -> None:
        self.lines.append(line)
        if warn:
            warnings.warn(line, RuntimeWarning, stacklevel=3)
        if not warn or self.custom_log:
            self.log(line)

    def at_start(self) -> None:
        """Says (or raises) when the plan does not fit its GPU."""
        p = self.plan
        gib = 1 << 30
        if p.fits():
            self._say(
                f"vramlab: plan fits {p.gpu}: {p.peak_allocated_bytes / gib:.2f} GiB allocated, "
                f"{p.nvidia_smi_bytes / gib:.2f} GiB nvidia-smi of {p.usable_bytes / gib:.2f} usable"
            )
            return
        line = (
            f"vramlab: this run will not fit {p.gpu}: {p.nvidia_smi_upper_bytes / gib:.2f} GiB "
            f"(nvidia-smi at the band's upper edge) of {p.usable_bytes / gib:.2f} usable; "
            f"largest micro-batch {p.max_batch}"
        )
        if self.on_not_fitting == "stop":
            self.lines.append(line)
            raise PlanDoesNotFit(line)
        self._say(line, warn=True)

    def after_step(self, step: int) -> Optional[str]:
        """After optimizer step ``step`` (counted from 1): at ``check_after_steps``, the
        plan-vs-measured line (a warning past the band's upper edge)."""
        if self.checked or step < self.check_after_steps:
            return None
        import torch

        if not torch.cuda.is_available():
            return None
        self.checked = True
        allocated = int(torch.cuda.max_memory_allocated(self.device))
        reserved = int(torch.cuda.max_memory_reserved(self.device))
        band = self.plan.error_band
        p = self.plan
        gib = 1 << 30

        def pct(measured: int, planned: int) -> float:
            return 100.0 * (measured - planned) / planned if planned else 0.0

        line = (
            f"vramlab: after {step} steps: allocated {allocated / gib:.2f} GiB vs planned "
            f"{p.peak_allocated_bytes / gib:.2f} ({pct(allocated, p.peak_allocated_bytes):+.1f} %), "
            f"reserved {reserved / gib:.2f} GiB vs planned {p.peak_reserved_bytes / gib:.2f} "
            f"({pct(reserved, p.peak_reserved_bytes):+.1f} %)"
        )
        over = allocated > band.allocated.upper_bytes or reserved > band.reserved.upper_bytes
        if over:
            line += (
                f"; past the measured band's upper edge ({band.allocated.upper_bytes / gib:.2f} / "
                f"{band.reserved.upper_bytes / gib:.2f} GiB): the run holds more than plans like "
                "it ever did (other settings than planned, a kept graph, a leak?)"
            )
        self._say(line, warn=over)
        return line

    def on_exception(self, exc: BaseException) -> Optional[Doctor]:
        """A CUDA out-of-memory exception explained by the doctor (``None`` for others)."""
        if "out of memory" not in str(exc):
            return None
        try:
            self.diagnosis = doctor(exc)
        except ValueError:
            return None
        d = self.diagnosis
        first = d.remedies[0]["title"] if d.remedies else "see vramlab doctor"
        self._say(f"vramlab doctor: {d.diagnosis}: {d.summary} First: {first}", warn=True)
        return d


def lightning_callback(plan: Plan, **options: Any) -> Any:
    """A ``lightning.pytorch.Callback`` (or ``pytorch_lightning``'s) running
    :class:`PlanCheck`: at ``on_fit_start``, after each training batch, ``on_exception``."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback

    check = PlanCheck(plan, **options)
    loop = plan.config.get("loop", "plain")
    if loop != "lightning":
        check._say(
            f"vramlab: this plan has loop={loop!r}; a Lightning run zeroes gradients after the "
            "forward (plan it with loop=\"lightning\"), so it can hold up to one more copy of "
            "the gradients than planned",
            warn=True,
        )

    class VramlabCallback(Callback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.check = check

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            check.at_start()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kw: Any) -> None:
            check.after_step(int(trainer.global_step))

        def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
            check.on_exception(exception)

    return VramlabCallback()


def trainer_callback(plan: Plan, **options: Any) -> Any:
    """A ``transformers.TrainerCallback`` running :class:`PlanCheck`: at
    ``on_train_begin`` and ``on_step_end``. (The Trainer has no exception hook: wrap
    ``trainer.train()`` in ``try``/``except`` and call ``callback.check.on_exception(e)``.)"""
    from transformers import TrainerCallback

    check = PlanCheck(plan, **options)

    class VramlabTrainerCallback(TrainerCallback):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.check = check

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            check.at_start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            check.after_step(int(state.global_step))

    return VramlabTrainerCallback()
