"""What the training-framework extras would add to the README's first install, pip's cache warm.

    python3 benchmarks/oneoff/bench_extras_install.py

In a fresh virtual environment (a temporary folder) it times ``pip install --no-compile -e '.[all]'``
(what ``.ci/install.sh`` runs for the first command), then ``pip install --no-compile -e
'.[all,lightning,huggingface]'`` on top of it: the time the ``[lightning]`` and ``[huggingface]``
extras would add were they in ``[all]``. pip's download cache is used as on any machine that
installed a package before (run it once first to warm it). The last line is
``extras install: [all] X s; + lightning,huggingface Y s; ratio R`` (R = Y / X).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 1800


def timed_install(pip: Path, extras: str) -> float:
    """Seconds ``pip install --no-compile -e .[extras]`` took; exits naming pip's error if it failed."""
    start = time.monotonic()
    res = subprocess.run([str(pip), "install", "--quiet", "--no-compile", "-e", f"{REPO}[{extras}]"],
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    if res.returncode != 0:
        raise SystemExit(f"bench_extras_install: pip install .[{extras}] failed:\n{res.stderr[-2000:]}")
    return time.monotonic() - start


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-extras-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=TIMEOUT_S)
        base = timed_install(venv / "bin" / "pip", "all")
        added = timed_install(venv / "bin" / "pip", "all,lightning,huggingface")
    print(f"extras install: [all] {base:.0f} s; + lightning,huggingface {added:.0f} s; ratio {added / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
