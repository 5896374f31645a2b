"""The compiled methods that attrs and cattrs generate for fitplan's classes, kept between runs.

attrs writes the source of a class's ``__init__``, ``__eq__``, ``__repr__``, ``__hash__`` (and the frozen
``__setattr__``) when the class is created, and compiles it (``attr/_make.py`` ``_compile_and_eval``); cattrs
does the same for each structure function it builds (``cattrs/gen/__init__.py``
``make_dict_structure_fn_from_attrs``). Compiling that source was the largest single cost of a short command:
about 70 classes and 18 structure functions, 100-120 ms of a 350 ms ``fitplan estimate`` (measured with
``-X importtime`` and cProfile, issue #26).

``compile(source, filename, "exec")`` is a pure function of its arguments, of the future flags in force where
it is called and of the interpreter (its version and ``-O`` level). :func:`install` puts a caching ``compile``
into those two modules' namespaces (a module global shadows the built-in): a call whose file name names a
fitplan class (``<attrs generated methods fitplan.inputs.scenario.Lora>``) is looked up under
``(library, filename, source)`` (a digest of the whole source text), so a changed class or a new attrs/cattrs version that
writes other source is compiled afresh and never served an old code object; any other call goes straight to
the built-in. The table is one disk-cache entry (kind ``code``, docs/reliability.md "Caches") keyed by the
Python version, the ``-O`` level and the two libraries' versions, read at the first compile and written back at
exit only when something was compiled. attrs's ``__hash__`` holds a number that differs in every process
(:data:`_SALT`): its digits are zeros in the key and the kept code gets this process's number back. The wrapper lives in this module, which like attrs's and cattrs's
modules compiles under ``from __future__ import annotations``, so the flags the generated code inherits are
theirs (``tests/test_code_cache.py`` compares every kept code object with what the libraries compile without
the cache).

An entry holds code, so it is read under the disk cache's trust rules (a folder and a file of this user that
no one else can write), the protection Python's own ``__pycache__`` relies on. ``FITPLAN_NO_CACHE=1`` at start
leaves the libraries untouched.
"""

from __future__ import annotations

import builtins
import marshal
import re
import sys
from typing import Any

from fitplan import diskcache

KIND = "code"
LIBRARIES = ("attr._make", "cattrs.gen")
"""The modules whose generated code is kept (the name ``compile`` is looked up in their globals)."""
MAX_ENTRIES = 1000
"""Beyond this many kept code objects, a write keeps only those this process used (old sources drop out)."""

_table: dict[bytes, tuple[bytes, int | None]] | None = None
"""Digest of (library, file name, source) -> (the marshalled code object, its ``__hash__`` constant)."""
_used: set[bytes] = set()
_counts = {"hits": 0, "misses": 0}
_saving = False


def install() -> None:
    """Give attrs and cattrs the caching ``compile`` (once; nothing when the cache is off)."""
    if diskcache.directory(KIND) is None:
        return
    import importlib

    for name in LIBRARIES:
        module = importlib.import_module(name)
        if "compile" not in vars(module):
            module.compile = _compiler(name)  # type: ignore[attr-defined]


def uninstall() -> None:
    """Give the libraries back the built-in ``compile`` (tests)."""
    for name in LIBRARIES:
        module = sys.modules.get(name)
        if module is not None and getattr(vars(module).get("compile"), "_fitplan_code_cache", False):
            del module.compile  # type: ignore[attr-defined]


def stats() -> dict[str, int]:
    """Compiles answered from the table (``hits``) and compiled afresh (``misses``) in this process."""
    return dict(_counts)


def _compiler(library: str):
    def compile(source, filename, mode, *args, **kwargs):  # noqa: A001 - it stands in for the built-in
        if args or kwargs or mode != "exec" or "fitplan" not in filename or not isinstance(source, str):
            return builtins.compile(source, filename, mode, *args, **kwargs)
        return _cached(library, source, filename)

    compile._fitplan_code_cache = True  # type: ignore[attr-defined]
    return compile


_SALT = re.compile(r"hash\(\(\n +(-?\d+),\n")
"""attrs's ``__hash__`` starts its tuple with ``hash()`` of a string naming the class (``attr/_make.py``
``_make_hash_script``): a number that changes with every process's string-hash seed. The key holds the source
with that number's digits as zeros (its length kept: the code's column positions depend on it); a kept code
object gets this process's number back (:func:`_resalt`)."""


def _digest(library: str, filename: str, source: str) -> bytes:
    """A 32-byte BLAKE2b digest of the three (a collision is as unlikely as one of SHA-256; Python's own
    hash-based ``.pyc`` files trust a 64-bit SipHash of the source)."""
    try:
        from _blake2 import blake2b  # CPython's own module: hashlib would first import OpenSSL (~10 ms)
    except ImportError:  # pragma: no cover - another interpreter
        from hashlib import blake2b
    return blake2b("\0".join((library, filename, source)).encode("utf-8", "surrogatepass"), digest_size=32).digest()


def _cached(library: str, source: str, filename: str) -> Any:
    found = _SALT.search(source)
    salt = int(found.group(1)) if found else None
    key = _digest(library, filename, source if found is None
                  else source[:found.start(1)] + "0" * (found.end(1) - found.start(1)) + source[found.end(1):])
    table = _load()
    kept = table.get(key)
    if kept is None:
        code = builtins.compile(source, filename, "exec")
        table[key] = (marshal.dumps(code), salt)
        _counts["misses"] += 1
        _save_at_exit()
    else:
        blob, kept_salt = kept
        code = marshal.loads(blob)
        if kept_salt != salt:
            code = _resalt(code, kept_salt, salt)
        _counts["hits"] += 1
    _used.add(key)
    return code


def _resalt(code: Any, old: int, new: int | None) -> Any:
    """``code`` with the constant ``old`` of every ``__hash__`` in it replaced by ``new``."""
    consts = tuple(_resalt(c, old, new) if isinstance(c, type(code))
                   else new if code.co_name == "__hash__" and type(c) is int and c == old else c
                   for c in code.co_consts)
    return code.replace(co_consts=consts) if consts != code.co_consts else code


def _entry_key() -> tuple[Any, ...]:
    """The Python version, the ``-O`` level, and each library module's file with its size and modification
    time: an upgraded attrs or cattrs starts a new table (correctness does not depend on it: every entry is
    keyed by its whole source)."""
    import os

    files = []
    for name in LIBRARIES:
        path = getattr(sys.modules.get(name), "__file__", None) or "?"
        try:
            st = os.stat(path)
            files.append((path, st.st_size, st.st_mtime_ns))
        except OSError:
            files.append((path, -1, -1))
    return (1, sys.version, sys.flags.optimize, *files)


def _entry_name(key: tuple[Any, ...]) -> str:
    return diskcache.entry_name("generated-code", repr(key).encode())


def _load() -> dict[bytes, tuple[bytes, int | None]]:
    global _table
    if _table is None:
        _table = {}
        key = _entry_key()
        blob = diskcache.load(KIND, _entry_name(key), key)
        if isinstance(blob, bytes):
            try:
                found = marshal.loads(blob)
            except (EOFError, ValueError, TypeError):
                found = None
            if isinstance(found, dict):
                _table = found
    return _table


def _save_at_exit() -> None:
    global _saving
    if not _saving:
        import atexit

        _saving = True
        atexit.register(save)


def save() -> None:
    """Write the table back (at exit, after a compile missed it); never fails."""
    table = _load()
    if len(table) > MAX_ENTRIES:
        table = {k: v for k, v in table.items() if k in _used}
    key = _entry_key()
    diskcache.store(KIND, _entry_name(key), key, marshal.dumps(table))
