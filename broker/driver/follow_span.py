"""The span of following one attempt's Hermes run (SPEC S6.1): started on first use, ended when the runner moves on
to another attempt or stops; the runner's spans while it follows the attempt are its children."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from broker import tracing


class FollowSpan:
    def __init__(self, status: Callable[[], str | None]) -> None:
        self._status = status  #: the job's status as the runner last saw it (set on the span when it ends)
        self._span = tracing.NO_SPAN
        self._attempt = 0  #: the attempt `_span` follows (0: none)

    def within(self, attempt: int, run_id: str) -> contextlib.AbstractContextManager[None]:
        """Within: spans are children of the follow span of `attempt` (started on first use)."""
        if not tracing.enabled():
            return tracing.NOTHING  # a follow iteration costs nothing more untraced
        return self._traced(attempt, run_id)

    def end(self) -> None:
        status = self._status()
        if status is not None:
            self._span.set(tracing.STATUS, status)
        self._span.end()
        self._span, self._attempt = tracing.NO_SPAN, 0

    @contextlib.contextmanager
    def _traced(self, attempt: int, run_id: str) -> Iterator[None]:
        if self._attempt != attempt:
            self.end()
            self._attempt = attempt
            attributes: tracing.Attributes = {tracing.ATTEMPT: attempt, tracing.RUN: run_id}
            self._span = tracing.start(tracing.FOLLOW, attributes=attributes)
        with tracing.within(None, {tracing.ATTEMPT: attempt}), self._span.current():
            yield
