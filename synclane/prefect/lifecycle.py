"""A work run's own life in Prefect: it notices that it was cancelled or that its deployment was
deleted, and once it has ended, it asks for its successor.

Why the run watches itself: a cancel reaches a run through its runner (`serve`) or its process
worker, which SIGTERMs it; after the Prefect server has been away for a moment, Prefect 3.9's
runner and worker stop watching for cancellations for the rest of their lives (they log
"Cancellation polling task failed"), and a cancel then leaves the run `Cancelling` until its
budget ends. A deleted deployment (and its concurrency limit) leaves Prefect unable to record
its runs' final states. So a work run reads its own state and its deployment every
`WATCH_SECONDS`, and stops its worker (jobs handed back) when either says so.

Why the successor is asked for from hooks: a hook runs once the run's final state is recorded,
so the run's slot in the deployment's limit is free and the successor is never refused for it;
and `on_crashed` covers what the flow's own code cannot: after the Prefect server restarts, its
deployment concurrency leases are gone (kept in memory by default), and the engine ends the run
`Crashed` at its next lease renewal (up to 225 s later). The jobs were handed back by then; the
successor takes them within seconds rather than at the next planning minute.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.exceptions import ObjectNotFound
from prefect.logging.loggers import flow_run_logger

from synclane.prefect.runs import keep_work_runs

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun, State

    from synclane.worker import Worker

log = logging.getLogger("synclane")

# How often a work run reads its own state and its deployment.
WATCH_SECONDS = 10.0
# A run that crashed sooner than this after it started gets no successor from its hook: a run
# that crashes at every start would otherwise start the next one at once, for ever. The plan
# runs start one within a minute instead.
CRASH_SUCCESSOR_AFTER = 60.0


@dataclass
class _Run:
    started: float = field(default_factory=time.monotonic)
    successor: bool = False  # it used its whole budget: the next run should start at once


# The work runs of this process, by id: what the hooks need to know once the flow has returned.
_runs: dict[UUID, _Run] = {}
_runs_lock = threading.Lock()


def work_began(run_id: UUID) -> None:
    with _runs_lock:
        _runs[run_id] = _Run()


def wants_successor(run_id: UUID) -> None:
    with _runs_lock:
        _runs.setdefault(run_id, _Run()).successor = True


def work_ended(run_id: UUID) -> _Run | None:
    with _runs_lock:
        return _runs.pop(run_id, None)


def after_run(flow: Any, flow_run: FlowRun, state: State) -> None:
    """`on_completion` and `on_failure`: a run that used its whole budget starts its successor."""
    run = work_ended(flow_run.id)
    if run is not None and run.successor and flow_run.deployment_id is not None:
        _start_successor(flow, flow_run, "its budget was used")


def forget(flow: Any, flow_run: FlowRun, state: State) -> None:
    """`on_cancellation`: a cancelled run starts no successor."""
    work_ended(flow_run.id)


def after_crash(flow: Any, flow_run: FlowRun, state: State) -> None:
    """`on_crashed`: a run of a deployment that worked a while starts its successor."""
    run = work_ended(flow_run.id)
    if flow_run.deployment_id is None:
        return
    logger = flow_run_logger(flow_run, flow)
    ran = None if run is None else time.monotonic() - run.started
    if ran is not None and ran < CRASH_SUCCESSOR_AFTER:
        logger.warning(
            "the work run crashed %.0f s after it started (%s): no successor from it, the plan "
            "runs start the next run within a minute",
            ran,
            state.message,
        )
        return
    _start_successor(flow, flow_run, f"it crashed ({state.message})")


def _start_successor(flow: Any, flow_run: FlowRun, why: str) -> None:
    logger = flow_run_logger(flow_run, flow)
    assert flow_run.deployment_id is not None
    try:
        topped = keep_work_runs(flow_run.deployment_id, exclude=flow_run.id)
    except Exception as error:  # the API is away, or the deployment is gone: the plan runs
        logger.warning("could not start this run's successor: %s", error)
        return
    if topped.started:
        logger.info(
            "%s: started %d successor run(s) (%d of %d working)",
            why,
            len(topped.started),
            topped.active,
            topped.limit,
        )


class RunWatch:
    """A thread that reads the work run's state and its deployment every `WATCH_SECONDS` and
    stops `worker` when the run is being cancelled or the deployment was deleted; `reason`
    then says which. A Prefect API that does not answer is asked again next time."""

    def __init__(
        self, worker: Worker, run_id: UUID, deployment_id: UUID, every: float = WATCH_SECONDS
    ) -> None:
        self.worker = worker
        self.run_id = run_id
        self.deployment_id = deployment_id
        self.every = every
        self.reason: str | None = None
        self._done = threading.Event()
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._watch,), name="synclane-run-watch", daemon=True
        )

    def start(self) -> RunWatch:
        self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._done.wait(self.every):
            try:
                reason = self._look()
            except Exception as error:  # the API is away: the runner's own path still works
                log.debug("work run %s could not read its state: %s", self.run_id, error)
                continue
            if reason is not None:
                self.reason = reason
                log.warning("the work run stops: %s; handing its jobs back", reason)
                self.worker.stop()
                return

    def _look(self) -> str | None:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(self.run_id)
            state = run.state
            if state is not None and (
                state.type == StateType.CANCELLING
                or (state.type == StateType.CANCELLED and state.name == "Cancelling")
            ):
                return "it was cancelled in Prefect"
            try:
                client.read_deployment(self.deployment_id)
            except ObjectNotFound:
                # Prefect cannot record the final state of a run that holds a slot of a
                # deleted deployment's limit (the release fails): give the slot back first.
                lease = state.state_details.deployment_concurrency_lease_id if state else None
                if lease is not None:
                    client.release_concurrency_slots_with_lease(lease)
                return "its deployment was deleted"
        return None
