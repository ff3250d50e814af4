"""The Redis key schema, declared once. No key string appears anywhere else.

Every job belongs to one of PARTITIONS partitions, a pure function of its id (`partition_of`). The
partition's tag `{pN}` is a Redis Cluster hash tag shared by the job's own keys and by the partition's
schedule, admission line and board structures, so every atomic write of a job (one Lua script) touches
one hash slot, and the partitions spread the jobs over every master of a cluster (SPEC S9, DESIGN §6).
The same layout serves a single Redis: there the partitions cost a few more keys.

key                          type    holds                                             TTL / writer
hbr:{pN}:J:events            stream  the job's events, field `e` = JSON; id = SSE id   none while the job lives,
                                                                                       RUNS_RETENTION from its
                                                                                       terminal write; job write
hbr:{pN}:J:view              hash    `state` = view JSON, `last_id` = id folded to,    as the events; job write
                                     `run:<attempt>` = the attempt's Hermes run id
                                     (what packed events leave out, broker/codec.py),
                                     `deltas_removed` = entries removed (S3.6); after the
                                     delta window, with `hbr:views` lean, `lean` + `output_at`
                                     instead of `state` (broker/store/lean.py)
hbr:{pN}:J:lease             string  run lease token                                   RUNS_LEASE; driver
hbr:{pN}:J:board             hash    latest board report, pending and acked versions   until expiry; job write
hbr:{pN}:J:callback          hash    the job's callback deliveries (SPEC S5.8):        as the events (at least
                                     `url`, `status`, `attempts`, `last_error`,        CALLBACK_RETRY_WINDOW)
                                     `queue` (owed webhook ids in order), per id        from its terminal write;
                                     `b:<id>` body, `s:<id>` first owed ms, `t:<id>`    job write, callback
                                     failed attempts; only jobs with a callback        sender
hbr:{pN}:due                 zset    job id -> epoch ms of its next wake-up (memory)   none; job write, driver
hbr:{pN}:line                zset    jobs waiting for Hermes -> score (S4.1, S4.2)     none; job write, claim
hbr:{pN}:fair                hash    per fairness key with waiting jobs in the         none; job write, claim,
                                     partition: `n:<key>` their count, `w:<key>` its     enter; a pass clears it
                                     weight (S4.2: /readyz top keys; a create's          when the line is empty
                                     `waiting` quota, S4.4, broker/store/bound.py)
hbr:{pN}:fair:top            zset    fairness key -> its `n:` count in `fair`, so the    none; as `fair` (this
                                     keys with most waiting jobs are read in O(log n)    version's scripts); a
                                     whatever the number of keys (S4.2, S3.8)           repair slice mends drift
hbr:{pN}:arrivals             zset    job id -> created ms, while the job lives (S4.2:   past RUNS_RETENTION;
                                     a pass orders jobs of one score by it)              job write
hbr:{pN}:turns:<prio>        zset    fairness key of this partition -> its next start  none; fair_turn.lua
                                     tag in the priority (F, S4.2); F <= V is dropped    before a create
hbr:{pN}:keys:<prio>         hash    `ADMISSION_FAIRNESS_COST` (S4.2 "What a turn       none; fair_turn_cost,
                                     costs"): fairness key of this partition with        fair_next, fair_settle
                                     waiting first attempts -> `F|projected|front|
                                     front_tag|at_v|advance|paced` (its KeyLine,
                                     broker/admission/cost.py); the key moves to
                                     `turns` (F > V) or goes when its queue empties
hbr:{pN}:q:<prio>:<K>        zset    key K's waiting first attempts -> arrival order     none; as `keys`
                                     (created ms, kept strictly increasing): the front
                                     is the first (pN = `fairness_partition(K)`)
hbr:{pN}:cost:<K>            hash    K's History (`avg`, `n`, its settled runs' costs)   RUNS_RETENTION from its
                                     and `c:<J>` = what the grant of J's run in flight   last write; as `keys`
                                     charged, `p|units|start|at_v|paced|weight|attempt`
                                     `|guessed` (1: the guess; absent: not); `seq` its
                                     settles' count (begun at the ms of the first)
hbr:{pN}:settled:<K>         zset    `<J>:<attempt>` of K's settled charges -> when      RUNS_RETENTION from its
                                     (a second grant or settle of them charges nothing)  last write, older entries
                                                                                       trimmed; fair_settle
hbr:{pN}:parked              zset    first attempts waiting behind their key's front      none; job write, claim,
                                     -> `band + projection` (fallback order only)        fair_promote
hbr:{pN}:fronts              hash    a front of the partition's line -> `advance|more|   none; job write, claim,
                                     next ids|key` (what a pass plans its key by; the    fair_promote
                                     key last: it may hold any character); `q:<J>` the
                                     `seq` a settle placed front J with (goes with J's)
hbr:{pN}:board:outbox        stream  due board deliveries; group `senders`             acked; job write, promoter
hbr:{pN}:board:due           zset    job id -> when a coalesced refresh is due         none; job write, sender
hbr:{pN}:board:index         zset    job id -> sourceActivityAt + HERMES_TTL           none; job write
hbr:{pN}:callbacks:due       zset    job id -> when its next callback delivery is due  none; job write,
                                     (a claimed one: when its claim lapses)            callback sender
hbr:{pN}:runs                zset    job id -> updated_at ms: the listing (S3.9)        past RUNS_RETENTION; job write
hbr:{pN}:runs:<status>       zset    the same, one per job status (the status filter)  past RUNS_RETENTION; job write
hbr:{pN}:deltas              zset    finished job id -> when its deltas are removed    none; terminal job write,
                                     (RUNS_DELTA_RETENTION after its end, S3.6)        delta sweep (each replica)
hbr:{pN}:affinity:<S>        string  the upstream that ran session S's last job         RUNS_RETENTION from its
                                     (SPEC S10); pN = `session_partition(S)`           last job's acceptance and
                                                                                       end; driver
hbr:{pN}:session-turns:<S>   zset    session S's unfinished turns in order (SPEC S4.3)  RUNS_RETENTION from its
                                     -> their place in it; the first holds the session  last write; create,
                                     (pN = `session_partition(S)`, as every session key) runner, stop
hbr:{pN}:session-state:<S>   hash    `since`: when the first turn got the session;      as session-turns
                                     `p:<J>`: where a turn that waits for it left the
                                     line (it is out of the line until its turn)
                                     `h:<J>`: the earlier turns J sends as its history
hbr:{pN}:session-history:<S> list    the session's latest completed turns (job ids)    RUNS_RETENTION from its
                                                                                       last write; a turn's end
hbr:{pN}:sessions            hash    `waiting`: the partition's turns waiting for       none; as session-turns
                                     their session (SPEC S4.3: /readyz)
hbr:{pN}:usage               zset    usage facts of the partition's jobs not yet        none; job write,
                                     counted (SPEC S4.5): member = the fact (JSON),    usage sweep (each replica)
                                     score = when it happened (broker/store/usage.py)
hbr:{pN}:scratch             stream  a job stream's compacted copy, renamed over it    exists only inside a job write
hbr:{pN}:J:compact           stream  the job's stream without its deltas, built in     the events' TTL; the delta
                                     slices (S3.6); its last id is how far the slices   sweep, copied over the
                                     read; copied over the events when they reach the   events at the end
                                     end (remove_deltas.lua)
hbr:{u:H}:keys               hash    one hour's usage per fairness key (SPEC S4.5):     RUNS_RETENTION after the
                                     fairness key -> its eight counters, comma-joined   hour; usage_record.lua
                                     (projections/usage.py FIELDS); H = the hour's
                                     start, epoch seconds
hbr:{u:H}:top                zset    fairness key -> its Hermes ms in the hour          as `keys`
hbr:{u:H}:seen               set     the facts counted in the hour (their markers), so  as `keys`
                                     a fact read again is counted once
hbr:{work}                   stream  doorbells (hints): `job`; `line` (creates on a     acked+deleted; after writes
                                     cluster, or of older brokers); group drivers
hbr:{board}:bell             stream  cluster only: a board version was written (hint)  ~1000; after job writes
hbr:format                   string  `packed`: replicas may write packed events         none; startup of a fresh
                                     (broker/codec.py); `full` or absent: they do not  or embedded store,
                                                                                       event_format.py
hbr:views                    string  `lean`: replicas may store lean views (the output    none; startup of a fresh
                                     left in the terminal entry, broker/store/lean.py)  or embedded store,
                                                                                       event_format.py
hbr:lock:<name>              string  token-owned locks                                 lock TTL; sender, reconciler
  hbr:lock:board:<J>         one board key's deliveries                                longest delivery; sender
  hbr:lock:board:reconcile   one reconciliation pass per interval                      BOARD_RECONCILE_INTERVAL
hbr:signals                  pubsub  job ids whose owner should re-read their stream,  -; http (stop, approval),
                                     and `line J`: job J joined the line (S4.1);         job write (create)
                                     `new S A J`: joined at the virtual time (S4.2)
hbr:{adm}:live               zset    jobs holding an admission slot -> slot expiry ms  none; admission
hbr:{adm}:reserved           zset    slots reserved for a pass -> expiry ms            none; admission pass
hbr:{adm}:slots              hash    job holding a slot -> its place in the line       none; admission
hbr:{adm}:state              hash    the learnt limit and the refusal (probe) state,   none; admission
                                     `v1`..`v5`: the virtual time of each priority (S4.2),
                                     `fresh:<mode>` = `avg|n` of newcomers' runs' costs
hbr:{adm:<name>}:live, :reserved, :slots, :state
                                     the same four for every upstream but the first    as {adm}
                                     (SPEC S10), `<name>` its name (`hermes-2:8642`);
                                     (`v1`..`v5` there are not read: V is the first's)
hbr:{quota}:live:<K>         zset    fairness key K's live Hermes runs -> expiry ms    none; admission pass,
                                     (its `live` quota, S4.4; renewed with the slots)   release, renewal
hbr:{quota}:held:<K>         zset    K's jobs out of the line while K is at its quota  none; admission pass,
                                     or budget -> their place in the line (S4.4)        quota wake
hbr:{quota}:woken:<K>        zset    K's held jobs sent back to the line, not taken    none; quota wake,
                                     yet -> their place when held (or a live run's      admission pass,
                                     whose grant went back, ahead of K's held jobs)     refusal, hand-back
hbr:{quota}:tokens:<K>       hash    K's tokens per hour (start, epoch s) of its        8 days from the last
                                     settled runs, while K has a token budget           run; whoever counts
                                                                                       the run's usage
hbr:{quota}:held-keys        zset    keys with held jobs -> when to look at them again none; as `held`
hbr:{quota}:holds            hash    K -> why it holds jobs: `quota`, `order` (behind    none; as `held`
                                     its earlier ones) or `budget:<retry_at ms>`
hbr:{quota}:held-count       string  the held jobs of every key                         none; as `held`
hbr:{quota}:returned         hash    woken jobs that were live runs whose grant went    none; refusal,
                                     back -> `r` refused, `h` handed back               hand-back, pass

Several Hermes deployments (SPEC S10): each upstream has its own admission (limit, live slots, refusal) in a
slot of its own. The FIRST upstream of HERMES_URL keeps `{adm}`, so a one-URL broker and a store of the broker
before S10 are unchanged, and replicas of both agree during a rolling upgrade; the line's virtual times stay in
`{adm}:state`. Every other upstream is keyed by its name, not its place in the list: reordering, adding or
removing upstreams never hands one deployment's live slots or learnt limit to another (the first one aside: keep
the deployment that was there before S10 first).

A fairness key's usage (SPEC S4.5) is tagged by its hour, not by the key or the job: the counters, the ranking and the
markers of one hour share a slot, so counting a fact (its marker, its key's counters and the hour's ranking of keys
by Hermes time) is one script, and the top keys of a range read one ranking per hour. A job write (its partition's
slot) leaves the fact in `hbr:{pN}:usage`; the sweeps count it in the hour's slot. The hour's slot takes that hour's
counting, as `{adm}` takes every grant.

Quotas (SPEC S4.4) are one slot, `{quota}`, for every fairness key: a key's live runs are counted across replicas and
upstreams, so taking them is one script per pass whatever keys it grants, and a key at its limit keeps its waiting
jobs there (out of the 64 lines, so passes do not read past them) until it has room again.

The work stream is only a wake-up hint, rung right after the job write on a cluster (another slot; on a single
Redis the `line J` message the write publishes, heard by every replica in creation order, rings the passes instead):
the due schedules and lines are the durable memory, looked at periodically by every replica, so a lost doorbell or
message costs a tick, never a job. The admission slots and the
limit stay one cluster-wide set in the `{adm}` slot (Hermes is one resource); the line is per partition.
A fairness key's turns live in the partition of the key (`fairness_partition`), not of its jobs: a key's jobs
spread over every partition, and their start tags must follow one sequence (FIFO within a key, S4.2). The scripts
that count waiting jobs in the job's partition (`fair`) count only jobs in a priority band (first attempts placed
by this version) and read a job's key from its view JSON.

Keys of the layout before partitions (broker <= 0.x, "layout 1"): `hbr:{J}:*`, `hbr:work`, `hbr:due`,
`hbr:board:*`, `hbr:{adm}:line`. The broker refuses to start on them; `python scripts/migrate_layout.py`
moves them (broker/store/migrate.py).
"""

from __future__ import annotations

import zlib

from attrs import frozen

PREFIX = "hbr"
EVENT_FIELD = "e"
#: Fixed forever for a store: a job's partition is derived from its id. SPEC S2 adds no variable for it.
PARTITIONS = 64

WORK = f"{PREFIX}:{{work}}"
BOARD_BELL = f"{PREFIX}:{{board}}:bell"
WORK_GROUP = "drivers"
SIGNALS = f"{PREFIX}:signals"  # pub/sub: a job id whose owner should look at its stream now
BOARD_OUTBOX_GROUP = "senders"

_ADMISSION = f"{PREFIX}:{{adm}}"
ADMISSION_LIVE = f"{_ADMISSION}:live"
ADMISSION_SLOTS = f"{_ADMISSION}:slots"
ADMISSION_STATE = f"{_ADMISSION}:state"
ADMISSION_RESERVED = f"{_ADMISSION}:reserved"

_QUOTA = f"{PREFIX}:{{quota}}"
QUOTA_HELD_KEYS = f"{_QUOTA}:held-keys"
QUOTA_HOLDS = f"{_QUOTA}:holds"
QUOTA_HELD_COUNT = f"{_QUOTA}:held-count"
QUOTA_RETURNED = f"{_QUOTA}:returned"


def quota_live(fairness_key: str) -> str:
    """The fairness key's live runs (SPEC S4.4 `live`): one slot for every key, so a pass takes them in one script."""
    return f"{_QUOTA}:live:{fairness_key}"


def quota_held(fairness_key: str) -> str:
    """The fairness key's jobs held out of the line by its quota or budget (SPEC S4.4)."""
    return f"{_QUOTA}:held:{fairness_key}"


def quota_woken(fairness_key: str) -> str:
    """The fairness key's held jobs sent back to the line and not yet taken (SPEC S4.4)."""
    return f"{_QUOTA}:woken:{fairness_key}"


def quota_tokens(fairness_key: str) -> str:
    """The tokens the fairness key's settled runs used, per hour (its token budget, SPEC S4.4)."""
    return f"{_QUOTA}:tokens:{fairness_key}"


@frozen
class AdmissionKeys:
    """One upstream's admission keys, all in one slot (SPEC S10)."""

    state: str
    live: str
    slots: str
    reserved: str

    @property
    def scripts(self) -> list[str]:
        """KEYS[1..3] of the admission scripts: state, live, slots."""
        return [self.state, self.live, self.slots]

    @property
    def reserving(self) -> list[str]:
        """KEYS[1..4] of the scripts of a pass: state, live, slots, reserved."""
        return [self.state, self.live, self.slots, self.reserved]

    @property
    def orphans(self) -> str:
        """zset, Hermes run id -> epoch ms: runs left on the upstream when it was lost and their jobs moved on, to be
        stopped there once it answers again (SPEC S10). In the upstream's slot."""
        return self.state.removesuffix(":state") + ":orphans"


FIRST_ADMISSION = AdmissionKeys(ADMISSION_STATE, ADMISSION_LIVE, ADMISSION_SLOTS, ADMISSION_RESERVED)


def admission(upstream: str, *, first: bool) -> AdmissionKeys:
    """The admission keys of the upstream named `upstream`: `{adm}` for the first of HERMES_URL, else by name."""
    if first:
        return FIRST_ADMISSION
    tag = f"{PREFIX}:{{adm:{upstream}}}"
    return AdmissionKeys(f"{tag}:state", f"{tag}:live", f"{tag}:slots", f"{tag}:reserved")


#: Every partition's events stream, as a SCAN pattern.
EVENTS_MATCH = f"{PREFIX}:{{p*}}:*:events"


def partition_of(job_id: str) -> int:
    """The job's partition: a pure function of its id (CRC-32, as every tool can compute it)."""
    return zlib.crc32(job_id.encode()) % PARTITIONS


def partitions() -> range:
    return range(PARTITIONS)


def _tag(partition: int) -> str:
    return f"{PREFIX}:{{p{partition}}}"


def _job(job_id: str) -> str:
    return f"{_tag(partition_of(job_id))}:{job_id}"


def events(job_id: str) -> str:
    return f"{_job(job_id)}:events"


def view(job_id: str) -> str:
    return f"{_job(job_id)}:view"


def lease(job_id: str) -> str:
    return f"{_job(job_id)}:lease"


def board(job_id: str) -> str:
    return f"{_job(job_id)}:board"


def callback(job_id: str) -> str:
    """The job's callback deliveries (SPEC S5.8): written only for jobs created with a callback."""
    return f"{_job(job_id)}:callback"


def compact(job_id: str) -> str:
    """The job's stream without its message deltas while remove_deltas.lua builds it in slices (SPEC S3.6)."""
    return f"{_job(job_id)}:compact"


def job_match(job_id: str) -> str:
    """A SCAN pattern for every key of one job."""
    return f"{_job(job_id)}:*"


def due(partition: int) -> str:
    return f"{_tag(partition)}:due"


def line(partition: int) -> str:
    return f"{_tag(partition)}:line"


def fair(partition: int) -> str:
    """Waiting jobs per fairness key in the partition's line, and the keys' weights (SPEC S4.2)."""
    return f"{_tag(partition)}:fair"


def fair_top(partition: int) -> str:
    """The partition's fairness keys ordered by their waiting jobs (the `n:` counts of `fair`, SPEC S4.2)."""
    return f"{_tag(partition)}:fair:top"


def arrivals(partition: int) -> str:
    """Jobs of the partition that have not ended -> their created ms (the line's tie-break, SPEC S4.2)."""
    return f"{_tag(partition)}:arrivals"


def turns(partition: int, priority: int) -> str:
    """The next start tag of each fairness key of the partition (`fairness_partition`) in one priority."""
    return f"{_tag(partition)}:turns:{priority}"


@frozen
class CostKeys:
    """One fairness key's keys of one priority for `ADMISSION_FAIRNESS_COST` (SPEC S4.2 "What a turn costs"), all in
    the key's partition (`fairness_partition`), the slot of its turns: each key step is one script there."""

    turns: str  #: the priority's idle keys -> F (shared with today's `turns`)
    lines: str  #: the priority's keys with waiting jobs -> their KeyLine
    queue: str  #: the key's waiting first attempts, arrival order
    history: str  #: the key's History and the charges of its runs in flight
    settled: str  #: the key's settled charges (job:attempt -> ms)

    @property
    def all(self) -> list[str]:
        """KEYS[1..5] of the cost scripts of the key's partition."""
        return [self.turns, self.lines, self.queue, self.history, self.settled]


def cost_keys(fairness_key: str, priority: int) -> CostKeys:
    """The keys of a fairness key's cost-aware turns in `priority` (SPEC S4.2)."""
    tag = _tag(fairness_partition(fairness_key))
    return CostKeys(
        turns(fairness_partition(fairness_key), priority),
        f"{tag}:keys:{priority}",
        f"{tag}:q:{priority}:{fairness_key}",
        cost_history(fairness_key),
        f"{tag}:settled:{fairness_key}",
    )


def cost_history(fairness_key: str) -> str:
    """A fairness key's History and in-flight charges, whatever their priority (SPEC S4.2)."""
    return f"{_tag(fairness_partition(fairness_key))}:cost:{fairness_key}"


def parked(partition: int) -> str:
    """First attempts of the partition waiting behind their key's front (SPEC S4.2 "What a turn costs")."""
    return f"{_tag(partition)}:parked"


def fronts(partition: int) -> str:
    """The partition's fronts -> their key's estimate, and how many wait behind them and which (SPEC S4.2)."""
    return f"{_tag(partition)}:fronts"


def fairness_partition(fairness_key: str) -> int:
    """The partition that keeps a fairness key's turns: a pure function of the key."""
    return zlib.crc32(b"key:" + fairness_key.encode()) % PARTITIONS


def session_partition(session_id: str) -> int:
    """The partition that keeps a session's affinity (SPEC S10): a pure function of its `session_id`."""
    return zlib.crc32(b"session:" + session_id.encode()) % PARTITIONS


def affinity(session_id: str) -> str:
    """The upstream a session's jobs go to (SPEC S10): one key per session, one slot per write, a TTL for retention."""
    return f"{_tag(session_partition(session_id))}:affinity:{session_id}"


def session_turns(session_id: str) -> str:
    """A session's unfinished turns in order (SPEC S4.3): the first holds the session."""
    return f"{_tag(session_partition(session_id))}:session-turns:{session_id}"


def session_state(session_id: str) -> str:
    """When a session's first turn got it, and where its waiting turns left the line (SPEC S4.3)."""
    return f"{_tag(session_partition(session_id))}:session-state:{session_id}"


def session_history(session_id: str) -> str:
    """A session's latest completed turns, oldest first (SPEC S4.3 `session_history`)."""
    return f"{_tag(session_partition(session_id))}:session-history:{session_id}"


def sessions(partition: int) -> str:
    """How many turns of the partition's sessions wait for their session (SPEC S4.3)."""
    return f"{_tag(partition)}:sessions"


def board_outbox(partition: int) -> str:
    return f"{_tag(partition)}:board:outbox"


def board_due(partition: int) -> str:
    return f"{_tag(partition)}:board:due"


def board_index(partition: int) -> str:
    return f"{_tag(partition)}:board:index"


def callbacks_due(partition: int) -> str:
    """Jobs of the partition owing a callback delivery -> when it is due (SPEC S5.8)."""
    return f"{_tag(partition)}:callbacks:due"


def runs(partition: int) -> str:
    """The listing index of every job of the partition (SPEC S3.9)."""
    return f"{_tag(partition)}:runs"


def runs_index(partition: int, status: str) -> str:
    """The listing index of the partition's jobs in one status (SPEC S3.9)."""
    return f"{runs(partition)}:{status}"


def deltas(partition: int) -> str:
    """Finished jobs of the partition whose message deltas are still stored -> when they are removed (S3.6)."""
    return f"{_tag(partition)}:deltas"


def usage_pending(partition: int) -> str:
    """Usage facts of the partition's jobs that are written but not yet counted in their hour (SPEC S4.5)."""
    return f"{_tag(partition)}:usage"


@frozen
class UsageKeys:
    """One hour's usage keys, all in one slot (the hour's tag): the counters, the ranking, the markers."""

    counters: str
    top: str
    seen: str

    @property
    def all(self) -> list[str]:
        return [self.counters, self.top, self.seen]


def usage(hour_s: int) -> UsageKeys:
    """The usage keys of the hour that starts at `hour_s` (epoch seconds)."""
    tag = f"{PREFIX}:{{u:{hour_s}}}"
    return UsageKeys(f"{tag}:keys", f"{tag}:top", f"{tag}:seen")


def scratch(partition: int) -> str:
    """Where the job write copies a job stream to compact it; renamed over the stream in the same script."""
    return f"{_tag(partition)}:scratch"


#: Whether replicas may write packed events (broker/codec.py, broker/store/entries.py).
EVENT_FORMAT = f"{PREFIX}:format"
PACKED = "packed"
FULL = "full"  #: pinned off by an operator (absent: not decided, also off)


#: Whether replicas may store a finished job's view without its output (broker/store/lean.py).
VIEW_FORMAT = f"{PREFIX}:views"
LEAN = "lean"  #: absent or anything else: they do not
VIEW_STATE = "state"  #: the view hash's field of the view JSON
VIEW_LEAN = "lean"  #: ... of the view JSON without its output, instead of `state`
VIEW_OUTPUT_AT = "output_at"  #: ... with `lean`: the id of the stream entry holding the output


def run_field(attempt: int) -> str:
    """The field of a job's view hash holding the Hermes run id of `attempt` (read for packed events)."""
    return f"run:{attempt}"


def lock(name: str) -> str:
    return f"{PREFIX}:lock:{name}"


def board_lock(job_id: str) -> str:
    """The token-owned lock under which one replica delivers a board key's versions (SPEC S5.3)."""
    return lock(f"board:{job_id}")


BOARD_RECONCILE_LOCK = lock("board:reconcile")


def job_id_of(key: str) -> str | None:
    """The job id inside a per-job key `hbr:{pN}:J:kind` (for SCAN-based tools), or None."""
    head, sep, rest = key.partition("}:")
    if not sep or not head.startswith(f"{PREFIX}:{{p"):
        return None
    job_id, sep, _ = rest.rpartition(":")
    return job_id if sep and job_id else None


def partition_of_key(key: str) -> int | None:
    """The partition a partitioned key belongs to, or None."""
    start, end = key.find("{p"), key.find("}")
    digits = key[start + 2 : end] if 0 <= start < end else ""
    return int(digits) if digits.isdigit() else None


class Legacy:
    """Key names of layout 1 (before partitions): read only by the migration and the startup guard."""

    WORK = f"{PREFIX}:work"
    DUE = f"{PREFIX}:due"
    BOARD_OUTBOX = f"{PREFIX}:board:outbox"
    BOARD_DUE = f"{PREFIX}:board:due"
    BOARD_INDEX = f"{PREFIX}:board:index"
    ADMISSION_LINE = f"{_ADMISSION}:line"
    RUNS = f"{PREFIX}:runs"  #: the listing index before partitions, and `hbr:runs:<status>`
    GLOBALS = (WORK, DUE, BOARD_OUTBOX, BOARD_DUE, BOARD_INDEX, ADMISSION_LINE, RUNS)

    @staticmethod
    def runs_index(status: str) -> str:
        return f"{Legacy.RUNS}:{status}"

    JOB_MATCH = f"{PREFIX}:{{job_*}}:*"

    @staticmethod
    def job_key_parts(key: str) -> tuple[str, str] | None:
        """(job id, kind) of a layout-1 job key `hbr:{J}:kind`, or None."""
        if not key.startswith(f"{PREFIX}:{{job_"):
            return None
        head, sep, kind = key.partition("}:")
        return (head[len(PREFIX) + 2 :], kind) if sep else None
