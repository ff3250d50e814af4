"""A simulated Hermes 0.19.0 `/v1/runs` server for demos and tests (SPEC S7).

Start it with `python -m broker.simulator --host H --port P [--api-key K] [--max-concurrent N]
[--keepalive S] [--approval-timeout S] [--upstream-main]`, or in-process with `create_app(Settings(...))`.

Markers in the user message script a run: `sleep:N` (the reply takes N seconds), `tools:K` (K tool calls
first), `fail` (ends `failed`), `approval` (a `terminal` call waits for /approval; deny or timeout blocks it and
the run still completes), `deltas:N` (the reply is N `message.delta` events, streamed as fast as the reader
takes them, or spread over `sleep:N` seconds when that is given too; for benchmarks). Runs answer as captured in
hermes-runs-api.md, with one deliberate difference: a JSON body that is not an object gets a 400 envelope where
Hermes crashes with a plain-text 500. Bodies are taken up to 10,000,000 bytes, as Hermes does; past that (by
Content-Length, or while reading a body without one) the answer is Hermes's 413 `body_too_large` envelope.

Control API (no auth, JSON bodies, all optional fields):

- `GET/POST /_sim/settings`: read or change `busy` (429 on every create), `draining` (503 `gateway_draining`),
  `upstream_main`, `delay_s`, `max_concurrent`, `keepalive_s`, `approval_timeout_s`, `events_wait_s`, `step_s`,
  `api_key`, `proxy_max_body` (a proxy in front of Hermes answers bodies over that many bytes with nginx's HTML
  413 page, never reaching Hermes; 0, the default, is no proxy), e.g. `{"busy": true}`.
- `POST /_sim/restart` `{"cancel": false, "down_s": 0}`: forget every run, as a new process would. `cancel` first
  ends live runs `cancelled` with `run.cancelled` on their streams (SIGTERM); without it streams just break
  (SIGKILL). `down_s` then drops connections for that long. In upstream-main mode runs created with an
  Idempotency-Key survive, unsettled ones as `interrupted` (a stop of those answers 409 `run_not_active`,
  as upstream does for a run not alive in its process).
- `POST /_sim/refuse` `{"seconds": N}`: drop every non-control connection, live streams included, for N seconds.
- `POST /_sim/runs/{id}/interrupt` `{"forget": false}`: break the run's event stream (its buffer is gone, as
  upstream); `forget` also loses the run (404 from then on).
- `POST /_sim/runs/{id}/touch`: bump `updated_at` without any activity.
- `GET /_sim/requests`, `DELETE /_sim/requests`: the log of every other request as
  `{"requests": [{"method", "path", "status", "idempotency_key", "traceparent", "session_key"}]}`.
- `GET /_sim/stats`, `DELETE /_sim/stats` (reset): `{"live", "peak_live", "runs", "settled", "creates"}`: live
  runs now and at most since the reset, runs known and settled, creates answered by status
  (`{"202": n, "429": m}`). The cap can be changed mid-run with `POST /_sim/settings {"max_concurrent": 20}`.
"""

from broker.simulator.app import create_app
from broker.simulator.control import simulator_key
from broker.simulator.state import Settings, Simulator

__all__ = ["Settings", "Simulator", "create_app", "simulator_key"]
