"""What the profiler is shown of the candidate's code: its extension functions, found among the live modules,
and the ranges opened around their calls and around torch.compile's code while `launches` profiles.

Why ranges: some builds' Python tracer records no C call at all (torch 2.11+cu130 on the H200 host), so an
extension called from Python showed as library time; and the harness points Triton's cache into the
candidate's build folder, so the launchers of the kernels torch.compile writes are native modules from
outside the installed packages, which counted as the candidate's own.

Why a secret in the range's name (`session_mark`): a range is a name anyone in the process can open, so a
candidate could wrap plain PyTorch in `record_function("kbeval::extension::fused")`; the name `launches`
believes is drawn for each profile, after the candidate's code was imported and warmed up.
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import secrets
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

EXTENSION_MARK = "kbeval::extension::"  # + the session's secret + "::" + a function's name, around each call
_REGISTERED_AT = re.compile(r"registered at (.+?):\d+")
INDUCTOR_MARK = "kbeval::inductor"  # around a compiled graph's call and Inductor's Triton launches: all library
_INDUCTOR_ENTRIES = (("torch._inductor.output_code", "CompiledFxGraph", "__call__"),
                     ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner", "run"))


def identities(extensions: list[tuple[ModuleType, str, Any]]) -> set[tuple[str, str | None]]:
    """(name, hex address of its pybind record or None) of each extension function: what the tracer's
    `<built-in method NAME of ... object at ADDR>` is matched against (`launches.is_custom_event`)."""
    found: set[tuple[str, str | None]] = set()
    for module, name, obj in extensions:
        owner = getattr(obj, "__self__", None)
        address = hex(id(owner)) if owner is not None and owner is not module else None
        found.add((getattr(obj, "__name__", name), address))
    return found


def live_modules() -> list[ModuleType]:
    """Every module object alive: `load_inline` does not register its module in sys.modules. By `type`, not
    `isinstance`, which asks an object its `__class__`: a weak proxy whose referent died (torch.compile leaves
    them) raises, a lazily deprecated module warns, and an object of the candidate's could run code."""
    live = [o for o in gc.get_objects() if issubclass(type(o), ModuleType)]
    return list({id(m): m for m in [*sys.modules.values(), *live]}.values())


def extension_functions(modules: list[ModuleType]) -> list[tuple[ModuleType, str, Any]]:
    """(module, attribute, function) of every native function of a module loaded from outside the installed
    packages (torch.compile's generated code, in inductor's cache `torchinductor_<user>`, is PyTorch's)."""
    installed = {Path(p).resolve() for key in ("purelib", "platlib", "stdlib", "platstdlib")
                 if (p := sysconfig.get_paths().get(key))}
    found = []
    for module in modules:
        file = getattr(module, "__file__", None) or ""
        if not file.endswith((".so", ".pyd")):
            continue
        path = Path(file).resolve()
        if any(path.is_relative_to(root) for root in installed) or "torchinductor" in str(path):
            continue
        found += [(module, name, obj) for name, obj in list(vars(module).items())
                  if type(obj).__name__ == "builtin_function_or_method"]
    return found


def session_mark() -> str:
    """The prefix of this profile's extension ranges: EXTENSION_MARK and a secret (a candidate cannot name it)."""
    return f"{EXTENSION_MARK}{secrets.token_hex(8)}::"


def extension_roots(extensions: list[tuple[ModuleType, str, Any]]) -> tuple[str, ...]:
    """Folders the candidate's extensions were built in: each extension module's folder, and TORCH_EXTENSIONS_DIR
    (where the harness points `load_inline`: the build's own `ext/`)."""
    roots = {str(Path(getattr(module, "__file__", "") or "").resolve().parent) for module, _, _ in extensions}
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        roots.add(str(Path(os.environ["TORCH_EXTENSIONS_DIR"]).resolve()))
    return tuple(sorted(r for r in roots if r not in ("", "/")))


def registered_by(op: str, roots: tuple[str, ...]) -> bool:
    """Whether dispatcher op `op` ("myext::fused") has a kernel registered from a source file under one of `roots`
    (the dispatcher records the file of each `TORCH_LIBRARY_IMPL`/`m.impl`: the binary the kernel was compiled
    into came from there). An op registered from Python (`torch.library`), or a name that is only a range, is not."""
    import torch

    try:
        dump = torch._C._dispatch_dump(op)
    except Exception:
        return False
    for line in dump.splitlines():
        kernel, sep, where = line.partition(": registered at ")
        if not sep or kernel.startswith(("debug", "name", "schema")):
            continue
        found = _REGISTERED_AT.match("registered at " + where)
        path = str(Path(found.group(1)).resolve()) if found else ""
        if path.endswith((".cpp", ".cc", ".cu", ".cxx", ".c")) and any(
                path == r or path.startswith(r.rstrip("/") + "/") for r in roots):
            return True
    return False


def extensions_marked(modules: list[ModuleType], extensions: list[tuple[ModuleType, str, Any]],
                      mark: str = EXTENSION_MARK) -> contextlib.AbstractContextManager[None]:
    """Every attribute of `modules` that is one of the `extensions`' functions (in the extension, and where a
    module bound it, like `relu = ext.relu_loop`) calls it inside a `MARK + NAME` range meanwhile."""
    wrappers = {id(obj): _mark(obj, mark) for _, _, obj in extensions}  # the functions stay alive: ids stay theirs
    return _swapped([(module, name, wrappers[id(obj)]) for module in (modules if wrappers else [])
                     for name, obj in list(vars(module).items()) if id(obj) in wrappers])


def _mark(function: Any, mark: str) -> Any:
    from torch.autograd.profiler import record_function

    label = mark + getattr(function, "__name__", "extension")

    def call(*args: Any, **kwargs: Any) -> Any:
        with record_function(label):
            return function(*args, **kwargs)

    return call


def inductor_marked() -> contextlib.AbstractContextManager[None]:
    """Inductor's entry points, where loaded (a compiled graph's call, Inductor's Triton launches), run inside
    an INDUCTOR_MARK range meanwhile: what they launch is PyTorch's, whatever module its launcher lives in."""
    from torch.autograd.profiler import record_function

    changes = []
    for module_name, class_name, method in _INDUCTOR_ENTRIES:
        cls = getattr(sys.modules.get(module_name), class_name, None)
        original = cls.__dict__.get(method) if isinstance(cls, type) else None
        if original is None:
            continue

        def marked(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with record_function(INDUCTOR_MARK):
                return _original(*args, **kwargs)

        changes.append((cls, method, marked))
    return _swapped(changes)


@contextmanager
def _swapped(changes: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """Each (owner, attribute, replacement) set meanwhile (those that refuse, skipped); the originals put back."""
    done = []
    try:
        for owner, name, replacement in changes:
            with contextlib.suppress(AttributeError, KeyError, TypeError):
                original = vars(owner)[name]
                setattr(owner, name, replacement)
                done.append((owner, name, original))
        yield
    finally:
        for owner, name, original in reversed(done):
            setattr(owner, name, original)
