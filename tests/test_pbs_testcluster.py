"""The PBS test cluster's pure parts: the files it writes and where it finds and caches the build."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clusters.pbs_cluster import (
    ClusterUnavailable,
    PbsCluster,
    cache_dir,
    render_hosts,
    render_pbs_conf,
    render_vnodes,
    source_tarball,
    vnode_names,
)


def test_pbs_conf_starts_every_daemon_on_this_host_and_keeps_the_rest() -> None:
    conf = "PBS_EXEC=/opt/pbs\nPBS_SERVER=old\nPBS_START_SERVER=0\nPBS_START_MOM=0\nPBS_HOME=/var/spool/pbs\n"
    out = render_pbs_conf(conf, "vm").splitlines()
    assert out[0] == "PBS_EXEC=/opt/pbs" and "PBS_HOME=/var/spool/pbs" in out
    want = {"PBS_SERVER=vm", "PBS_START_SERVER=1", "PBS_START_MOM=1", "PBS_START_SCHED=1", "PBS_START_COMM=1"}
    assert want <= set(out)
    assert "PBS_SERVER=old" not in out and len(out) == len(set(out))


def test_vnode_definitions_leave_the_host_without_cpus_and_give_each_vnode_four_gpus() -> None:
    text = render_vnodes("vm", vnode_names(2))
    assert text.splitlines() == [
        "$configversion 2", "vm: resources_available.ncpus = 0",
        "vn0: resources_available.ncpus = 1", "vn0: resources_available.mem = 1gb",
        "vn0: resources_available.ngpus = 4",
        "vn1: resources_available.ncpus = 1", "vn1: resources_available.mem = 1gb",
        "vn1: resources_available.ngpus = 4",
    ]


def test_hosts_map_the_host_name_to_a_non_loopback_address_only() -> None:
    hosts = "127.0.0.1 localhost\n127.0.0.1 vm vm.local\n127.0.1.1 vm\n::1 localhost ip6-localhost\n"
    out = render_hosts(hosts, "vm", "192.0.2.2").splitlines()
    assert out == ["127.0.0.1 localhost", "::1 localhost ip6-localhost", "192.0.2.2 vm"]


def test_source_and_cache_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "openpbs-abc.tar.gz"
    src.write_bytes(b"one")
    monkeypatch.setenv("MALLETRAIN_PBS_SOURCE", str(src))
    monkeypatch.setenv("MALLETRAIN_PBS_CACHE", str(tmp_path / "cache"))
    assert source_tarball() == src
    first = cache_dir(src)
    assert first.parent == tmp_path / "cache"
    src.write_bytes(b"two")
    assert cache_dir(src) != first  # another source, another build
    monkeypatch.setenv("MALLETRAIN_PBS_SOURCE", str(tmp_path / "missing.tar.gz"))
    with pytest.raises(ClusterUnavailable, match="MALLETRAIN_PBS_SOURCE=.*missing.tar.gz is not a file"):
        source_tarball()


def test_bad_cluster_sizes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="n_vnodes must be >= 1"):
        PbsCluster(0, root=tmp_path)
    with pytest.raises(ValueError, match="kill_delay_s must be >= 1"):
        PbsCluster(2, kill_delay_s=0, root=tmp_path)
