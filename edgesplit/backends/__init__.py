"""One folder per backend: its profiler, its compiler and its executor side by side.

The stages reach a backend only through their registries (``profile/backends.py``,
``compile/backends.py``, ``runtime/backends.py`` and ``device/schema.py``'s ``BACKENDS``); a new
backend is one folder here plus one line in each (``tests/toy_backend.py`` is the example).
"""
