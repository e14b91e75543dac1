"""Job files: the interpreter rule, {samples}, limits, and fuzzing (only JobSpecError, never a traceback)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from malletrain.daemon.jobspec import (
    JobSpec,
    JobSpecError,
    check_submit,
    decode_job_file,
    load_spec,
    parse_spec,
)
from malletrain.daemon.store import Store

PY = "/opt/venv/bin/python"


def spec(**kw: object) -> JobSpec:
    return parse_spec({"command": ["python", "-m", "pkg.train"], **kw})


# -- the interpreter rule ---------------------------------------------------------------------

@pytest.mark.parametrize("command, expected", [
    (["python", "-m", "x"], [PY, "-m", "x"]),
    (["python3", "train.py"], [PY, "train.py"]),
    (["nice", "-n", "5", "{python}", "t.py"], ["nice", "-n", "5", PY, "t.py"]),
    (["/usr/bin/python", "t.py"], ["/usr/bin/python", "t.py"]),      # a path is used as given
    (["python3.11", "t.py"], ["python3.11", "t.py"]),                # so is a versioned name
    (["./run.sh", "python"], ["./run.sh", "python"]),                 # only the first word
])
def test_interpreter_rule(command: list[str], expected: list[str]) -> None:
    resolved = parse_spec({"command": command}).resolved(PY)
    assert list(resolved.command) == expected
    assert resolved.resolved("/other/python") == resolved  # idempotent: nothing left to replace


def test_load_spec_uses_the_submitting_python_and_resolves_cwd(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    f = tmp_path / "job.toml"
    f.write_text('command = ["python", "-m", "t", "--samples", "{samples}"]\nsamples = 5000\ncwd = "sub"\n')
    s = load_spec(f)
    assert s.command == (sys.executable, "-m", "t", "--samples", "5000")
    assert s.cwd == str((tmp_path / "sub").resolve())
    assert JobSpec.from_json(s.to_json()) == s  # what is stored reads back the same


def test_samples_placeholder_needs_samples(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match=r"uses \{samples\} but samples is not set"):
        parse_spec({"command": ["python", "t.py", "{samples}"]}).resolved(PY)


def test_empty_sys_executable_is_an_error() -> None:
    with pytest.raises(JobSpecError, match="sys.executable is empty"):
        spec().resolved("")


# -- limits and bad input -----------------------------------------------------------------------

BAD = {
    "max_nodes = 9223372036854775807": "max_nodes must be an integer >= 1 and <= 100000",
    "min_nodes = 0": "min_nodes must be an integer >= 1",
    "samples = 10000000000000000000": "samples must be an integer",
    'env = { "A=B" = "1" }': "env key 'A=B' is not a variable name",
    'env = { "1X" = "1" }': "is not a variable name",
    'env = { MALLETRAIN_STORE = "evil:1" }': "MALLETRAIN_STORE is refused",
    'env = { malletrain_job = "x" }': "is refused",
    'env = { A = "a\\u0000b" }': r"env\[A\] contains a NUL byte",
    'name = "ok\\nFAKE j000002 running"': "non-printable character",
    'name = "\\u001b[31mred"': "non-printable character",
    'name = "' + "x" * 200 + '"': "name is 200 characters; at most 128",
    'cwd = "/no/such/dir/anywhere"': "is not an existing directory",
    'cwd = "a\\u0000b"': "cwd contains a NUL byte",
    "scaling = { 0 = 1.0 }": "scaling key '0' is not a node count",
    "scaling = { 1 = nan }": r"scaling\[1\] = nan is not a finite rate",
    "scaling = { 1 = inf }": "is not a finite rate",
    "scaling = { 100001 = 1.0 }": "must be >= 1 and <= 100000",
    "scaling = { \"\\uff11\" = 1.0 }": "is not a node count",       # a fullwidth digit
    "profile = 1": "profile must be true or false",
}


@pytest.mark.parametrize("extra, why", BAD.items(), ids=list(BAD))
def test_bad_job_files_name_the_file_and_field(tmp_path: Path, extra: str, why: str) -> None:
    f = tmp_path / "job.toml"
    f.write_text(f'command = ["python", "t.py"]\n{extra}\n')
    with pytest.raises(JobSpecError, match=why) as info:
        load_spec(f)
    assert str(f) in str(info.value)


def test_bad_commands(tmp_path: Path) -> None:
    cases = {
        json.dumps({"command": ["python", "a\u0000b"]}): r"command\[1\] contains a NUL byte",
        json.dumps({"command": ["x"] * 5000}): "command has 5000 words; at most 4096",
        json.dumps({"command": ["x", "y" * 200_000]}): "command is longer than",
        json.dumps({"command": ["x"], "env": {f"V{i}": "1" for i in range(300)}}): "env has 300 variables",
        json.dumps({"command": ["x", "\ud800"]}): "lone surrogate",
        json.dumps({"command": ["x"], "max_nodes": 1e300}): "max_nodes must be an integer",
    }
    f = tmp_path / "job.json"
    for text, why in cases.items():
        f.write_text(text)
        with pytest.raises(JobSpecError, match=why) as info:
            load_spec(f)
        assert str(f) in str(info.value)


def test_undecodable_huge_and_deep_files_name_the_file(tmp_path: Path) -> None:
    f = tmp_path / "job.toml"
    f.write_bytes(b'command = ["python", "caf\xe9.py"]\n')
    with pytest.raises(JobSpecError, match="not UTF-8") as info:
        load_spec(f)
    assert str(f) in str(info.value)
    for path, text in ((tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000),
                       (tmp_path / "deep.toml", "a = " + "[" * 100_000 + "]" * 100_000),
                       (tmp_path / "deep2.toml", "a = " + "{b = " * 50_000 + "1" + "}" * 50_000)):
        path.write_text(text)
        with pytest.raises(JobSpecError) as info:
            load_spec(path)
        assert str(path) in str(info.value)
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 * 1024 * 1024))
    with pytest.raises(JobSpecError, match="at most 1048576"):
        load_spec(big)
    digits = tmp_path / "digits.json"
    digits.write_text('{"command": ["x"], "samples": ' + "9" * 10_000 + "}")
    with pytest.raises(JobSpecError) as info:
        load_spec(digits)
    assert str(digits) in str(info.value)


def test_machine_size_is_checked_at_submit(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store.db")
    assert store.machine_nodes() is None
    store.submit(spec(max_nodes=1000))  # unknown machine: only the absolute cap
    store.set_machine_nodes(64)
    with pytest.raises(JobSpecError, match="max_nodes 65 is more than the machine's 64 nodes"):
        store.submit(spec(max_nodes=65))
    with pytest.raises(JobSpecError, match="min_nodes 65"):
        store.submit(spec(min_nodes=65, max_nodes=65))
    store.submit(spec(max_nodes=64))
    with pytest.raises(JobSpecError, match="env key 'A=B'"):  # a spec built in code is checked too
        store.submit(JobSpec("x", ("true",), env={"A=B": "1"}))
    with pytest.raises(JobSpecError, match="must be an absolute path"):
        check_submit(spec(cwd="rel/dir"), "job")
    assert len(store.jobs()) == 2


def test_default_name_is_printable() -> None:
    name = parse_spec({"command": ["x", "evil\x1b[2J.py"]}).name
    assert all(ch.isprintable() for ch in name) and name


# -- fuzzing ---------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=20,
)
FIELDS = ("name", "command", "min_nodes", "max_nodes", "profile", "scaling", "samples", "cwd", "env")
field_values = st.one_of(
    json_values,
    st.lists(st.text(max_size=12), max_size=5),
    st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    st.dictionaries(st.text(max_size=4), st.floats() | st.integers(), max_size=3),
    st.integers(min_value=-(2**70), max_value=2**70),
)
job_dicts = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), field_values, max_size=8)


def _only_jobspec_errors(obj: object) -> None:
    try:
        s = parse_spec(obj, "fuzz")
    except JobSpecError:
        return
    again = JobSpec.from_json(s.to_json())  # anything accepted is stored and read back unchanged
    assert again == s
    if "{samples}" in s.command and s.samples is None:
        with pytest.raises(JobSpecError):
            s.resolved(PY)
    else:
        assert PY in s.resolved(PY).command or s.command[0] not in ("python", "python3")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job_dicts)
def test_fuzz_job_dicts(obj: dict[str, object]) -> None:
    _only_jobspec_errors(obj)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_fuzz_any_json_value(obj: object) -> None:
    _only_jobspec_errors(obj)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass")),
       st.sampled_from([".toml", ".json"]))
def test_fuzz_job_file_bytes(data: bytes, suffix: str) -> None:
    try:
        obj = decode_job_file(Path("fuzz" + suffix), data)
        parse_spec(obj, "fuzz")
    except JobSpecError as exc:
        assert "fuzz" in str(exc)


def test_launcher_workers_per_node_and_worker_batch_are_read_and_kept():
    from malletrain.daemon.jobspec import JobSpec, Launcher, parse_spec
    spec = parse_spec({"command": ["python", "train.py"], "launcher": "torchrun", "workers_per_node": 2,
                       "worker_batch": 16})
    assert (spec.launcher, spec.workers_per_node, spec.worker_batch) == (Launcher.TORCHRUN, 2, 16)
    assert JobSpec.from_json(spec.to_json()) == spec
    plain = parse_spec({"command": ["python", "train.py"]})
    assert (plain.launcher, plain.workers_per_node, plain.worker_batch) == (Launcher.ELASTIC, None, None)
    assert "launcher" not in plain.to_json() and "worker_batch" not in plain.to_json()


@pytest.mark.parametrize("obj, words", [
    ({"launcher": "mpirun"}, "launcher must be one of"),
    ({"launcher": 1}, "launcher must be one of"),
    ({"workers_per_node": 0}, "workers_per_node must be an integer"),
    ({"workers_per_node": 2**63}, "workers_per_node must be an integer"),
    ({"worker_batch": -1}, "worker_batch must be an integer"),
    ({"worker_batch": "32"}, "worker_batch must be an integer"),
])
def test_bad_launcher_fields_are_named(obj, words):
    from malletrain.daemon.jobspec import JobSpecError, parse_spec
    with pytest.raises(JobSpecError, match=words):
        parse_spec({"command": ["python", "train.py"], **obj}, "job.toml")
