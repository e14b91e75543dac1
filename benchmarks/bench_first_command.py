"""The README's first command, timed as a newcomer meets it: a fresh clone, a fresh venv.

    python3 benchmarks/bench_first_command.py              # clone HEAD into a temp dir, run it there
    python3 benchmarks/bench_first_command.py --keep DIR   # clone into DIR and leave it there

Takes the first ```bash block of README.md's "The two commands" section, clones this
checkout's committed HEAD (``git clone``: what a newcomer gets, nothing ignored or
uncommitted), runs the block there with ``bash -e`` and stamps every chunk of output it
prints. Prints the total wall time and the longest silence (with the line before it), each
next to its target (at most 240 s in all, no silence over 30 s: a newcomer's first command must
not look hung), and exits 1 when
one is missed. pip's download cache (``~/.cache/pip``) is used as on any machine that
installed a package before; the torch CPU wheel comes from the local wheel folder pip is
configured with.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOTAL_TARGET_S = 240.0
SILENCE_TARGET_S = 30.0


def first_command(readme: str) -> str:
    """The first ```bash block after the heading "The two commands"."""
    section = readme.split("## The two commands", 1)
    if len(section) != 2:
        raise SystemExit("bench_first_command: README.md has no '## The two commands' section")
    m = re.search(r"```bash\n(.*?)\n```", section[1], re.DOTALL)
    if m is None:
        raise SystemExit("bench_first_command: no ```bash block under 'The two commands'")
    return m.group(1)


DEMO_MARK = b"demo: starting"  # the demo's first line: what comes before it is the install


def run_stamped(code: str, cwd: Path, timeout_s: float) -> tuple[int, float, float, str, float | None]:
    """(exit code, wall seconds, longest silence in seconds, the output line before that silence,
    seconds until the demo's first line or None)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    start = last = time.monotonic()
    longest, before, tail = 0.0, "(start)", ""
    demo_at: float | None = None
    proc = subprocess.Popen(["bash", "-e", "-c", code], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    try:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            now = time.monotonic()
            if now - last > longest:
                longest, before = now - last, tail.strip().splitlines()[-1] if tail.strip() else "(start)"
            last = now
            if demo_at is None and DEMO_MARK in chunk:
                demo_at = now - start
            text = chunk.decode(errors="replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            tail = (tail + text)[-2000:]
            if now - start > timeout_s:
                proc.kill()
                break
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    end = time.monotonic()
    if end - last > longest:
        longest, before = end - last, tail.strip().splitlines()[-1] if tail.strip() else "(start)"
    return rc, end - start, longest, before, demo_at


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", metavar="DIR", help="clone into DIR (must not exist) and keep it")
    ap.add_argument("--timeout", type=float, default=900.0, help="give up after S seconds (default 900)")
    args = ap.parse_args()
    code = first_command((REPO / "README.md").read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory(prefix="first-command-") as tmp:
        clone = Path(args.keep) if args.keep else Path(tmp) / "malletrain"
        subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
        print(f"$ {code}   (in {clone})", flush=True)
        rc, wall, silence, before, demo_at = run_stamped(code, clone, args.timeout)
    ok_total, ok_silence = wall <= TOTAL_TARGET_S, silence <= SILENCE_TARGET_S
    print(f"\nfirst command: exit {rc}, {wall:.0f} s wall (target <= {TOTAL_TARGET_S:.0f} s: "
          f"{'met' if ok_total else 'MISSED'}, {wall / TOTAL_TARGET_S:.2f}x of it); longest silence "
          f"{silence:.1f} s (target <= {SILENCE_TARGET_S:.0f} s: {'met' if ok_silence else 'MISSED'}), "
          f"after: {before[:120]}")
    if demo_at is not None:
        print(f"  install {demo_at:.0f} s, demo {wall - demo_at:.0f} s")
    return 0 if rc == 0 and ok_total and ok_silence else 1


if __name__ == "__main__":
    sys.exit(main())
