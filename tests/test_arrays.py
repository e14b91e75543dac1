"""Job arrays: index specs, one job per index with {index} and MALLETRAIN_ARRAY_INDEX, one status line
an array, cancel of the array or one element (CLI without a daemon, and the daemon's control API)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from malletrain.daemon.arrays import (
    ARRAY_MAX_ELEMENTS, ArraySpecError, element_spec, parse_indices, resolve, submit_array, summary,
)
from malletrain.cli import main
from malletrain.daemon.control import Caller, Cancel, Submit
from malletrain.daemon.jobspec import JobSpec, JobState
from malletrain.daemon.store import Store
from contract.workerenv import ENV_ARRAY_INDEX
from policy import PolicyConfig

try:
    from test_conformance import Harness
except ImportError:  # run from the repository root as a package
    from tests.test_conformance import Harness  # type: ignore[no-redef]


@pytest.mark.parametrize("text, indices", [
    ("0-4", (0, 1, 2, 3, 4)), ("0-9:3", (0, 3, 6, 9)), ("1,3,5", (1, 3, 5)), ("7", (7,)),
    ("0-3,2-5:3,9", (0, 1, 2, 3, 5, 9)), (" 0-1 , 4 ", (0, 1, 4)),
])
def test_index_specs_as_slurm_users_write_them(text: str, indices: tuple[int, ...]) -> None:
    assert parse_indices(text) == indices


@pytest.mark.parametrize("text, words", [
    ("", ["empty"]), ("5-1", ["'5-1'", "below its start"]), ("0-9:0", ["'0-9:0'", "step"]),
    ("a-b", ["'a-b'", "N-M"]), ("1,,2", ["''"]), ("-3", ["'-3'"]), ("0-2000000", ["above"]),
    (f"0-{ARRAY_MAX_ELEMENTS}", ["more than"]), ("1;2", ["'1;2'"]),
])
def test_bad_index_specs_are_refused_naming_them(text: str, words: list[str]) -> None:
    with pytest.raises(ArraySpecError) as err:
        parse_indices(text)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_each_element_gets_its_index_in_its_command(tmp_path: Path) -> None:
    spec = JobSpec(name="seeds", command=("true", "--seed", "{index}", "--out=run{index}.txt"))
    el = element_spec(spec, "a000001", 7)
    assert el.command == ("true", "--seed", "7", "--out=run7.txt")
    assert (el.array_id, el.array_index) == ("a000001", 7)
    assert JobSpec.from_json(el.to_json()) == el  # stored and read back whole
    store = Store.open(tmp_path / "store.db")
    try:
        aid, jobs = submit_array(store, spec, (0, 2, 4))
        aid2, _ = submit_array(store, spec, (1,))
        assert (aid, aid2) == ("a000001", "a000002") and len(jobs) == 3
        recs = store.jobs()
        assert resolve(recs, aid) == jobs and resolve(recs, f"{aid}_2") == [jobs[1]]
        assert resolve(recs, f"{aid}_3") == [] and resolve(recs, "j000001") == []
        (row, _) = summary([r.as_dict() for r in recs])
        assert (row["array"], row["elements"], row["indices"], row["counts"]) == (aid, 3, [0, 2, 4], {"pending": 3})
    finally:
        store.close()


def _jobfile(tmp_path: Path) -> Path:
    f = tmp_path / "job.toml"
    f.write_text('name = "seeds"\ncommand = ["true", "--seed", "{index}"]\n')
    return f


def test_cli_submits_an_array_shows_it_as_one_line_and_cancels_it(tmp_path: Path, capsys: Any) -> None:
    state = str(tmp_path / "state")
    assert main(["submit", "--state-dir", state, "--array", "0-19", str(_jobfile(tmp_path))]) == 0
    assert capsys.readouterr().out.strip() == "a000001: 20 jobs, j000001 to j000020"
    assert main(["cancel", "--state-dir", state, "a000001_3"]) == 0
    capsys.readouterr()
    assert main(["status", "--state-dir", state]) == 0
    out = capsys.readouterr().out
    assert "j000001" not in out  # the elements are one line ...
    line = next(ln for ln in out.splitlines() if ln.startswith("a000001"))
    assert "0-19" in line and "20" in line and "19 pending, 1 cancelled" in line
    assert main(["status", "--state-dir", state, "--elements"]) == 0
    assert "j000020" in capsys.readouterr().out  # ... each on request
    assert main(["cancel", "--state-dir", state, "a000001"]) == 0
    store = Store.open(Path(state) / "store.db")
    try:
        assert {r.state for r in store.jobs()} == {JobState.CANCELLED}
        assert sorted(r.spec.array_index for r in store.jobs()) == list(range(20))
    finally:
        store.close()
    assert main(["submit", "--state-dir", state, "--array", "3-1", str(_jobfile(tmp_path))]) == 2
    assert "--array '3-1'" in capsys.readouterr().err


def test_the_daemon_runs_each_element_with_its_index_and_cancels_the_array(tmp_path: Path) -> None:
    h = Harness(tmp_path / "d", PolicyConfig(profiling="never", admission="fixed"))
    envs: dict[str, dict[str, str]] = {}
    start = h.daemon.act.hub.start_worker

    def recording(node: str, worker: str, argv: Any, env: Any, *a: Any, **k: Any) -> None:
        envs[worker] = dict(env)
        start(node, worker, argv, env, *a, **k)

    h.daemon.act.hub.start_worker = recording  # type: ignore[method-assign]
    try:
        me = Caller(0, 0, True)
        reply = h.daemon.api.handle(Submit({"command": ["true", "{index}"], "array": "4-6"}, 0, 0), me)
        assert reply["ok"] and reply["id"] == "a000001" and len(reply["jobs"]) == 3
        h.cluster.became_idle("n01", "n02", "n03")
        h.run_until(5.0)
        seen = {e[ENV_ARRAY_INDEX] for e in envs.values()}
        assert seen == {"4", "5", "6"}
        assert [r.spec.command[-1] for r in h.daemon.store.jobs()] == ["4", "5", "6"]
        assert h.daemon.api.owner_of("a000001") == 0 and h.daemon.api.owner_of("a000009") is None
        reply = h.daemon.api.handle(Cancel("a000001"), me)
        assert reply["ok"] and reply["jobs"] == [r.id for r in h.daemon.store.jobs()]
        h.run_until(8.0)
        assert {r.state for r in h.daemon.store.jobs()} == {JobState.CANCELLED}
    finally:
        h.close()
