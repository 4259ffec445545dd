"""The native module of the ``vramlab`` package (Rust, over vramlab's core). Use the
wrappers in :mod:`vramlab`; these functions take the settings as a dict of the CLI's words
and answer with the CLI's ``--json`` text."""

from typing import Any, Dict, List, Optional, Tuple

__version__: str
KEYWORDS: List[str]

def plan_json(
    settings: Dict[str, Any], batch: Optional[int] = None, timeline: bool = False
) -> Tuple[str, List[str]]:
    """``vramlab plan … --json`` for the settings, and the notes said on the way."""

def max_batch_json(
    settings: Dict[str, Any], target_batch: Optional[int] = None
) -> Tuple[str, List[str]]:
    """``vramlab max-batch … --json`` for the settings, and the notes said on the way."""

def gpus_json() -> str:
    """The GPU catalog as JSON text."""

def model_ids() -> List[str]:
    """The built-in model preset ids."""
