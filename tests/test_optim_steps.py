"""Every optimizer step seen once, whatever class it is, and nothing of the watch left behind after it.

(That a ``torch.compile`` leaves the watch working on torch 2.1, where it turns torch's own step hooks
off for good in the process, is tested with a real job: tests/compare/test_compare_probe.py,
``test_a_script_that_compiles_is_recorded_step_by_step``. Not here: it would change the test worker.)
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from npu_migrate import optim_steps


def one_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> None:
    optimizer.zero_grad()
    sum(p.sum() for p in params).backward()
    optimizer.step()


def test_every_class_is_seen_once_per_step_and_undo_puts_everything_back() -> None:
    params = [torch.nn.Parameter(torch.ones(3))]
    sgd = torch.optim.SGD(params, lr=0.1)  # made before the watch: torch has wrapped SGD.step already
    before_watch = torch.optim.SGD.step
    seen: list[tuple[str, str, bool]] = []

    def before(opt, args, kwargs):
        seen.append(("before", type(opt).__name__, watch.stepping()))

    def after(opt, args, kwargs):
        seen.append(("after", type(opt).__name__, watch.stepping()))

    watch = optim_steps.watch(before=before, after=after)
    try:
        class Later(torch.optim.SGD):  # defined after the watch, its step calling its base's
            def step(self, closure=None):
                return super().step(closure)

        class Inherits(torch.optim.Adam):  # a step of its base's
            pass

        for optimizer in (sgd, Later(params, lr=0.1), Inherits(params), torch.optim.Adam(params)):
            one_step(optimizer, params)
        assert seen == [(when, name, when == "before") for name in ("SGD", "Later", "Inherits", "Adam")
                        for when in ("before", "after")]
        assert inspect.signature(sgd.step) == inspect.signature(before_watch.__get__(sgd)), "the signature shows through"
        assert not watch.stepping()
    finally:
        watch.undo()
    assert torch.optim.SGD.step is before_watch
    assert "__init_subclass__" not in torch.optim.Optimizer.__dict__
    seen.clear()
    one_step(sgd, params)
    assert seen == []


def test_a_step_that_raises_is_not_counted_and_the_next_one_is() -> None:
    class Flaky(torch.optim.SGD):
        fail = True

        def step(self, closure=None):
            if self.fail:
                raise RuntimeError("no step")
            return super().step(closure)

    params = [torch.nn.Parameter(torch.ones(2))]
    after: list[int] = []
    watch = optim_steps.watch(after=lambda opt, args, kwargs: after.append(1))
    try:
        flaky = Flaky(params, lr=0.1)
        with pytest.raises(RuntimeError, match="no step"):
            one_step(flaky, params)
        assert after == [] and not watch.stepping()
        flaky.fail = False
        one_step(flaky, params)
        assert after == [1]
    finally:
        watch.undo()


def test_the_users_own_step_hooks_still_fire_once_per_step() -> None:
    optimizer_module = importlib.import_module("torch.optim.optimizer")
    params = [torch.nn.Parameter(torch.ones(2))]
    fired: list[str] = []
    handle = optimizer_module.register_optimizer_step_post_hook(lambda opt, args, kwargs: fired.append("global"))
    one_step(torch.optim.RMSprop(params), params)
    if not fired:
        handle.remove()
        pytest.skip("torch's own step hooks are off in this process already (torch 2.1 after a torch.compile)")
    fired.clear()
    watch = optim_steps.watch(after=lambda opt, args, kwargs: fired.append("watch"))
    try:
        for _ in range(2):  # the second instance must not put a second profiling wrapper around ours
            optimizer = torch.optim.RMSprop(params)
            optimizer.register_step_post_hook(lambda opt, args, kwargs: fired.append("own"))
            one_step(optimizer, params)
    finally:
        watch.undo()
        handle.remove()
    assert sorted(fired) == ["global", "global", "own", "own", "watch", "watch"]
