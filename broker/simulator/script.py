"""What a simulated run does: input markers and the task that plays them as Hermes 0.19.0 events."""

from __future__ import annotations

import asyncio
import re
import time

from attrs import frozen

from broker.simulator.state import Settings, SimRun

REPLY = ("Hello ", "from ", "the ", "simulator.")
FAILURE = "HTTP 400: simulated failure"
DANGEROUS_COMMAND = "rm -rf /tmp/hermes-simulator-scratch"
APPROVAL_CHOICES = ("once", "session", "always", "deny")
UNPACED_BATCH = 64  #: an unpaced `deltas:N` reply yields to the event loop once per this many deltas
REASONING_CHARS = 500  #: Hermes's reasoning.available repeats the reply's text, at most this much of it


@frozen
class Script:
    """Markers found in the user message: `sleep:N`, `tools:K`, `fail`, `approval`, `deltas:N`, `tokens:N`."""

    sleep_s: float = 0.0
    tools: int = 0
    fail: bool = False
    approval: bool = False
    deltas: int = 0  #: 0 = the usual four-part reply; N = a reply of N deltas, unpaced unless `sleep:N` is given
    #: the completed run's `usage.total_tokens` (two thirds input, the rest output); 0 = 18 per model call
    tokens: int = 0

    @classmethod
    def from_text(cls, text: str) -> Script:
        sleep = re.search(r"\bsleep:(\d+(?:\.\d+)?)", text)
        tools = re.search(r"\btools:(\d+)", text)
        deltas = re.search(r"\bdeltas:(\d+)", text)
        tokens = re.search(r"\btokens:(\d+)", text)
        return cls(
            sleep_s=float(sleep.group(1)) if sleep else 0.0,
            tools=int(tools.group(1)) if tools else 0,
            fail=re.search(r"\bfail\b", text) is not None,
            approval=re.search(r"\bapproval\b", text) is not None,
            deltas=int(deltas.group(1)) if deltas else 0,
            tokens=int(tokens.group(1)) if tokens else 0,
        )

    @property
    def model_calls(self) -> int:
        return 1 + self.tools + int(self.approval)


async def play(run: SimRun, script: Script, settings: Settings) -> None:
    """The run's background task; cancelling it (stop, restart) ends the run `cancelled`."""
    try:
        run.set_status("running")
        await asyncio.sleep(settings.step_s)  # Hermes builds its agent here
        for step in range(script.tools):
            await _tool(run, f"echo step {step + 1}", settings)
        if script.approval:
            await _dangerous_tool(run, settings)
        if run.stopping:
            raise asyncio.CancelledError  # a stop that lands after the answer still ends the run cancelled
        if script.fail:
            run.error = FAILURE
            run.set_status("failed", last_event="run.failed")
            run.emit("run.failed", error=FAILURE)
            return
        await _reply(run, script, settings)
    except asyncio.CancelledError:
        run.set_status("cancelled", last_event="run.cancelled")
        run.emit("run.cancelled")
        raise
    finally:
        run.close_stream()


async def _tool(run: SimRun, command: str, settings: Settings) -> None:
    started = time.time()
    run.emit("tool.started", tool="terminal", preview=command)
    await asyncio.sleep(settings.step_s)
    run.emit("tool.completed", tool="terminal", duration=round(time.time() - started, 3), error=False)


async def _dangerous_tool(run: SimRun, settings: Settings) -> None:
    """A command that waits for /approval; deny or a timeout blocks it, and the run carries on."""
    started = time.time()
    run.emit("tool.started", tool="terminal", preview=DANGEROUS_COMMAND)
    run.approval = asyncio.get_running_loop().create_future()
    run.set_status("waiting_for_approval")
    run.emit(
        "approval.request",
        command=DANGEROUS_COMMAND,
        pattern_key="delete in root path",
        pattern_keys=["delete in root path"],
        description="delete in root path",
        allow_permanent=True,
        choices=list(APPROVAL_CHOICES),
    )
    try:
        choice = await asyncio.wait_for(asyncio.shield(run.approval), settings.approval_timeout_s)
    except TimeoutError:
        choice = "deny"  # Hermes treats an unanswered prompt exactly like deny, without approval.responded
    except asyncio.CancelledError:
        run.emit("tool.completed", tool="terminal", duration=round(time.time() - started, 3), error=True)
        raise
    finally:
        run.approval = None
    run.emit("tool.completed", tool="terminal", duration=round(time.time() - started, 3), error=choice == "deny")


async def _reply(run: SimRun, script: Script, settings: Settings) -> None:
    parts = REPLY if script.deltas <= 0 else tuple(f"d{index} " for index in range(script.deltas))
    pause = script.sleep_s / len(parts) if script.sleep_s else (settings.step_s if script.deltas <= 0 else 0.0)
    after_tool = script.tools > 0 or script.approval
    for index, part in enumerate(parts):
        if pause > 0 or script.deltas <= 0 or index % UNPACED_BATCH == 0:
            await asyncio.sleep(pause)  # an unpaced `deltas:N` only yields now and then, so other runs stream too
        run.emit("message.delta", delta=("\n\n" if after_tool and index == 0 else "") + part)
    text = "".join(parts)
    run.emit("reasoning.available", text=text[:REASONING_CHARS])
    if run.stopping:
        raise asyncio.CancelledError
    calls = script.model_calls
    run.output = text
    run.usage = {"input_tokens": 11 * calls, "output_tokens": 7 * calls, "total_tokens": 18 * calls}
    if script.tokens:
        output = script.tokens // 3
        run.usage = {"input_tokens": script.tokens - output, "output_tokens": output, "total_tokens": script.tokens}
    run.set_status("completed", last_event="run.completed")
    run.emit("run.completed", output=text, usage=run.usage)
