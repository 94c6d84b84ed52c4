"""The test install is complete, or the run fails: a package of the test extra never makes its tests skip."""

from __future__ import annotations

import os
import re

import pytest

import tests.conftest as root

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_the_guard_lists_the_test_extra_and_triton():
    assert {"hypothesis", "numpy", "transformers", "ray", "triton"} <= set(root.extra_test_packages())


def test_a_missing_package_fails_the_run(monkeypatch):
    assert root.missing_test_packages(lambda name: None if name == "ray" else object()) == ["ray"]
    monkeypatch.setattr(root, "missing_test_packages", lambda: ["ray"])
    with pytest.raises(pytest.UsageError, match=r"lacks ray; install it with pip install -e '\.\[test\]'"):
        root.pytest_configure(None)


def test_no_test_skips_when_a_package_of_the_test_install_is_missing():
    """importorskip (or an ImportError turned into a skip) of a test-extra package hides a broken install."""
    packages = set(root.extra_test_packages())
    found = []
    for folder, _, files in os.walk(TESTS):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(folder, f), encoding="utf-8").read()
                found += [f"{f}: {m}" for m in re.findall(r"importorskip\(\s*['\"]([\w.]+)", text) if m.split(".")[0] in packages]
    assert not found, found
