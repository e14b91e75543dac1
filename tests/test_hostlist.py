"""The one Slurm host-list parser, read by the Slurm backend and the trace readers alike."""

from __future__ import annotations

import pytest

from hostlist import HostListError, expand_hostlist


def test_ranges_lists_and_padding_expand_in_order() -> None:
    assert expand_hostlist("node[1-3,7],gpu01") == ("node1", "node2", "node3", "node7", "gpu01")
    assert expand_hostlist("c[01-02]s[8-9]") == ("c01s8", "c01s9", "c02s8", "c02s9")
    assert expand_hostlist(" n[08-10] ") == ("n08", "n09", "n10")


@pytest.mark.parametrize("text", ["", "(null)", "N/A", "None", "None assigned", "Unknown"])
def test_unset_lists_are_none(text: str) -> None:
    assert expand_hostlist(text) is None


@pytest.mark.parametrize(("text", "why"), [
    ("n[1-x]", "range '1-x'"),  # brackets hold numbers only (the backend's parser was this strict)
    ("n[a,b]", "range 'a'"),
    ("n[3-1]", "reversed range"),  # (the trace readers' parser was this strict)
    ("a[[1-2]]", "nested"),
    ("a[1-2", "unbalanced"),
    ("a1-2]", "unbalanced"),
])
def test_malformed_lists_are_named(text: str, why: str) -> None:
    with pytest.raises(HostListError) as err:
        expand_hostlist(text)
    assert str(err.value).startswith(f"bad host list {text!r}") and why in str(err.value)


def test_a_list_naming_more_than_the_limit_is_none_before_it_is_expanded() -> None:
    assert expand_hostlist("n[1-4]", limit=3) is None
    assert expand_hostlist("n[1-999999999]s[1-999999999]") is None  # 10^18 names: counted, never made
    assert expand_hostlist("n[1-3]", limit=3) == ("n1", "n2", "n3")
