"""A site's long-lived ClientApp process (Flower's process isolation mode).

With ``flower-supernode --isolation process`` the SuperNode runs no ClientApp itself: an
outside process claims each task (one per message) from the SuperNode's Runtime API and
answers it. Flower's own ``flower-superexec`` starts a new ``flwr-clientapp`` process per task,
which imports torch and fedseg and loads model, data and method again for every message.
:func:`serve` is the long-lived equivalent: one process per site claims the tasks itself and
answers them with fedseg's ClientApp, imported once, keeping each run's worker loaded
(:data:`fedseg.engine.flower.site.LOADED`). :func:`run_site` starts the SuperNode in process
isolation mode as its child and serves it: ``python -m fedseg.engine.flower.executor`` (what
``fedseg flower site`` and ``fedseg flower local`` run for every site).
"""

from __future__ import annotations

import argparse
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
from flwr.app import Error, Message
from flwr.clientapp import ClientApp
from flwr.common.config import get_fab_config
from flwr.common.constant import ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime import run_clientapp
from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

from fedseg.engine.flower.pulls import quick_pulls

__all__ = ["CLIENT_APP", "answer_task", "check_app", "main", "run_site", "serve"]

log = logging.getLogger(__name__)

CLIENT_APP = "fedseg.engine.flower.client_app:app"
"""The only ClientApp a fedseg site runs (the FAB must name it)."""
POLL = 0.2
"""Seconds between asks for a new task while the site is idle (each ask costs the SuperNode
about 2.5 ms of CPU time, this process 1.5 ms; a task waits for its SuperNode's own poll of
the SuperLink anyway)."""
PULL_BACKOFF = (0.02, 0.2)
"""First and longest wait (seconds) before asking the SuperNode again for the content of a
task's message: it hands out the task before it has downloaded the content
(:mod:`~fedseg.engine.flower.pulls`; Flower waits 1 s, then up to 10 s)."""


def _client(address: str, *interceptors: Any) -> RuntimeHttpClient:
    """A client of the SuperNode's Runtime API (on loopback, without TLS)."""
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=True,
        root_certificates=None,
        interceptors=list(interceptors),
        retry_invoker=make_simple_http_retry_invoker(),
    )


def check_app(fab_content: bytes) -> None:
    """ValueError unless the Flower App bundle ``fab_content`` names fedseg's ClientApp."""
    components = get_fab_config(fab_content)["tool"]["flwr"]["app"]["components"]
    if components.get("clientapp") != CLIENT_APP:
        raise ValueError(
            f"this site runs only fedseg's ClientApp ({CLIENT_APP}), the run asks for "
            f"{components.get('clientapp')!r}"
        )


def answer_task(address: str, token: str, app: ClientApp) -> None:
    """Run one claimed task: pull its message and context, answer with ``app`` in this
    process, push the reply and the task's final status (an error reply on failure)."""
    client = _client(
        address,
        RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
        RuntimeTokenHttpInterceptor(token),
    )
    heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
    heartbeat.start()
    message = context = reply = None
    status, details = SubStatus.FAILED, "the ClientApp task failed"
    try:
        message, context, _, fab = pull_task_input(client)
        check_app(fab.content)
        reply = app(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except Exception as e:  # any failure becomes the task's error reply, never a crash
        log.exception("ClientApp task failed")
        details = f"{type(e).__name__}: {e}"
        if message is not None:
            error = Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details)
            reply = Message(error, reply_to=message)
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
        finally:
            push_task_output(client, context, status, details)
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()


def serve(address: str, *, alive: Callable[[], bool] = lambda: True, poll: float = POLL) -> None:
    """Claim and answer the ClientApp tasks of the SuperNode whose Runtime API listens on
    ``address``, one after another, while ``alive()``."""
    from fedseg.engine.flower.client_app import app

    acquire = _client(address, RuntimeVersionHttpInterceptor(component_name="SuperExec"))
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    try:
        with quick_pulls(run_clientapp, "pull_and_inflate_object_from_tree", *PULL_BACKOFF):
            while alive():
                try:
                    res = acquire.AcquireTask(request)
                except httpx.TransportError:  # the SuperNode is (re)starting its Runtime API
                    time.sleep(0.5)
                    continue
                if not (res.HasField("task") and res.token):
                    time.sleep(poll)
                    continue
                try:
                    answer_task(address, res.token, app)
                except Exception:  # the reply could not be delivered: no reply is recorded
                    log.exception("could not deliver the reply of task %d", res.task.task_id)
    finally:
        acquire.close()


def run_site(supernode_argv: Sequence[str], address: str) -> int:
    """Start ``supernode_argv`` (a ``flower-supernode`` command whose Runtime API listens on
    ``address``) in process isolation mode as a child and serve it until it exits; SIGTERM
    stops both. Returns the SuperNode's exit code."""
    node = subprocess.Popen([*supernode_argv, "--isolation", "process"])

    def stop(*_: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    try:
        serve(address, alive=lambda: node.poll() is None)
    finally:
        if node.poll() is None:
            node.terminate()
            try:
                node.wait(timeout=10)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
    return node.returncode


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m fedseg.engine.flower.executor --runtime-api-address HOST:PORT --
    flower-supernode ARGS...`` (the Runtime API on loopback, without TLS)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime-api-address", required=True)
    ap.add_argument("supernode", nargs=argparse.REMAINDER, help="-- flower-supernode ARGS")
    args = ap.parse_args(argv)
    command = args.supernode[1:] if args.supernode[:1] == ["--"] else args.supernode
    if not command:
        ap.error("give the SuperNode command after --")
    sys.exit(run_site(command, args.runtime_api_address))


if __name__ == "__main__":
    main()
