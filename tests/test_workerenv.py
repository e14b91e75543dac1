"""The worker environment contract: one parser, one writer, errors that name the variable."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from contract.workerenv import (
    ALL_VARIABLES,
    DEFAULT_COLLECTIVE_TIMEOUT_S,
    DEFAULT_STORE_GRACE_S,
    ENV_COLLECTIVE_TIMEOUT,
    ENV_JOB,
    ENV_LOG_LEVEL,
    ENV_STORE,
    ENV_STORE_GRACE,
    ENV_TOY_DIR,
    ENV_WORKER,
    WorkerEnv,
    WorkerEnvError,
)


def test_empty_environment_is_a_local_run() -> None:
    env = WorkerEnv.from_environ({})
    assert env == WorkerEnv()
    assert env.store is None and env.job is None and env.store_text == "(no store)"
    assert env.collective_timeout_s == DEFAULT_COLLECTIVE_TIMEOUT_S and env.store_grace_s == DEFAULT_STORE_GRACE_S
    with pytest.raises(WorkerEnvError, match=ENV_JOB):
        env.require_job()
    with pytest.raises(WorkerEnvError, match=ENV_WORKER):
        env.require_worker()
    with pytest.raises(WorkerEnvError, match=ENV_TOY_DIR):
        env.require_toy_dir()


def test_written_environment_parses_back_to_the_same_contract(tmp_path: Path) -> None:
    env = WorkerEnv(job="j1", worker="w0", monitor="tcp://127.0.0.1:5", runtime="torch",
                    store=("127.0.0.1", 29500), collective_timeout_s=2.5, store_grace_s=12.0,
                    horovod_job_dir=tmp_path / "hvd", toy_dir=tmp_path / "toy", log_level=logging.DEBUG,
                    job_secret="s3cret")
    written = env.to_environ()
    assert set(written) <= set(ALL_VARIABLES)
    assert written[ENV_STORE] == "127.0.0.1:29500" and written[ENV_LOG_LEVEL] == "DEBUG"
    assert WorkerEnv.from_environ(written) == env
    assert "s3cret" not in repr(env)
    ipv6 = WorkerEnv(job="j", worker="w", store=("::1", 7))
    assert WorkerEnv.from_environ(ipv6.to_environ()).store == ("::1", 7)


@pytest.mark.parametrize("name,value,message", [
    (ENV_STORE, "nohost", "MALLETRAIN_STORE='nohost' is not host:port"),
    (ENV_STORE, "h:99999", "port 99999 out of range"),
    (ENV_STORE, "h:x", "port 'x' is not an integer"),
    (ENV_COLLECTIVE_TIMEOUT, "soon", "MALLETRAIN_COLLECTIVE_TIMEOUT='soon' is not a number of seconds"),
    (ENV_STORE_GRACE, "-1", "MALLETRAIN_STORE_GRACE='-1' must be a finite number > 0"),
    (ENV_LOG_LEVEL, "loud", "MALLETRAIN_LOG_LEVEL='loud' is not a log level"),
    (ENV_JOB, "a/b", "MALLETRAIN_JOB='a/b'"),
])
def test_bad_values_name_the_variable(name: str, value: str, message: str) -> None:
    base = {ENV_JOB: "j", ENV_WORKER: "w"}
    with pytest.raises(WorkerEnvError, match=message.replace("(", r"\(").replace(")", r"\)")):
        WorkerEnv.from_environ({**base, name: value})


def test_a_store_without_job_or_worker_is_refused() -> None:
    with pytest.raises(WorkerEnvError, match="MALLETRAIN_STORE is set but MALLETRAIN_WORKER is not"):
        WorkerEnv.from_environ({ENV_STORE: "127.0.0.1:5", ENV_JOB: "j"})


def test_every_runtime_writes_its_worker_env_through_the_contract(tmp_path: Path) -> None:
    from malletrain.runtimes.horovod_elastic import HorovodRuntime
    from malletrain.runtimes.toy import ToyRuntime

    toy = ToyRuntime(str(tmp_path / "toy"), monitor="tcp://127.0.0.1:9")
    parsed = WorkerEnv.from_environ(toy.launch_spec("j", ["x"], "w", "n").env)
    assert (parsed.job, parsed.worker, parsed.toy_dir, parsed.monitor) == ("j", "w", tmp_path / "toy",
                                                                          "tcp://127.0.0.1:9")
    hvd = HorovodRuntime(tmp_path / "hvd")
    hvd.start()
    try:
        parsed = WorkerEnv.from_environ(hvd.launch_spec("j", ["x"], "w", "n").env)
        assert (parsed.job, parsed.worker) == ("j", "w")
    finally:
        hvd.close()


def test_torchrun_environ_numbers_ranks_node_by_node():
    from contract.workerenv import TORCHRUN_VARIABLES, RankPlace, torchrun_environ
    seen = set()
    for node in range(3):
        for local in range(2):
            env = torchrun_environ(RankPlace(node, 3, local, 2), ("10.0.0.1", 29400), "job-1", restart_count=2)
            assert set(env) == set(TORCHRUN_VARIABLES)
            assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == ("6", "2", "3")
            assert env["LOCAL_RANK"] == str(local) and env["GROUP_RANK"] == str(node)
            assert env["TORCHELASTIC_RESTART_COUNT"] == "2" and env["MASTER_PORT"] == "29400"
            seen.add(int(env["RANK"]))
    assert seen == set(range(6))


def test_a_rank_place_outside_its_world_is_refused():
    from contract.workerenv import RankPlace, WorkerEnvError
    with pytest.raises(WorkerEnvError, match="local_rank 2"):
        RankPlace(0, 1, 2, 2)
    with pytest.raises(WorkerEnvError, match="group_rank 3"):
        RankPlace(3, 3, 0, 1)
