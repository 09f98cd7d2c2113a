"""A speed default that fails must not fail the run: torch.compile falls back to eager,
and a micro-batch that runs out of memory at the first step is split further.

Both are CUDA paths we switch on by default (``kubetune.trainer.performance.speed``), and
both fail only where they run, never at planning time:

- compile: torchtune's ``compile_model`` / ``compile_loss`` raise at setup for a backend
  torch does not know, and torch.compile compiles lazily, so a broken toolchain (no
  Triton, no C compiler, an inductor bug on this graph) raises at the first forward or
  backward. Either way one line is logged and the run goes on eager
  (``torch.compiler.set_stance("force_eager")`` turns every compiled function and layer
  back into its plain code). A user's explicit ``compile=True`` falls back too: a run that
  trains eager is worth more than one that stops; the line then says how to skip the attempt.
- out of memory at the first step: the micro-batch goes down to its largest proper
  divisor (half, for an even one) and gradient accumulation up by the same factor, so the
  effective batch and what each optimizer step trains on stay the same; repeated down to
  1, where the run stops with one line naming the numbers (``NoFallbackError``, which the
  launcher reports as bad input, exit 65). This holds for a batch the user set too: only
  the split changes, not the training.

A failed step is retried only before this process's first optimizer step: the model,
optimizer, LR schedule and step count are still as set up (or as a resume loaded them),
and the failed attempt leaves only gradients, which are dropped. The recipe's own
``train`` is called again; it re-enters the epoch it was in and the step guard starts it
at the same step boundary (as for a resume), so no step is lost or applied twice. Over
the smaller loader the same sampler yields the same order, and the guard skips in samples.

Not retried in place, and why (the run stops with one line saying what to set):
- a distributed run: a rank that fails mid-step leaves the others inside a collective,
  and FSDP's state after an exception mid-forward is not known to be reusable. There,
  a compile probe at setup (a tiny function through the same backend, forward and
  backward, on every rank, the result agreed by all) catches a broken toolchain on
  all ranks together, before the first step, and turns compile off everywhere.
- ``optimizer_in_bwd``: parameters are updated during the backward, so a failure there
  may already have changed some (and gradient accumulation is not allowed with it).
- after the first optimizer step (a later OOM gets the launcher's out-of-memory line).
"""

from __future__ import annotations

import functools
import gc
import logging
import os
from typing import Any

from kubetune import env
from kubetune.trainer.request import passed_env
from kubetune.trainer.recipe_process.step_guard import Guard, StopRequested

log = logging.getLogger("trainer")



class NoFallbackError(RuntimeError):
    """A speed default failed where no fallback is safe; the message is the user's line
    (carried to the launcher by type, in the failure record: ``failure_report``)."""


def describe(exc: BaseException) -> str:
    """``<ExcType>: <first line>`` of what really failed (dynamo wraps a backend's error)."""
    inner = getattr(exc, "inner_exception", None)
    if isinstance(inner, BaseException):
        exc = inner
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:200] if lines else '(no message)'}"


class Fallbacks:
    """What has fallen back in this recipe process (one per process)."""

    def __init__(self, compile_on: bool, compile_ours: bool, rank: int = 0) -> None:
        self.compile_on = compile_on
        self.compile_ours = compile_ours
        self.rank = rank

    def disable_compile(self, cause: str) -> None:
        import torch

        if not self.compile_on:
            return
        self.compile_on = False
        torch.compiler.set_stance("force_eager")
        if self.rank == 0:
            choice = "" if self.compile_ours else \
                " (compile=True was set; compile=False skips the attempt)"
            log.warning("compile failed (%s); continuing without torch.compile%s", cause, choice)


def install(cls: type, guard: Guard, compile_on: bool, compile_ours: bool) -> Fallbacks:
    """Wrap torchtune's compile helpers and the recipe's setup and train (after
    ``recipe_hooks.install``, so the step guard's loader is in place when ours runs)."""
    state = Fallbacks(compile_on, compile_ours, guard.rank)
    _register_failing_backend_for_tests()
    _wrap_compile_helpers(state)
    original_setup, original_train = cls.setup, cls.train

    @functools.wraps(original_setup)
    def setup(self, *args, **kwargs):
        result = original_setup(self, *args, **kwargs)
        _inject_oom_for_tests(self)
        if state.compile_on and _distributed():
            _probe_compile(self, state)
        return result

    @functools.wraps(original_train)
    def train(self, *args, **kwargs):
        first_step = self.global_step
        while True:
            try:
                return original_train(self, *args, **kwargs)
            except StopRequested:
                raise
            except Exception as exc:
                if self.global_step != first_step:
                    raise  # an optimizer step happened: retrying would repeat or lose one
                _before_retry(self, guard, state, exc)

    cls.setup, cls.train = setup, train
    return state


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _wrap_compile_helpers(state: Fallbacks) -> None:
    """At setup: a compile helper that raises leaves the model and loss uncompiled."""
    from torchtune import training

    original_model, original_loss = training.compile_model, training.compile_loss

    @functools.wraps(original_model)
    def compile_model(model, *args, **kwargs):
        try:
            return original_model(model, *args, **kwargs)
        except Exception as exc:
            for module in model.modules():  # layers compiled before the one that raised
                if getattr(module, "_compiled_call_impl", None) is not None:
                    module._compiled_call_impl = None
            state.disable_compile(describe(exc))
            return None

    @functools.wraps(original_loss)
    def compile_loss(loss, *args, **kwargs):
        try:
            return original_loss(loss, *args, **kwargs)
        except Exception as exc:
            state.disable_compile(describe(exc))
            return loss

    training.compile_model, training.compile_loss = compile_model, compile_loss


def _probe_compile(recipe: Any, state: Fallbacks) -> None:
    """Distributed runs only: compile a tiny function, forward and backward, on every
    rank through the recipe's backend; if any rank fails, all run eager."""
    import torch
    import torch.distributed as dist

    device = getattr(recipe, "_device", torch.device("cpu"))
    backend = passed_env.compile_backend()
    cause = None
    try:
        probe = torch.compile(lambda x: torch.nn.functional.silu(x) * 2.0, backend=backend)
        x = torch.randn(4, 16, device=device, requires_grad=True)
        probe(x).sum().backward()
    except Exception as exc:
        cause = describe(exc)
    failed = torch.tensor([int(cause is not None)], dtype=torch.int64, device=device)
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if int(failed.item()):
        state.disable_compile(cause or "another rank's compile probe failed")


def _before_retry(recipe: Any, guard: Guard, state: Fallbacks, exc: Exception) -> None:
    """Fix what failed at the first step, or raise (the original error or ours)."""
    import torch

    oom = isinstance(exc, torch.OutOfMemoryError)
    if not oom and not (state.compile_on and raised_under_compile(exc)):
        raise exc
    loader = recipe._dataloader
    inner = getattr(loader, "_loader", None)  # the step guard's proxy holds the real one
    batch = int(getattr(inner, "batch_size", 0) or 0)
    accum = max(1, int(getattr(recipe, "_gradient_accumulation_steps", 1)))
    where = _no_retry_reason(recipe)
    if where is not None:
        if oom:
            if batch > 1 and where == "in a distributed run":
                smaller = largest_proper_divisor(batch)
                raise NoFallbackError(
                    f"out of memory at the first step with micro-batch {batch} x {accum} "
                    f"accumulation step(s) {where}, which cannot retry in place: set "
                    f"batch_size={smaller} gradient_accumulation_steps="
                    f"{accum * batch // smaller} (the same effective batch)") from exc
            raise exc  # the launcher's out-of-memory line says what to lower
        raise NoFallbackError(f"torch.compile failed at the first step ({describe(exc)}) "
                              f"{where}, which cannot fall back in place: set compile=False"
                              ) from exc
    if oom:
        if batch <= 1 or inner is None:
            raise NoFallbackError(
                f"does not fit in memory even at batch_size=1 (gradient_accumulation_steps="
                f"{accum * max(batch, 1)}, sequences of up to {_max_seq_len(recipe)} tokens): "
                "use a shorter tokenizer.max_seq_len, enable_activation_checkpointing=True, "
                "method qlora, or more GPUs") from exc
        smaller = largest_proper_divisor(batch)
        factor = batch // smaller
        recipe._gradient_accumulation_steps = accum * factor
        loader._loader = with_batch_size(inner, smaller)
        log.warning("out of memory at the first step with micro-batch %d x %d accumulation "
                    "step(s); retrying with %d x %d, effective batch %d kept (set batch_size=%d "
                    "gradient_accumulation_steps=%d to start there)", batch, accum, smaller,
                    accum * factor, batch * accum, smaller, accum * factor)
    else:
        state.disable_compile(describe(exc))
    # The failed attempt's gradients (a partial accumulation) must not reach the retry.
    for param in recipe._model.parameters():
        param.grad = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    # The retried epoch starts where this one did (0, or where a resume started it).
    guard.resume_offset = guard.steps_in_epoch


# Where torch.compile's machinery runs: an error raised with none of these on its stack
# (a dataset's, a collate's) is not compile's, and eager would fail the same way.
_COMPILE_PACKAGES = tuple(f"{os.sep}torch{os.sep}{name}{os.sep}"
                          for name in ("_dynamo", "_inductor", "_functorch"))


def raised_under_compile(exc: BaseException) -> bool:
    """Whether torch.compile's code was on the stack (or is the cause): an eager retry may
    help. A model error dynamo traced qualifies too; the eager retry then raises it plainly."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        tb = exc.__traceback__
        while tb is not None:
            if any(p in tb.tb_frame.f_code.co_filename for p in _COMPILE_PACKAGES):
                return True
            tb = tb.tb_next
        exc = exc.__cause__ or exc.__context__
    return False


def _no_retry_reason(recipe: Any) -> str | None:
    if _distributed():
        return "in a distributed run"
    if getattr(recipe, "_optimizer_in_bwd", False):
        return "with optimizer_in_bwd=True (parameters update during the backward)"
    return None


def largest_proper_divisor(n: int) -> int:
    """The next micro-batch down that divides ``n`` (n // 2 when n is even)."""
    return next(d for d in range(n // 2, 0, -1) if n % d == 0)


def with_batch_size(loader: Any, batch_size: int) -> Any:
    """The same loader (dataset, sampler, collate, workers) with a smaller batch: the
    sampler, shared, yields the same order, so the same samples form each step."""
    extra = {}
    if loader.num_workers > 0:
        extra = {"prefetch_factor": loader.prefetch_factor,
                 "persistent_workers": loader.persistent_workers}
    return type(loader)(dataset=loader.dataset, batch_size=batch_size, sampler=loader.sampler,
                        collate_fn=loader.collate_fn, drop_last=loader.drop_last,
                        num_workers=loader.num_workers, pin_memory=loader.pin_memory, **extra)


def _max_seq_len(recipe: Any) -> str:
    value = getattr(getattr(recipe, "_tokenizer", None), "max_seq_len", None)
    return str(value) if value else "?"


# -- test-only hooks (inert unless their variable is set) ---------------------------------

def _register_failing_backend_for_tests() -> None:
    """Test-only: ``KUBETUNE_TEST_FAILING_COMPILE_BACKEND=<name>`` registers a dynamo
    backend of that name that raises, so a CPU test (with TORCH_COMPILE_BACKEND=<name>)
    sees torch.compile fail at the first forward as a broken GPU toolchain would."""
    name = passed_env.test_failing_compile_backend()
    if not name:
        return
    import torch._dynamo

    def failing_backend(graph_module, example_inputs):
        raise RuntimeError(f"backend {name} fails on purpose ({env.TEST_FAILING_COMPILE_BACKEND})")

    torch._dynamo.register_backend(name=name, compiler_fn=failing_backend)


def _inject_oom_for_tests(recipe: Any) -> None:
    """Test-only: ``KUBETUNE_TEST_OOM_ABOVE_BATCH=N`` makes every forward of a micro-batch
    larger than N raise ``torch.OutOfMemoryError``, as CUDA would on a smaller card."""
    limit = passed_env.test_oom_above_batch()
    if not limit:
        return
    import torch

    def pre_forward(module, args, kwargs):
        tokens = kwargs.get("tokens", args[0] if args else None)
        if tokens is not None and tokens.shape[0] > int(limit):
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (injected: micro-batch {tokens.shape[0]} > "
                f"{env.TEST_OOM_ABOVE_BATCH}={limit})")

    recipe._model.register_forward_pre_hook(pre_forward, with_kwargs=True)
