"""Flink's keyed state and timers as the shared steps take them, and the keyed functions that run
those steps (the Flink shell's counterpart of the Beam shell's stateful DoFns).

The shared steps (:class:`renyi_stream.pipelines.streaming.shard_filter.ShardFilter`,
:class:`renyi_stream.pipelines.streaming.commits.WindowStaging`,
:class:`renyi_stream.pipelines.streaming.commits.WindowCommits`, the release steps) take keyed state
objects with Beam's methods: a bag (``add``, ``read``, ``clear``), a value (``read``, ``write``,
``clear``), and a timer with ``set(seconds)``. Here a bag is a Flink ``ListState``, a value a
``ValueState`` (both of pickled bytes, in the job's state backend, checkpointed with the job) and
the timer an event-time timer of the operator's timer service, in milliseconds.

Timers are derived from state (../shared/ENGINES.md: a restored checkpoint once held a window's
rows without its timer): the shard filter re-arms its timer at the end of the next uncharged
window on every element it receives (:meth:`ShardFilter.receive`), and :class:`ShardFilterFunction`
re-arms it on a key's first element after every (re)start of the instance as well, before the
element is handled. A firing that comes too early or twice does nothing (the filter checks the
window's end), so a re-armed timer never charges a window twice.

Outputs are ``(tag, value)`` pairs: tag None the step's main output, any other a tagged one.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator

from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, RuntimeContext
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor

from renyi_stream.stream.engine.window_buffer import WIDTH, WindowBuffer

PICKLED = Types.PICKLED_BYTE_ARRAY()


class FlinkBag:
    """A Flink ``ListState`` as a bag: ``add``, ``read`` (a list, empty when unset), ``clear``."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def add(self, item: Any) -> None:
        self._state.add(item)

    def read(self) -> list[Any]:
        got = self._state.get()
        return [] if got is None else list(got)

    def clear(self) -> None:
        self._state.clear()


class FlinkValue:
    """A Flink ``ValueState`` as a value: ``read`` (None when unset), ``write``, ``clear``."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def read(self) -> Any:
        return self._state.value()

    def write(self, value: Any) -> None:
        self._state.update(value)

    def clear(self) -> None:
        self._state.clear()


class FlinkTimer:
    """The operator's event-time timer service as a timer: ``set(seconds)`` registers a timer at
    that time in milliseconds (Flink keeps one per key and timestamp: setting it again is a no-op)."""

    def __init__(self, ctx: Any) -> None:
        self._service = ctx.timer_service()

    def set(self, seconds: Any) -> None:
        self._service.register_event_time_timer(int(seconds) * 1000)


def _bag(context: RuntimeContext, name: str) -> FlinkBag:
    return FlinkBag(context.get_list_state(ListStateDescriptor(name, PICKLED)))


def _value(context: RuntimeContext, name: str) -> FlinkValue:
    return FlinkValue(context.get_state(ValueStateDescriptor(name, PICKLED)))


def _pairs(outputs: Iterable[tuple[str | None, Any]]) -> Iterator[tuple[str | None, Any]]:
    """A step whose outputs are ``(tag, value)`` pairs already (the shared steps'): as they are."""
    yield from outputs


def _main(outputs: Iterable[Any]) -> Iterator[tuple[str | None, Any]]:
    """A step whose every output is its main output: each as ``(None, value)``."""
    for out in outputs:
        yield None, out


class ShardFilterFunction(KeyedProcessFunction):
    """:class:`renyi_stream.pipelines.streaming.shard_filter.ShardFilter` keyed by shard: its state
    (module docstring of the filter: the window buffer's ``rows_i``, ``block_i``, ``later`` and
    ``held``, then ``state``, ``charged``, ``books``, ``mark``) in Flink's keyed state, its timer
    ``WINDOW_END`` the event-time timer. Outputs ``(tag, value)``."""

    def __init__(self, shard_filter: Any) -> None:
        self._filter = shard_filter
        self._seen: set[int] = set()

    def open(self, runtime_context: RuntimeContext) -> None:
        c = runtime_context
        self._ring = tuple(_bag(c, f"rows_{i}") for i in range(WIDTH))
        self._blocks = tuple(_bag(c, f"block_{i}") for i in range(WIDTH))
        self._later, self._held = _bag(c, "later"), _value(c, "held")
        self._state, self._charged = _bag(c, "state"), _value(c, "charged")
        self._books, self._mark = _value(c, "books"), _value(c, "mark")
        self._seen = set()  # keys this instance has had an element of since it (re)started

    def _buffer(self) -> WindowBuffer:
        return WindowBuffer(ring=self._ring, blocks=self._blocks, later=self._later, held=self._held)

    def _state_args(self, timer: FlinkTimer) -> dict[str, Any]:
        return {"buffer": self._buffer(), "state": self._state, "charged": self._charged, "books": self._books,
                "mark": self._mark, "timer": timer}

    def process_element(self, value: Any, ctx: Any) -> Iterator[Any]:
        timer = FlinkTimer(ctx)
        key = int(ctx.get_current_key())
        if key not in self._seen:
            # The first element of this key since the instance (re)started: the timer at the end of
            # the next uncharged window, whatever the restored checkpoint held (ENGINES.md).
            self._seen.add(key)
            through = self._filter._charged(self._charged)
            if through < self._filter._end:
                timer.set(self._filter._end_of(through + 1))
        yield from self._filter.receive(value, **self._state_args(timer))

    def on_timer(self, timestamp: int, ctx: Any) -> Iterator[Any]:
        key = int(ctx.get_current_key())
        yield from self._filter.window_end(key, int(timestamp) // 1000, **self._state_args(FlinkTimer(ctx)))


class KeyedStep(KeyedProcessFunction):
    """A shared stateful step under a key: ``call(step, element, **state)`` with the named bags and
    values as keyword arguments; its outputs as ``(tag, value)`` through ``outputs``
    (:func:`_main` by default). ``step.setup()``, when it has one, runs on open."""

    def __init__(self, step: Any, call: Callable[..., Iterable[Any]], *, bags: tuple[str, ...] = (),
                 values: tuple[str, ...] = (), outputs: Callable[[Iterable[Any]], Iterator[Any]] = _main) -> None:
        self._step, self._call, self._outputs = step, call, outputs
        self._bag_names, self._value_names = bags, values

    def open(self, runtime_context: RuntimeContext) -> None:
        self._kwargs = {**{n: _bag(runtime_context, n) for n in self._bag_names},
                        **{n: _value(runtime_context, n) for n in self._value_names}}
        setup = getattr(self._step, "setup", None)
        if callable(setup):
            setup()

    def process_element(self, value: Any, ctx: Any) -> Iterator[Any]:
        yield from self._outputs(self._call(self._step, value, **self._kwargs))
