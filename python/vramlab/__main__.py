"""``python -m vramlab …``: the ``vramlab`` command line.

The planner is in this package, but the command line (and its GUI and GPU commands) is a
binary: this runs the ``vramlab`` found on ``PATH`` (or named by ``$VRAMLAB_BIN``) with the
same arguments, and says how to get it when there is none."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import List, Optional

HOW_TO_GET_IT = """\
vramlab: the `vramlab` command line is a separate binary, and none was found on PATH.
Build it from the repository this package came from:

    cargo install --locked --path .        # then `vramlab --help`

or point VRAMLAB_BIN at a built one (target/release/vramlab). In Python, the planner is
here without it:

    import vramlab
    vramlab.plan(model="gpt2", batch=8, seq=1024).peak_allocated_bytes
"""


def find_binary() -> Optional[str]:
    """The ``vramlab`` binary to run: ``$VRAMLAB_BIN``, else the first on ``PATH``."""
    explicit = os.environ.get("VRAMLAB_BIN")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("vramlab")


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    binary = find_binary()
    if binary is None:
        sys.stderr.write(HOW_TO_GET_IT)
        return 127
    return subprocess.call([binary, *args])


if __name__ == "__main__":
    sys.exit(main())
