"""The native module of the ``vramlab`` package (Rust, over vramlab's core). Use the
wrappers in :mod:`vramlab`; these functions take the settings as a dict of the CLI's words
and answer with the CLI's ``--json`` text."""

from typing import Any, Dict, List, Optional, Tuple

__version__: str
KEYWORDS: List[str]

class Planned:
    """A planned step: the plan and its verdict; the whole report made on first use."""

    notes: List[str]
    def summary_json(self) -> str:
        """The keys of ``plan --json`` that need no search, as JSON text."""
    def report_json(self) -> str:
        """``vramlab plan … --json``'s line (the max-batch search and remedies run once)."""
    def timeline_json(self) -> str:
        """The allocated bytes after every event of the step, as JSON text."""

def plan(
    settings: Dict[str, Any],
    batch: Optional[int] = None,
    timeline: bool = False,
    graph: Optional[str] = None,
) -> Planned:
    """Plans the settings: the plan and its verdict at once, the rest on first use.
    ``graph``: a captured graph's JSON text planned as the model (``plan_module``)."""

def plan_json(
    settings: Dict[str, Any], batch: Optional[int] = None, timeline: bool = False
) -> Tuple[str, List[str]]:
    """``vramlab plan … --json`` for the settings, and the notes said on the way."""

def max_batch_json(
    settings: Dict[str, Any], target_batch: Optional[int] = None
) -> Tuple[str, List[str]]:
    """``vramlab max-batch … --json`` for the settings, and the notes said on the way."""

def fit_json(
    settings: Dict[str, Any],
    batch: Optional[int] = None,
    effective_batch: Optional[int] = None,
    top: int = 10,
) -> Tuple[str, List[str], List[Dict[str, Any]]]:
    """``vramlab fit … --json`` for the settings, the notes said on the way, and each
    candidate's settings as the keyword dict ``vramlab.plan`` takes."""

def export_text(
    settings: Dict[str, Any],
    format: str,
    batch: Optional[int] = None,
    graph: Optional[str] = None,
) -> Tuple[str, str, List[str]]:
    """``vramlab export --format FORMAT``'s text for the settings, the format's name, and
    the notes said on the way."""

def capture_words(precision: str, optimizer: str, loop_shape: str) -> Tuple[str, str, str, List[str]]:
    """The capture's settings in the core's canonical names, and the notes said."""

def capture_sources() -> List[Tuple[str, str]]:
    """The embedded ``runners/`` capture modules: (name, source) in import order."""

def doctor_json(
    message: Optional[str] = None,
    snapshot: Optional[str] = None,
    device: Optional[int] = None,
    timeline: bool = False,
) -> str:
    """``vramlab doctor … --json`` (without a model) for an OOM message and/or a snapshot."""

def gpus_json() -> str:
    """The GPU catalog as JSON text."""

def model_ids() -> List[str]:
    """The built-in model preset ids."""
