"""Issue 39 items 2 and 3: each worker role answers the ops of its own table and refuses the rest, and every request
and reply is a model of its own, so a field belongs to its op by type.

Most of the workers' code runs only on a GPU (`if self.device == "cuda"` branches, CUDA IPC, the overlapped calls,
the exchange's pool), so the fields are also checked statically, from the sources (`ast`): every `req.<field>` a
handler reads (in the helpers it hands `req` to as well) is a field of its op's request; every message built
anywhere in the package is given only fields of its model (and all it requires); and every field read or set on a
message whose model the code names (a parameter's annotation, a constructor, the reply of a request sent) is one of
that model's fields.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import subprocess
import sys
import textwrap
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import pythonpath, serve_requests
from pydantic import BaseModel, ValidationError

from kernelbench_eval import messages, requests
from kernelbench_eval.messages import ExchangeInfo, Reply
from kernelbench_eval.requests import REQUESTS, ExitRequest, ParkRequest, PutRequest, RunRequest, TimeRequest
from kernelbench_eval.worker.main import ROLES

SOURCES = Path(__file__).resolve().parent.parent / "kernelbench_eval"
MODELS: dict[str, type[BaseModel]] = {
    name: value for module in (messages, requests) for name, value in vars(module).items()
    if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module.__name__}
REPLIES = {model for model in MODELS.values() if issubclass(model, Reply)}
HANDLERS = [(role, op, handler) for role, worker in ROLES.items() for op, handler in worker.OPS.items()]
IDS = [f"{role}:{op}" for role, op, _ in HANDLERS]


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


# -- the tables ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("role", "op", "handler"), HANDLERS, ids=IDS)
def test_every_op_in_a_table_has_a_request_model_that_its_handler_takes_and_answers(role, op, handler):
    assert op in REQUESTS, f"the {role}'s op {op!r} has no request model"
    hints = typing.get_type_hints(handler)
    request_param = list(inspect.signature(handler).parameters)[1]
    assert hints[request_param] is REQUESTS[op], f"{handler.__qualname__} takes {hints[request_param]}"
    assert hints["return"] is REQUESTS[op].reply, f"{handler.__qualname__} answers {hints['return']}"


def test_each_request_is_answered_by_a_role_and_both_share_only_their_common_ops_explicitly():
    answered = {op for worker in ROLES.values() for op in worker.OPS}
    assert set(REQUESTS) - answered == {"exit"}  # (the loop ends on it: no handler, no reply)
    checker, candidate = ROLES["checker"].OPS, ROLES["candidate"].OPS
    assert set(checker) & set(candidate) == {"load", "profile", "time"}
    assert all(checker[op] is candidate[op] for op in ("load", "profile", "time"))
    assert {"run", "attach", "take", "export", "import", "warmup"}.isdisjoint(checker)  # candidate code's
    assert {"prepare", "expect", "put", "compare", "compare_timed", "open_exchange"}.isdisjoint(candidate)


def _self_stores(fn: Callable[..., Any]) -> set[str]:
    return {node.attr for node in ast.walk(_tree(fn)) if isinstance(node, ast.Attribute) and
            isinstance(node.value, ast.Name) and node.value.id == "self" and isinstance(node.ctx, ast.Store)}


@pytest.mark.parametrize("role", sorted(ROLES))
def test_a_workers_state_is_declared_once_in_an_init_and_never_read_with_a_default(role):
    """Each attribute is set first in the `__init__` of the class that owns it, once; no op finds one missing."""
    own = [c for c in ROLES[role].__mro__ if c.__module__.startswith("kernelbench_eval")]
    inits = {c.__name__: _self_stores(vars(c)["__init__"]) for c in own if "__init__" in vars(c)}
    declared = [name for names in inits.values() for name in names]
    assert sorted(declared) == sorted(set(declared)), f"declared twice: {inits}"
    for c in own:
        for name, fn in vars(c).items():
            if inspect.isfunction(fn) and name != "__init__":
                assert _self_stores(fn) <= set(declared), f"{c.__name__}.{name} sets state no __init__ declares"
                source = inspect.getsource(fn)
                assert "getattr(self" not in source and "hasattr(self" not in source, f"{c.__name__}.{name}"


class _Line:
    """A request line as a worker might be sent one that is no request of any op."""

    def __init__(self, text: str) -> None:
        self.text = text

    def model_dump_json(self) -> str:
        return self.text


def test_an_op_outside_a_roles_table_or_no_op_at_all_is_refused_by_name_and_the_loop_goes_on(monkeypatch):
    lines = [RunRequest(name="trial0"), _Line('{"op": "fly"}'), _Line("not json"), ParkRequest(), ExitRequest()]
    refused_run, unknown, garbled, parked = (Reply.model_validate_json(r) for r in
                                             serve_requests(monkeypatch, lines, role="checker"))
    assert not refused_run.ok and refused_run.error_kind == "runtime_error"
    assert "checker" in (refused_run.error or "") and "'run'" in (refused_run.error or "")
    assert not unknown.ok and "checker" in (unknown.error or "") and "fly" in (unknown.error or "")
    assert not garbled.ok and "cannot read the request" in (garbled.error or "")
    assert parked.ok  # its own op, after three refusals
    refused = Reply.model_validate_json(serve_requests(monkeypatch, [PutRequest(name="trial0")], role="candidate")[0])
    assert not refused.ok and "candidate" in (refused.error or "") and "'put'" in (refused.error or "")


def test_a_worker_without_a_role_does_not_start(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != messages.ROLE_VAR} | {"PYTHONPATH": pythonpath()}
    done = subprocess.run([sys.executable, "-m", "kernelbench_eval.worker.main", "--reply-fd", "1"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, input="")
    assert done.returncode != 0 and messages.ROLE_VAR in done.stderr


# -- the models on the wire ---------------------------------------------------------------------------------------


def _example(model: type[BaseModel]) -> BaseModel:
    """`model` with its required fields filled in."""
    values = {str: "x", int: 1, ExchangeInfo: ExchangeInfo(kind="shm", handle="h", size=1)}
    hints = typing.get_type_hints(model)
    return model(**{name: values[hints[name]] for name, field in model.model_fields.items() if field.is_required()})


@pytest.mark.parametrize("op", sorted(REQUESTS))
def test_a_request_travels_with_its_op_even_without_defaults_and_comes_back_as_its_own_model(op):
    req = _example(REQUESTS[op])
    line = req.model_dump_json(exclude_defaults=True)  # as the harness sends it (`process._encode`)
    assert f'"op":"{op}"' in line
    back = requests.parse_request(line)
    assert type(back) is REQUESTS[op] and back == req


def test_a_field_belongs_to_its_op():
    with pytest.raises(ValidationError, match="extra"):
        TimeRequest(name="trial0")  # type: ignore[call-arg] (a set's name is put's, take's, run's, profile's)
    with pytest.raises(ValidationError, match="extra"):
        PutRequest.reply.model_validate_json('{"ok": true, "exchange": null}')  # open_exchange's, not put's


def test_an_error_reply_is_read_as_any_ops_reply():
    """The harness reads a reply as its request's model, and a failed op's reply has only what every reply has."""
    line = Reply(ok=False, error_kind="load_error", error="no class ModelNew", seconds=0.5).model_dump_json()
    for model in REPLIES:
        assert [name for name, field in model.model_fields.items() if field.is_required()] == ["ok"], model
        reply = model.model_validate_json(line)
        assert not reply.ok and reply.error == "no class ModelNew"


# -- the handlers' requests, read from the sources ------------------------------------------------------------------


def _tree(fn: Callable[..., Any]) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _callee(call: ast.Call, fn: Callable[..., Any], tree: ast.FunctionDef, worker: type) -> tuple[Any, bool]:
    """The function `call` calls (resolved on the role's class, `fn`'s module, or `fn`'s own imports), and whether
    it is a method (its first parameter then is `self`); (None, False) when it cannot be told."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        return getattr(worker, func.attr, None), True
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and getattr(func.value.func, "id", "") \
            == "super":
        owner = next(c for c in worker.__mro__ if vars(c).get(fn.__name__) is fn)
        after = worker.__mro__[worker.__mro__.index(owner) + 1:]
        return next((vars(c)[func.attr] for c in after if func.attr in vars(c)), None), True
    if isinstance(func, ast.Name):
        if func.id in fn.__globals__:
            return fn.__globals__[func.id], False
        for node in ast.walk(tree):  # a function-local import (`from kernelbench_eval.worker.warmup import ...`)
            if isinstance(node, ast.ImportFrom) and any((a.asname or a.name) == func.id for a in node.names):
                return getattr(importlib.import_module(node.module or ""), func.id, None), False
    return None, False


def request_reads(fn: Callable[..., Any], param: str, worker: type, seen: set[Any] | None = None
                  ) -> Iterator[tuple[str, str]]:
    """(field, where) for every `param.<field>` that `fn` reads, through every helper it hands `param` to; a
    use of `param` that cannot be followed yields ("<escapes>", where)."""
    seen = set() if seen is None else seen
    if (fn, param) in seen:
        return
    seen.add((fn, param))
    tree = _tree(fn)
    parents = _parents(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == param) or parents.get(node) is None:
            continue
        parent, where = parents[node], f"{fn.__qualname__}:{node.lineno}"
        if isinstance(parent, ast.Attribute):
            yield parent.attr, where
        elif isinstance(parent, ast.Call) and node in parent.args:
            callee, method = _callee(parent, fn, tree, worker)
            if callee is None or not callable(callee):
                yield "<escapes>", where
                continue
            names = list(inspect.signature(callee).parameters)[1 if method else 0:]
            yield from request_reads(callee, names[parent.args.index(node)], worker, seen)
        elif not isinstance(parent, (ast.arguments, ast.arg)):
            yield "<escapes>", where


@pytest.mark.parametrize(("role", "op", "handler"), HANDLERS, ids=IDS)
def test_each_handler_reads_only_fields_of_its_ops_request(role, op, handler):
    param = list(inspect.signature(handler).parameters)[1]
    reads = set(request_reads(handler, param, ROLES[role]))
    fields = _fields(REQUESTS[op])
    wrong = sorted((field, where) for field, where in reads if field not in fields)
    assert not wrong, f"the {role}'s {op!r} reads what {REQUESTS[op].__name__} lacks: {wrong}"
    assert reads or not _fields(REQUESTS[op]) - {"op"}, "nothing read: the reader is broken"


@pytest.mark.parametrize(("role", "op", "handler"), HANDLERS, ids=IDS)
def test_each_handler_builds_only_its_ops_reply(role, op, handler):
    """(What each reply is built with is checked below, with every other message of the package.)"""
    names = {name: MODELS[name] for name in MODELS if issubclass(MODELS[name], Reply)}
    built = {_constructed(node, names) for node in ast.walk(_tree(handler))} - {None}
    assert built <= {REQUESTS[op].reply}, f"the {role}'s {op!r} builds {built}, not {REQUESTS[op].reply}"


def test_the_reader_follows_helpers_and_flags_what_it_cannot_follow():
    worker = ROLES["checker"]
    reads = {field for field, _ in request_reads(worker.OPS["load"], "req", worker)}
    assert {"init_seed", "precision", "class_name", "path"} <= reads  # `_build` (in a lambda), `missing_class`
    reads = {field for field, _ in request_reads(ROLES["candidate"].OPS["warmup"], "req", ROLES["candidate"])}
    assert {"device", "init_seed"} <= reads  # `warm_up`, imported inside the handler
    reads = {field for field, _ in request_reads(ROLES["candidate"].OPS["time"], "req", ROLES["candidate"])}
    assert {"layout", "cover_s", "overlap", "placement"} <= reads  # CUDA's, and the candidate's hooks'

    def leaks(self, req):  # noqa: ANN001, ANN202
        print(req)

    assert {field for field, _ in request_reads(leaks, "req", worker)} == {"<escapes>"}


# -- every message the package builds or reads, from the sources -----------------------------------------------------


def _model_names(tree: ast.Module, module: str) -> dict[str, type[BaseModel]]:
    """The message models a module names: imported from `messages`/`requests`, or its own (those two)."""
    homes = ("kernelbench_eval.messages", "kernelbench_eval.requests")
    names = dict(MODELS) if module in homes else {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in homes:
            names |= {alias.asname or alias.name: MODELS[alias.name] for alias in node.names if alias.name in MODELS}
    return names


def _annotated(annotation: ast.expr | None, names: dict[str, type[BaseModel]]) -> tuple[type[BaseModel] | None, bool]:
    """(model, is a list of it) an annotation names: `X`, `X | None`, `list[X]`."""
    if isinstance(annotation, ast.BinOp):
        return _annotated(annotation.left, names)
    if isinstance(annotation, ast.Subscript) and getattr(annotation.value, "id", "") == "list":
        return _annotated(annotation.slice, names)[0], True
    if isinstance(annotation, ast.Name) and annotation.id in names:
        return names[annotation.id], False
    return None, False


def _constructed(node: ast.expr, names: dict[str, type[BaseModel]]) -> type[BaseModel] | None:
    """The model `node` constructs: `X(...)` or `X.model_construct(...)`."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if isinstance(func, ast.Name) and func.id in names:
        return names[func.id]
    if isinstance(func, ast.Attribute) and func.attr == "model_construct" and isinstance(func.value, ast.Name) \
            and func.value.id in names:
        return names[func.value.id]
    return None


def _built(node: ast.expr, names: dict[str, type[BaseModel]], env: dict[str, set[Any]]) -> type[BaseModel] | None:
    """The model `node` makes: one it constructs, or the reply of a request it sends (`worker.call(XRequest(...))`,
    `checker.ask(req, ...)` with `req` an XRequest)."""
    if (model := _constructed(node, names)) is not None or not isinstance(node, ast.Call):
        return model
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in ("call", "ask", "request") and node.args:
        sent = _built(node.args[0], names, env)
        if sent is None and isinstance(node.args[0], ast.Name) and len(env.get(node.args[0].id, ())) == 1:
            sent = next(iter(env[node.args[0].id]))
        if isinstance(sent, type) and issubclass(sent, requests.Request):
            return sent.reply
    return None


def _uses(tree: ast.Module, module: str) -> Iterator[str]:
    """What is wrong with each message built, read or written in one module (nothing: nothing is)."""
    names = _model_names(tree, module)
    if not names:
        return
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        env: dict[str, set[Any]] = {}  # name -> the models it holds (a list of one: ("list", model))
        for arg in fn.args.args + fn.args.kwonlyargs:
            model, many = _annotated(arg.annotation, names)
            if model is not None:
                env.setdefault(arg.arg, set()).add(("list", model) if many else model)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if (model := _built(node.value, names, env)) is not None:
                    env.setdefault(node.targets[0].id, set()).add(model)
            elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name) and \
                    isinstance(node.iter, ast.Name):
                env.setdefault(node.target.id, set()).update(
                    m[1] for m in env.get(node.iter.id, ()) if isinstance(m, tuple))
        for node in ast.walk(fn):
            where = f"{module}:{getattr(node, 'lineno', '?')}"
            if (model := _constructed(node, names)) is not None:
                assert isinstance(node, ast.Call)
                given = {k.arg for k in node.keywords}
                yield from (f"{where}: {model.__name__} has no field {k!r}"
                            for k in sorted(k for k in given if k is not None and k not in _fields(model)))
                if None not in given and not node.args:  # (no `**values`: every field is named here)
                    missing = {f for f, info in model.model_fields.items() if info.is_required()} - given
                    yield from (f"{where}: {model.__name__} needs {f!r}" for f in sorted(missing))
            if isinstance(node, ast.Attribute):
                held = _built(node.value, names, env)
                models = {held} if held is not None else {
                    m for m in env.get(getattr(node.value, "id", ""), ()) if not isinstance(m, tuple)}
                for model in models:
                    if node.attr not in _fields(model) and not hasattr(model, node.attr):
                        yield f"{where}: {model.__name__} has no field {node.attr!r}"


MODULES = sorted(SOURCES.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SOURCES)) for p in MODULES])
def test_every_message_is_built_read_and_written_with_its_own_models_fields(path: Path):
    module = ".".join(path.relative_to(SOURCES.parent).with_suffix("").parts).removesuffix(".__init__")
    wrong = list(_uses(ast.parse(path.read_text()), module))
    assert not wrong, "\n".join(wrong)


def test_the_message_reader_catches_a_misplaced_field():
    source = textwrap.dedent('''
        from kernelbench_eval.messages import LoadReply
        from kernelbench_eval.requests import PutRequest, TimeRequest

        def op(worker, req: TimeRequest) -> LoadReply:
            reply = LoadReply(ok=True, slots=[])
            reply.kernels = None
            sent = worker.call(PutRequest(name="x"))
            return sent.exchange, req.name, worker.call(TimeRequest()).check, PutRequest()
        ''')
    wrong = "\n".join(_uses(ast.parse(source), "example"))
    for expected in ("LoadReply has no field 'slots'", "LoadReply has no field 'kernels'",
                     "PutReply has no field 'exchange'", "TimeRequest has no field 'name'",
                     "TimeReply has no field 'check'", "PutRequest needs 'name'"):
        assert expected in wrong, wrong
