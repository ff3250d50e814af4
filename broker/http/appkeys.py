"""Typed application keys (no string keys on the app)."""

from __future__ import annotations

from aiohttp import web
from redis.asyncio import Redis

from broker.board.service import BoardService
from broker.clock import Clock
from broker.config import Config
from broker.driver.service import JobService
from broker.driver.supervisor import Supervisor
from broker.driver.writer import Writer
from broker.hermes.client import HermesClient
from broker.metrics import Metrics
from broker.store.jobs import JobStore

board_key = web.AppKey("board", BoardService)
config_key = web.AppKey("config", Config)
clock_key = web.AppKey("clock", Clock)
metrics_key = web.AppKey("metrics", Metrics)
redis_key = web.AppKey("redis", Redis)
service_key = web.AppKey("service", JobService)
store_key = web.AppKey("store", JobStore)
supervisor_key = web.AppKey("supervisor", Supervisor)
writer_key = web.AppKey("writer", Writer)
hermes_key = web.AppKey("hermes", HermesClient)
draining_key = web.AppKey("draining", list[bool])  #: a one-element flag, set on SIGTERM
