"""Tier 1: what `doctor` says the first-call GPU hold costs (it stops other processes)."""

from __future__ import annotations

from tracer.doctor import _hold_cost


def test_a_host_without_libcuda_is_told_the_hold_costs_nothing_until_one_appears() -> None:
    said = _hold_cost("none found")
    assert said.startswith("no libcuda on this host")
    assert "only if one appears" in said
    assert "writers, copiers, ldconfig and O_PATH openers never" in said


def test_a_host_with_libcuda_is_told_its_loaders_are_not_held() -> None:
    said = _hold_cost({"/usr/lib/x86_64-linux-gnu/libcuda.so.1": "8/8 allocation entry points"})
    assert said.startswith("the host's libcuda is probed at start")
    assert "only if one appears" not in said
