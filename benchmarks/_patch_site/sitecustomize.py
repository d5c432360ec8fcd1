"""Makes the wake-engine changes a benchmark asked for as a Python process starts, before its
own code runs: ``benchmarks._child.patched_environment`` puts this folder first on
``PYTHONPATH``, so every Python process of the tree it starts (a load test, and the server the
load test starts) makes them. Each process that made some appends a JSON line to the file
``AIOGPU_BENCH_APPLIED`` names: its ``argv`` and what it changed.

Python imports one ``sitecustomize``, the first on its path: another one installed with the
interpreter is left out in these processes.
"""

import json
import os
import sys

if json.loads(os.environ.get("AIOGPU_BENCH_PATCHES", "[]")):
    from benchmarks import _child

    _applied = _child.apply_started_patches()
    _record = os.environ.get(_child.APPLIED_VARIABLE)
    if _record:
        with open(_record, "a", encoding="utf-8") as _file:
            _file.write(json.dumps({"argv": sys.orig_argv, "applied": _applied}) + "\n")
