"""The generated streams (nas, hpo, stress, imagenet7): API, determinism, spread and labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator.perfmodel import NODE_COUNTS, SUMMIT_V100, efficiency
from simulator.streams import IMAGENET_TRAIN, NAS_EPOCHS, STREAMS, draws, machine_for
from simulator.workload import (
    DEFAULT_SAMPLES,
    JobSpec,
    Workload,
    WorkloadError,
    load_scaling,
    make_workload,
    synthetic_scaling,
)


def _jobs(name: str, sc, seed: int = 0, k: int = 200) -> list[JobSpec]:  # type: ignore[no-untyped-def]
    wl = make_workload(name, sc, seed=seed)
    out = [wl.draw() for _ in range(k)]
    assert all(j is not None for j in out)
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("name", STREAMS)
def test_every_stream_is_a_workload_of_valid_jobs(summit_scaling: Path, name: str):
    sc = load_scaling(summit_scaling)
    wl = make_workload(name, sc, seed=3)
    assert isinstance(wl, Workload) and wl.name == name and not wl.finite and not wl.synthetic
    assert wl.models and all(all(v > 0 for v in c.values()) for c in wl.models.values())
    for i in range(50):
        job = wl.draw()
        assert isinstance(job, JobSpec)
        assert job.name == f"{job.model}#{i}"
        assert (job.min_nodes, job.max_nodes, job.up_cost_s, job.down_cost_s) == (1, 64, 18.0, 12.0)
        assert sorted(job.scaling) == list(NODE_COUNTS)
        assert all(v > 0 for v in job.scaling.values())
        assert job.samples > 0
    finite = make_workload(name, sc, seed=3, n_jobs=2)
    assert finite.finite and [finite.draw() is None for _ in range(3)] == [False, False, True]


@pytest.mark.parametrize("name", STREAMS)
def test_draws_are_deterministic_per_seed(summit_scaling: Path, name: str):
    sc = load_scaling(summit_scaling)
    a, b, c = _jobs(name, sc, 1, 60), _jobs(name, sc, 1, 60), _jobs(name, sc, 2, 60)
    assert a == b
    assert [j.name for j in a] != [j.name for j in c]
    assert make_workload(name, sc, seed=1).models == make_workload(name, sc, seed=1).models


def test_imagenet7_is_the_former_nas_stream(summit_scaling: Path):
    sc = load_scaling(summit_scaling)
    jobs = _jobs("imagenet7", sc, 3, 400)
    assert {j.model for j in jobs} == set(sc.nas_models)
    assert all(j.samples == DEFAULT_SAMPLES and j.scaling == sc.curves[j.model] for j in jobs)
    assert set(make_workload("imagenet7", sc).models) == set(sc.nas_models)


def test_nas_draws_nb101_architectures_with_epoch_budgets(summit_scaling: Path):
    jobs = _jobs("nas", load_scaling(summit_scaling), 0, 300)
    assert all(j.model.startswith("nb101-") for j in jobs)
    assert len({j.model for j in jobs}) > 100
    assert {round(j.samples / IMAGENET_TRAIN) for j in jobs} <= set(NAS_EPOCHS)
    r1 = np.array([j.scaling[1] for j in jobs])
    assert r1.max() / r1.min() > 5  # architectures differ by far more than noise


def test_hpo_scalability_really_varies(summit_scaling: Path):
    jobs = _jobs("hpo", load_scaling(summit_scaling), 0, 400)
    eff = np.array([efficiency(j.scaling, 64) for j in jobs])
    assert np.percentile(eff, 10) < 0.5 < 0.9 < np.percentile(eff, 90)
    assert len({j.model.split("-b")[0] for j in jobs}) == 8  # the 7 measured models and resnet50
    # the same model with a smaller per-GPU batch scales worse (when not bound by the file system)
    by_model: dict[str, dict[int, float]] = {}
    for j in jobs:
        base, batch = j.model.rsplit("-b", 1)
        by_model.setdefault(base, {})[int(batch)] = efficiency(j.scaling, 64)
    resnet = by_model["resnet50"]
    assert len(resnet) >= 3
    assert [resnet[b] for b in sorted(resnet)] == sorted(resnet.values())


def test_stress_is_labelled_and_scales_badly(summit_scaling: Path):
    jobs = _jobs("stress", load_scaling(summit_scaling), 0, 300)
    assert all(j.model.startswith(("stress-amdahl-", "stress-usl-")) for j in jobs)
    assert all(efficiency(j.scaling, 64) < 0.5 for j in jobs)
    usl = [j for j in jobs if j.model.startswith("stress-usl-")]
    assert usl and any(j.scaling[64] < j.scaling[32] for j in usl)  # past the peak, more nodes hurt


def test_without_measured_curves_the_stored_constants_are_used():
    sc = synthetic_scaling()
    assert machine_for(sc) == SUMMIT_V100
    wl = make_workload("nas", sc, seed=0)
    assert wl.synthetic and wl.draw() is not None
    first = next(draws("hpo", 5))
    assert first == next(draws("hpo", 5, SUMMIT_V100))


def test_unknown_names_still_fail_with_the_list():
    with pytest.raises(WorkloadError, match="neither nas, hpo nor an existing file.*stress, imagenet7"):
        make_workload("imagenet", synthetic_scaling())


def test_nas_jobs_of_one_cell_have_equal_but_separate_curves():
    # a cell's network is costed once (cached); every job still gets a curve dict of its own
    from simulator import nb101
    from simulator.perfmodel import curve
    from simulator.streams import nas_draw

    rng = np.random.default_rng(0)
    seen: dict[str, dict[int, float]] = {}
    repeats = 0
    for _ in range(400):
        state = rng.bit_generator.state
        d = nas_draw(rng, SUMMIT_V100)
        rng2 = np.random.default_rng()
        rng2.bit_generator.state = state
        cost = nb101.network_cost(nb101.sample_cell(rng2))
        assert (d.params, d.macs) == (cost.params, cost.macs)
        assert d.curve == curve(cost, d.per_node_batch, SUMMIT_V100)
        if d.model in seen:
            repeats += 1
            assert seen[d.model] == d.curve and seen[d.model] is not d.curve
        seen[d.model] = d.curve
    assert repeats > 0


def test_epoch_budgets_are_numpys_weighted_choice():
    # _epochs searches one rng.random() in the weights' cdf, as Generator.choice(p=...) does: the same
    # budgets from the same stream, and the generator left in the same state
    from simulator.streams import ETA, HPO_EPOCHS, _epochs

    for budgets in (NAS_EPOCHS, HPO_EPOCHS):
        w = float(ETA) ** np.arange(len(budgets) - 1, -1, -1)
        ours, theirs = np.random.default_rng(7), np.random.default_rng(7)
        for _ in range(5000):
            assert _epochs(ours, budgets) == int(budgets[int(theirs.choice(len(budgets), p=w / w.sum()))])
        assert ours.random() == theirs.random()
