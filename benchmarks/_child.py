"""Run one benchmark module in a child process against a chosen aiogpu tree, optionally with
some of the engine's tunables changed first: the shared runner of ``compare`` and ``ablation``.

The child's ``sys.path`` starts with a folder holding only an ``aiogpu`` link to the tree under
test, then the root of the tree the benchmarks come from, so both sides of a comparison run the
same measurement code; its working directory is that folder, so neither tree's root is found
first. The child writes ``child.json`` beside the benchmark's own results:
which ``aiogpu`` it imported and what it changed.

This module never imports ``aiogpu`` in the parent: only the child does, after its path is set.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

#: Where the engine's tunables live: the policy module, and where there is none (an engine from
#: before it), the watcher.
POLICY = "aiogpu._wait._policy"
FALLBACKS = {POLICY: ("aiogpu._wait._watcher",)}
#: The benchmark modules a child may run, and the results file each writes.
RESULTS = {
    "wake": "wake.json",
    "loop_profile": "loop_profile.json",
    "overlap": "overlap.json",
    "goals": "goals.json",
}
_PATCHES_VARIABLE = "AIOGPU_BENCH_PATCHES"
#: Where ``_patch_site``'s ``sitecustomize`` appends what each process it patched changed.
APPLIED_VARIABLE = "AIOGPU_BENCH_APPLIED"
PATCH_SITE = Path(__file__).resolve().parent / "_patch_site"
#: A patch whose module is this sets an environment variable of the child instead, before the
#: child imports aiogpu (which reads some settings from the environment).
ENVIRON = "environ"


def parse_runner(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """A runner's arguments (``parser``'s, with ``--rounds`` and ``--out``) and, after ``--``,
    the benchmark's own."""
    bench_arguments: list[str] = []
    if "--" in argv:
        argv, bench_arguments = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    arguments = parser.parse_args(argv)
    if arguments.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {arguments.rounds}")
    if "--out" in bench_arguments:
        parser.error("--out after -- is the runner's: give --out before --")
    return arguments, bench_arguments


def check_tree(tree: Path) -> Path:
    """The tree's absolute path, or ``ValueError`` if it holds no ``aiogpu`` package."""
    tree = tree.resolve()
    if not (tree / "aiogpu" / "__init__.py").is_file():
        raise ValueError(f"{tree} holds no aiogpu package (expected {tree / 'aiogpu' / '__init__.py'})")
    return tree


def run(
    bench: str,
    aiogpu_tree: Path,
    benchmarks_tree: Path,
    out: Path,
    arguments: list[str],
    patches: list[tuple[str, str, Any]] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``python -m benchmarks.BENCH --out OUT ARGUMENTS`` with ``aiogpu`` from ``aiogpu_tree``
    and ``benchmarks`` from ``benchmarks_tree``, after setting each ``(module, attribute, value)``
    of ``patches`` (``_apply``; JSON carries the values: ``encode`` infinities). Returns the benchmark's JSON results plus a
    ``child`` entry: the aiogpu file imported, the changes made and the run's wall seconds.

    Raises:
        RuntimeError: the child failed (its output's end is in the message), or imported an
            aiogpu other than the one asked for.
        ValueError: ``bench`` is not one of ``RESULTS``.
    """
    if bench not in RESULTS:
        raise ValueError(f"unknown benchmark {bench!r}: expected one of {', '.join(RESULTS)}")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="aiogpu-bench-") as link_folder:  # the link never lands among the results
        (Path(link_folder) / "aiogpu").symlink_to(aiogpu_tree / "aiogpu", target_is_directory=True)
        environment = _path_first(link_folder, str(benchmarks_tree))
        environment["PYTHONUNBUFFERED"] = "1"
        environment[_PATCHES_VARIABLE] = json.dumps(patches or [])
        started = time.perf_counter()
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks._child", f"benchmarks.{bench}", "--out", str(out), *arguments],
            cwd=link_folder,
            env=environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        wall = time.perf_counter() - started
    (out / "stdout.txt").write_text(child.stdout)
    (out / "stderr.txt").write_text(child.stderr)
    if child.returncode:
        raise RuntimeError(f"benchmarks.{bench} exited with {child.returncode}:\n{(child.stdout + child.stderr)[-3000:]}")
    info = json.loads((out / "child.json").read_text())
    if Path(info["aiogpu_tree"]) != aiogpu_tree.resolve():
        raise RuntimeError(f"the child imported the aiogpu of {info['aiogpu_tree']}, not that of {aiogpu_tree}")
    result: dict[str, Any] = json.loads((out / RESULTS[bench]).read_text())
    result["child"] = {**info, "wall_s": wall}
    return result


def patched_environment(patches: list[tuple[str, str, Any]], record: Path) -> dict[str, str]:
    """This process's environment for a process tree every Python process of which makes
    ``patches`` (encoded, as ``run`` takes them) as it starts, ahead of its own code: a server
    started by a load test too. ``PATCH_SITE`` (its ``sitecustomize``) and the benchmarks' root
    lead ``PYTHONPATH``; each process that made changes appends a JSON line to ``record``: its
    ``argv`` and the changes (``_apply``)."""
    environment = _path_first(str(PATCH_SITE), str(PATCH_SITE.parent.parent))
    environment[_PATCHES_VARIABLE] = json.dumps(patches)
    environment[APPLIED_VARIABLE] = str(record)
    return environment


def _path_first(*folders: str) -> dict[str, str]:
    """This process's environment with ``folders`` leading ``PYTHONPATH``, before what it held."""
    environment = dict(os.environ)
    inherited = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = os.pathsep.join([*folders, *filter(None, inherited.split(os.pathsep))])
    return environment


def apply_started_patches() -> list[dict[str, Any]]:
    """Make the changes this process was started with (``run``, ``patched_environment``);
    returns what changed (``_apply``)."""
    return _apply([(module, attribute, _decode(value)) for module, attribute, value in patches_started_with()])


def patches_started_with() -> list[Any]:
    """The changes this process was started with by ``run`` or ``patched_environment`` (as they
    take them: encoded), for a child of its own to make too."""
    patches: list[Any] = json.loads(os.environ.get(_PATCHES_VARIABLE, "[]"))
    return patches


def owners(name: str, attribute: str) -> list[Any]:
    """The modules that hold the tunable ``attribute``: ``name`` and each of its ``FALLBACKS``
    that can be imported and has it."""
    import importlib

    found = []
    for candidate in (name, *FALLBACKS.get(name, ())):
        try:
            module = importlib.import_module(candidate)
        except ModuleNotFoundError as exc:
            if exc.name != candidate:  # the module is there, and broken
                raise
            continue
        if hasattr(module, attribute):
            found.append(module)
    return found


def _apply(patches: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """Set each ``module.attribute`` in every module of ``owners`` (a module that imported a
    tunable by name keeps a binding of its own: both must change), or, for ``ENVIRON``, the
    environment variable. Raises ``LookupError`` naming the modules tried where none has it."""
    applied = []
    for name, attribute, value in patches:
        if name == ENVIRON:
            applied.append(
                {"module": ENVIRON, "attribute": attribute, "was": repr(os.environ.get(attribute)), "now": repr(value)}
            )
            os.environ[attribute] = str(value)
            continue
        found = owners(name, attribute)
        if not found:
            raise LookupError(f"no tunable {attribute} in {' or '.join((name, *FALLBACKS.get(name, ())))}")
        for module in found:
            applied.append(
                {"module": module.__name__, "attribute": attribute, "was": repr(getattr(module, attribute)), "now": repr(value)}
            )
            setattr(module, attribute, value)
    return applied


def _decode(value: Any) -> Any:
    """JSON has no infinities: ``{"float": "inf"}`` stands for one."""
    if isinstance(value, dict) and set(value) == {"float"}:
        return float(value["float"])
    if isinstance(value, dict):
        return {key: _decode(item) for key, item in value.items()}
    return value


def encode(value: Any) -> Any:
    """``value`` as JSON can carry it to the child (see ``_decode``)."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return {"float": repr(value)}
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    return value


def _main() -> None:
    module, arguments = sys.argv[1], sys.argv[2:]
    out = Path(arguments[arguments.index("--out") + 1])
    applied = apply_started_patches()
    import aiogpu

    (out / "child.json").write_text(
        json.dumps(
            {
                "aiogpu_file": aiogpu.__file__,
                "aiogpu_tree": str(Path(aiogpu.__file__).resolve().parent.parent),
                "aiogpu_version": aiogpu.__version__,
                "patches": applied,
            },
            indent=1,
        )
    )
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()
