"""Timed inputs no function of earlier inputs predicts (issue 36, item 2): `refill.Rotation` on known draws, and
the memoising attacks of fixtures/attacks_36 against it and against the fill it replaced (base sets times positive
factors, integers copied), which they beat."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import torch
from conftest import FIXTURES

from kernelbench_eval.worker.refill import JITTER, Rotation, learn

HERE = FIXTURES / "attacks_36"


def _draws(make, count: int = 3, seed: int = 0) -> list[list[object]]:
    torch.manual_seed(seed)
    return [make() for _ in range(count)]


def test_domains_are_learned_from_the_draws() -> None:
    bases = _draws(lambda: [torch.randn(8, 64), torch.rand(64), torch.randint(0, 10, (256,)), torch.rand(64) > 0.25,
                            torch.randint(0, 2, (64,)).float() * 2 - 1, torch.randperm(32),
                            torch.randint(0, 50, (4, 16)).sort(dim=-1).values, torch.arange(5), 7])
    kinds = [d.kind for d in Rotation(bases).domains]
    assert kinds == ["float", "float", "ints", "bools", "levels", "permutation", "sorted", "constant", "other"]
    domains = Rotation(bases).domains
    assert domains[0].finite and not learn([torch.tensor([1.0, float('inf')])]).finite
    assert (domains[2].lo, domains[2].hi) == (0, 9)
    assert 0.6 < domains[3].share < 0.9
    assert domains[4].levels is not None and domains[4].levels.tolist() == [-1.0, 1.0]
    assert learn([torch.full((4,), 3)]).kind == "constant"  # one draw, one value
    assert learn([torch.tensor([0, 2**63 - 1])]).kind == "other"  # no exclusive upper end to draw below


def test_float_inputs_change_order_signs_and_argmax_from_call_to_call() -> None:
    bases = _draws(lambda: [torch.randn(64, 512), torch.rand(64, 512), torch.randn(64, 64).tril()])
    rotation = Rotation(bases)
    calls = [[x.clone() for x in rotation.fill(k % 3, 1.0, seed)] for k, seed in enumerate(range(100, 112))]
    signed = [c[0] for c in calls]
    for a, b in zip(signed, signed[3:], strict=False):  # the same base set three calls later
        assert (a.argmax(dim=1) != b.argmax(dim=1)).float().mean() > 0.5
        assert ((a > 0) != (b > 0)).float().mean() > 0.2
    assert all(0.9 < float(x.std()) / float(bases[0][0].std()) < 1.1 for x in signed)  # the draws' spread
    every = torch.stack([b[0] for b in bases])
    for c in calls:  # each element is one the problem drew at its place; a nonnegative input stays so; zeros stay
        assert bool(((c[0] == every).any(dim=0)).all())
        assert float(c[1].min()) >= 0 and float(c[1].max()) < 1.0
        assert torch.equal(c[2], c[2].tril())


def test_other_inputs_are_drawn_afresh_within_what_the_draws_held() -> None:
    bases = _draws(lambda: [torch.randint(3, 40, (4096,)), torch.rand(4096) > 0.7, torch.randperm(64),
                            torch.randint(0, 1000, (8, 32)).sort(dim=-1).values, torch.randint(0, 3, (64,)).float(),
                            torch.tensor([2, 5, 7])])
    rotation = Rotation(bases)
    first = [x.clone() for x in rotation.fill(0, 1.0, 1)]
    second = [x.clone() for x in rotation.fill(0, 1.0, 2)]
    for ints in (first[0], second[0]):
        assert int(ints.min()) == 3 and int(ints.max()) == 39
    assert not torch.equal(first[0], second[0]) and not torch.equal(first[0], bases[0][0])
    assert 0.25 < float(first[1].float().mean()) < 0.35 and not torch.equal(first[1], second[1])
    assert torch.equal(first[2].sort().values, torch.arange(64)) and not torch.equal(first[2], second[2])
    assert bool((first[3].diff(dim=-1) >= 0).all()) and not torch.equal(first[3], second[3])
    assert set(first[4].tolist()) <= {0.0, 1.0, 2.0} and not torch.equal(first[4], second[4])
    assert torch.equal(first[5], torch.tensor([2, 5, 7]))  # never changed by the draws: copied
    uneven = Rotation([[torch.tensor([0.0, 1.0, 5.0] * 50)]]).fill(0, 1.0, 3)[0]  # levels not evenly spaced
    assert set(uneven.tolist()) == {0.0, 1.0, 5.0}


def test_a_call_is_reproducible_and_one_base_set_keeps_only_the_factors() -> None:
    bases = _draws(lambda: [torch.randn(256), torch.randint(0, 9, (64,))])
    one, again = Rotation(bases).fill(1, 0.8, 42), Rotation(bases).fill(1, 0.8, 42)
    assert all(torch.equal(a, b) for a, b in zip(one, again, strict=True))  # the checker computes the same call
    single = Rotation(bases[:1])
    ratio = single.fill(0, 0.8, 7)[0] / bases[0][0]
    assert float(ratio.min()) >= 0.8 * (1 - JITTER) - 1e-6 and float(ratio.max()) <= 0.8 * (1 + JITTER) + 1e-6


def _load(path: Path, name: str) -> type:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _old_fill(bases: list[list[torch.Tensor]], k: int, seed: int) -> list[torch.Tensor]:
    """The fill this replaced: base set k times positive factors (scale x U(0.95, 1.05)); integers copied."""
    scale = random.Random(seed).uniform(0.75, 1.25)
    out = []
    for base in bases[k]:
        if base.is_floating_point():
            generator = torch.Generator().manual_seed(seed)
            factor = torch.empty_like(base).uniform_(scale * 0.95, scale * 1.05, generator=generator)
            out.append(base * factor)
        else:
            out.append(base.clone())
    return out


def _wrong_answers(problem: str, attack: str, fill) -> int:
    """How many of 60 timed calls the attack answers wrongly, after eight trial runs on fresh draws and a warm-up."""
    model = _load(HERE / "problems" / f"{problem}.py", "Model")()
    get_inputs = _load(HERE / "problems" / f"{problem}.py", "get_inputs")
    candidate = _load(HERE / "candidates" / problem / f"{attack}.py", "ModelNew")()
    torch.manual_seed(3)
    bases = [get_inputs() for _ in range(3)]
    for _ in range(4):  # the trials: fresh draws, each run twice
        inputs = get_inputs()
        candidate(*inputs)
        candidate(*inputs)
    wrong = 0
    for call in range(64):  # a warm-up of four calls, then timed calls, base sets in turn
        inputs = fill(bases, call % 3, 1000 + call)
        if call >= 4 and not torch.equal(candidate(*inputs), model(*inputs)):
            wrong += 1
        elif call < 4:
            candidate(*inputs)
    return wrong


def test_memoising_attacks_beat_the_old_fill_and_not_this_one() -> None:
    rotation_of: dict[int, Rotation] = {}

    def new_fill(bases, k, seed):
        rotation = rotation_of.setdefault(id(bases), Rotation(bases))
        return [x.clone() for x in rotation.fill(k, random.Random(seed).uniform(0.75, 1.25), seed)]

    for problem, attack in (("row_signs", "memo_signs"), ("label_count", "memo_labels")):
        assert _wrong_answers(problem, attack, _old_fill) == 0, problem  # every timed call answered from memory
        assert _wrong_answers(problem, attack, new_fill) >= 55, problem
