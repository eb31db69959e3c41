"""How the Pulumi SDK's runtime runs while ``spotctl plan`` evaluates the program under mocks
(``cli.plan.mocks.run``): what it costs there and nothing records is switched off, only for that run.

A real ``pulumi up`` runs the program in the engine's own process, never through this module.
"""

from __future__ import annotations

import contextlib
from typing import Any


@contextlib.contextmanager
def no_cyclic_gc():
    """Pause Python's cyclic garbage collector while the program is evaluated (restored after).

    Registration builds millions of long-lived objects (per resource an Output and futures for every
    property, tasks, protobufs), and every full collection walks all of them again: at 1,000 jobs
    (6,510 resources) collections were ~60 % of plan's CPU (26.3 s -> 10.1 s without them) for
    +3 % peak memory (731 -> 756 MB), since little of it is garbage in cycles (bench/plan_scale.py).
    Reference counting still frees everything else, and the collector is back on afterwards.

    Everything allocated meanwhile would sit in the youngest generation, so the first collection after
    it would walk all of it (~3.5 s at 1,000 jobs): ``freeze`` + ``unfreeze`` moves it to the oldest
    generation instead, where it stays collectable (skipped when the caller froze objects itself)."""
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if was_enabled:
            gc.enable()


def source_positions_skippable(rt: Any) -> bool:
    """Whether the SDK's stack-trace capture can be skipped as ``no_source_positions`` does: the
    function is where this SDK version (3.272) has it, takes no argument, and is looked up by name
    (a module global) in both ``register_resource`` and ``read_resource``, and the source position of
    an empty trace is None. Any difference (another SDK version): False, and nothing is changed."""
    import inspect

    capture, position = getattr(rt, "_get_stack_trace", None), getattr(rt, "_get_source_position", None)
    stack_trace = getattr(getattr(rt, "source_pb2", None), "StackTrace", None)
    if not (inspect.isfunction(capture) and inspect.isfunction(position) and stack_trace is not None):
        return False
    if inspect.signature(capture).parameters:
        return False
    for caller in ("register_resource", "read_resource"):
        code = getattr(getattr(rt, caller, None), "__code__", None)
        if code is None or "_get_stack_trace" not in code.co_names:
            return False
    try:
        return position(stack_trace()) is None
    except Exception:  # noqa: BLE001 - any surprise means: leave the SDK alone
        return False


@contextlib.contextmanager
def no_source_positions():
    """While the program runs under the mocks, resources carry no stack trace or source position.

    For every resource the SDK (``pulumi.runtime.resource._get_stack_trace``) walks the whole
    Python stack (``traceback.extract_stack``: a line read, a ``stat`` and a file URI per frame) to
    tell the engine where in the program it was declared; there is no switch for it. The mock
    monitor ignores both fields and so does the recording, so under the mocks this is pure cost:
    ~13 % of plan's CPU, more the deeper the program's calls (bench/plan_scale.py). An empty trace
    is what the SDK itself sends when it finds no user frame. Only ``spotctl plan`` runs here: a real
    ``pulumi up`` runs the program in the engine's own process, never through this module.
    Guarded by ``source_positions_skippable``: with other SDK internals nothing changes (and
    tests/test_plan_cli.py fails, so the guard never stops applying unnoticed)."""
    from pulumi.runtime import resource as rt

    if not source_positions_skippable(rt):
        yield
        return
    original, empty = rt._get_stack_trace, rt.source_pb2.StackTrace
    rt._get_stack_trace = empty
    try:
        yield
    finally:
        rt._get_stack_trace = original


@contextlib.contextmanager
def own_event_loop():
    """Run the program on an event loop of its own, with ONE executor thread, and end it the way
    ``asyncio.run`` does, which ``pulumi.runtime.test`` does not (without it an asyncio traceback
    at exit was seen twice in ~100 loaded runs).

    The SDK sends every monitor call through the loop's default executor and the mock monitor
    answers on those threads, each creating an event loop of its own (``MockMonitor.RegisterResource``
    calls ``_ensure_event_loop``). Without this, a plan returned with up to cpu+4 executor threads
    alive and that many event loops, plus the main one, never closed: all left for the interpreter
    to tear down at exit, in whatever order finalization reaches them. Now one thread answers the
    calls in the order they are made (as the engine's single connection does; plans are unchanged),
    tasks still pending are awaited (e.g. a RegisterResourceOutputs sent last), the executor is
    shut down (its thread joined) and every loop is closed before the plan is returned."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    thread_loops: list[asyncio.AbstractEventLoop] = []

    def thread_loop() -> None:  # the loop MockMonitor would create on the executor thread, made here to be closed
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        thread_loops.append(loop)

    loop = asyncio.new_event_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=1, thread_name_prefix="spotctl-plan", initializer=thread_loop))
    asyncio.set_event_loop(loop)
    # asyncio.all_tasks scans every task the program ever made that is still referenced (~80,000 at
    # 1,000 jobs, kept by their Outputs) and returns the pending ones: scanned as few times as possible.
    done = False
    try:
        yield
        while pending := asyncio.all_tasks(loop):
            loop.run_until_complete(asyncio.wait(pending))  # e.g. a RegisterResourceOutputs sent last
        done = True
    finally:
        if not done and (left := asyncio.all_tasks(loop)):  # after a failure: what the program left running
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        for other in thread_loops:
            other.close()
        asyncio.set_event_loop(None)


def _dropped(*_args: Any, **_kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def no_debug_log():
    """While the program runs under the mocks, the SDK's debug messages are dropped where they are
    sent, when the mock engine would drop them anyway.

    The SDK logs ~5 debug lines per resource (``pulumi.log.debug``: an engine lookup, a ``LogRequest``
    protobuf, the mock engine's ``Log``), and the mock engine hands them to the root logger
    (``set_mocks`` without a logger), which discards them unless it is set to DEBUG: ~4 % of plan's
    CPU for nothing. With the root logger at DEBUG (or no ``pulumi.log.debug`` function to replace)
    nothing changes."""
    import inspect
    import logging

    import pulumi.log as plog

    if logging.getLogger().isEnabledFor(logging.DEBUG) or not inspect.isfunction(getattr(plog, "debug", None)):
        yield
        return
    original = plog.debug
    plog.debug = _dropped
    try:
        yield
    finally:
        plog.debug = original
