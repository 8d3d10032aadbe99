"""`--app package.module:attribute` when it does not give an app: each way it can fail is one
line that says which part failed (the module is missing, the module was found but one of its
own imports failed, it raised, it has no such attribute, the attribute is no SyncLane) and how to
fix that part; never "install its package" for a module that was found."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from command_line import Run

PYTHON_WORDS = ("Traceback", 'File "')


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., str]]:
    """module(source) writes a module of its own name in a folder on sys.path; returns its name.
    module(source, package=True) makes it a package with that __init__.py."""
    monkeypatch.syspath_prepend(str(tmp_path))
    made: list[str] = []

    def write(source: str, *, package: bool = False) -> str:
        name = f"userapp_{uuid.uuid4().hex[:8]}"
        if package:
            (tmp_path / name).mkdir()
            (tmp_path / name / "__init__.py").write_text(source, encoding="utf-8")
        else:
            (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
        made.append(name)
        return name

    yield write
    for name in made:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            sys.modules.pop(loaded, None)


def one_line(code: int, err: str) -> str:
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("synclane: error: "), err
    assert not any(word in err for word in PYTHON_WORDS), err
    return err.removeprefix("synclane: error: ").rstrip("\n")


def test_a_missing_dependency_of_the_app_is_named_as_the_app_module_s_import(
    run: Run, module: Callable[..., str]
) -> None:
    name = module("import nosuchdep\n")
    said = one_line(*run("--app", f"{name}:app", "jobs", app=False)[::2])
    assert said.startswith(f"the app module {name!r} was found, but its import of 'nosuchdep'")
    assert "No module named 'nosuchdep'" in said
    assert sys.executable in said, "which Python it must be installed into"
    assert "run from the folder that holds it" not in said
    assert said.endswith("(--traceback shows where)")


def test_a_missing_submodule_of_a_dependency_is_the_app_module_s_import_too(
    run: Run, module: Callable[..., str]
) -> None:
    """`import json.nosuch`: the package exists, its module does not; still the app's import."""
    name = module("import json.nosuchpart\n")
    said = one_line(*run("--app", f"{name}:app", "jobs", app=False)[::2])
    assert said.startswith(f"the app module {name!r} was found, but its import of 'json.nosu")


def test_a_name_its_import_cannot_find_is_the_app_module_s_import(
    run: Run, module: Callable[..., str]
) -> None:
    name = module("from synclane import NoSuchName\n")
    said = one_line(*run("--app", f"{name}:app", "jobs", app=False)[::2])
    assert said.startswith(f"the app module {name!r} was found, but an import in it failed: ")
    assert "cannot import name 'NoSuchName' from 'synclane'" in said
    assert "install its package" not in said


def test_a_missing_module_is_still_one_line_naming_it(run: Run) -> None:
    said = one_line(*run("--app", "no_such_module_here:app", "jobs", app=False)[::2])
    assert said == (
        "cannot import the app 'no_such_module_here:app': there is no module "
        "'no_such_module_here'; install its package or run from the folder that holds it"
    )


def test_a_package_without_the_named_module_says_so(run: Run, module: Callable[..., str]) -> None:
    package = module("", package=True)
    said = one_line(*run("--app", f"{package}.jobs:app", "jobs", app=False)[::2])
    assert said.startswith(
        f"cannot import the app '{package}.jobs:app': the package {package!r} has no module 'jobs'"
    )


def test_a_module_without_the_attribute_names_the_apps_it_has(
    run: Run, module: Callable[..., str]
) -> None:
    name = module("from synclane import SyncLane\n\nsync_app = SyncLane(None)\n")
    said = one_line(*run("--app", f"{name}:app", "jobs", app=False)[::2])
    assert said.startswith(f"the module {name!r} (")
    assert f"{name}.py) has no 'app'" in said, "where the module was found: a shadow shows"
    assert said.endswith(f"its SyncLane is 'sync_app': the app path {name}:sync_app")


def test_an_attribute_that_is_no_app_names_what_it_is(run: Run, module: Callable[..., str]) -> None:
    name = module("def app():\n    return None\n")
    said = one_line(*run("--app", f"{name}:app", "jobs", app=False)[::2])
    assert said.startswith(f"the app path '{name}:app' names a function, not a SyncLane")
    assert said.endswith("the module defines no SyncLane")


def test_an_app_module_with_a_syntax_error_says_where(run: Run, module: Callable[..., str]) -> None:
    name = module("x = (\n")
    said = one_line(*run("--app", f"{name}:app", "jobs", app=False)[::2])
    assert said.startswith(f"the app module {name!r} raised SyntaxError: ")
    assert f"{name}.py, line 1" in said
