"""Packaging: every folder of the `mocker` package ships in a plain `pip install .`."""

from __future__ import annotations

from pathlib import Path

from setuptools import find_packages

import mocker

ROOT = Path(mocker.__file__).parent


def test_every_source_folder_is_a_regular_package() -> None:
    # setuptools' find_packages ships only folders with an __init__.py; a folder without
    # one still imports from a checkout (a namespace package) but is missing when installed.
    folders = {p.parent for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}
    missing = sorted(
        str(f.relative_to(ROOT.parent)) for f in folders if not (f / "__init__.py").exists()
    )
    assert missing == []
    found = set(find_packages(str(ROOT.parent), include=["mocker*"]))
    assert {".".join(f.relative_to(ROOT.parent).parts) for f in folders} <= found
