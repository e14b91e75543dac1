"""``malletrain trace stats`` and ``malletrain trace synth``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import traces
from malletrain.cli import main

SWF = """\
; UnixStartTime: 1000
; MaxNodes: 4
1  0 10 100 2 -1 -1 2 200 -1 1 1 1 -1 1 -1 -1 -1
2  5  5  50 1 -1 -1 1 100 -1 1 1 1 -1 1 -1 -1 -1
3 50 70  30 2 -1 -1 2 100 -1 1 1 1 -1 1 -1 -1 -1
"""


def test_stats_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.swf"
    path.write_text(SWF)
    assert main(["trace", "stats", str(path)]) == 0
    out = capsys.readouterr().out
    assert "format          swf" in out
    assert "nodes           4" in out
    assert "span            2.3min (140 s)" in out
    assert "mean idle       1.8 nodes" in out  # 250 node-seconds / 140 s
    assert "peak idle       4 nodes" in out
    assert "idle fraction   44.64%" in out
    assert "note            machine size 4 nodes (from the log header MaxNodes)" in out


def test_stats_json_on_real_log(kth_swf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "stats", str(kth_swf), "--json", "--nodes", "128"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["format"] == "swf" and d["nodes"] == 128
    assert d["span_s"] == pytest.approx(28759474)
    assert d["fragment_p10_s"] <= d["fragment_p50_s"] <= d["fragment_p90_s"] <= d["fragment_p99_s"]
    assert "machine size 128 nodes (given)" in d["notes"]


def test_stats_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.swf"
    path.write_text(SWF)
    assert main(["trace", "stats", str(path), "--plot", str(tmp_path / "figs")]) == 0
    pngs = sorted((tmp_path / "figs").glob("*.png"))
    assert [p.name for p in pngs] == ["fragment_cdf.png", "idle_nodes.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert f"wrote {tmp_path / 'figs' / 'idle_nodes.png'}" in capsys.readouterr().out


def test_stats_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.swf"
    path.write_text(SWF)
    assert main(["trace", "stats", str(path), "--format", "lsf"]) == 2
    err = capsys.readouterr().err
    assert "unknown format 'lsf'" in err and "nodes-csv, swf, sacct, alcf" in err
    (tmp_path / "bad.swf").write_text("; MaxNodes: 4\n1 0 0 10\n")
    assert main(["trace", "stats", str(tmp_path / "bad.swf")]) == 2
    assert f"{tmp_path / 'bad.swf'}:2: expected 18 fields" in capsys.readouterr().err
    (tmp_path / "empty").write_text("")
    assert main(["trace", "stats", str(tmp_path / "empty")]) == 2
    assert "empty log" in capsys.readouterr().err


def test_synth_writes_a_readable_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.csv.gz"
    assert main(["trace", "synth", "--nodes", "64", "--duration", "86400", "--seed", "2", "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    tl = traces.read(out)
    assert tl.n_nodes == 64 and tl.span == 86400 and tl.format == "nodes-csv"


@pytest.mark.slow
def test_synth_fit_prints_ks(tmp_path: Path, kth_swf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "kth-like.csv"
    args = ["trace", "synth", "--nodes", "100", "--duration", str(20 * 86400), "--fit", str(kth_swf), "--out", str(out)]
    assert main(args) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("KS distance")]
    assert len(lines) == 2 and "fragment lengths" in lines[0] and "idle-pool size" in lines[1]
    assert 0 <= float(lines[0].split(": ")[-1].split()[0]) < 0.1
    assert 0 <= float(lines[1].split(": ")[-1].split()[0]) <= 1
    assert traces.read(out).n_nodes == 100


def test_synth_marks_synthetic_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "s.csv"
    assert main(["trace", "synth", "--nodes", "32", "--duration", "86400", "--out", str(out)]) == 0
    assert "SYNTHETIC (bursty)" in capsys.readouterr().out
    assert main(["trace", "stats", str(out)]) == 0
    assert "kind            SYNTHETIC (generated, not a real log)" in capsys.readouterr().out
    assert traces.read(out).is_synthetic


def test_synth_fit_prints_both_ks_and_plots(tmp_path: Path, summit_nodes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "summit-like.csv.gz"
    args = ["trace", "synth", "--nodes", "4608", "--duration", "604800", "--fit", str(summit_nodes),
            "--out", str(out), "--plot", str(tmp_path / "figs")]
    assert main(args) == 0
    text = capsys.readouterr().out
    ks = {line.split(" vs ")[0]: float(line.split(": ")[-1].split()[0]) for line in text.splitlines()
          if line.startswith("KS distance")}
    assert ks["KS distance of fragment lengths"] <= 0.05
    assert ks["KS distance of idle-pool size over time (idle fraction, time-weighted)"] <= 0.10
    names = sorted(p.name for p in (tmp_path / "figs").glob("*.png"))
    assert names == ["fragment_cdf.png", "idle_nodes.png", "synthetic_vs_real.png"]
