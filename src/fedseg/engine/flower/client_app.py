"""Flower ``ClientApp``: a site answers ``query.hello``, ``train`` and ``evaluate`` messages.

The handlers live in :mod:`fedseg.engine.flower.site`; this module only unwraps messages and
turns fedseg errors into Flower error replies whose reason the server logs and records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedseg.engine.flower.logs import configure_logging
from fedseg.engine.flower.secagg import is_secure, secure_train
from fedseg.engine.flower.site import handle_evaluate, handle_hello, handle_train
from fedseg.errors import FedsegError

__all__ = ["ConfigOf", "Handler", "answer", "app", "build_client_app"]

log = logging.getLogger(__name__)

Handler = Callable[[RecordDict, Mapping[str, Any], Mapping[str, Any]], RecordDict]


def answer(
    msg: Message, handler: Handler, node_config: Mapping[str, Any], run_config: Mapping[str, Any]
) -> Message:
    """The reply of ``handler`` to ``msg`` (an error reply for a fedseg error)."""
    configure_logging()
    try:
        body = handler(msg.content, node_config, run_config)
    except FedsegError as e:
        log.error("%s failed: %s", msg.metadata.message_type, e.reason)
        return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, e.reason), reply_to=msg)
    return Message(body, reply_to=msg)


ConfigOf = Callable[[Context], tuple[Mapping[str, Any], Mapping[str, Any]]]
"""A message's context -> the (node config, run config) its site answers with."""


def build_client_app(configs_of: ConfigOf) -> ClientApp:
    """A ClientApp answering ``query.hello``, ``train`` and ``evaluate`` with the site
    handlers, the site and run configs taken from each message's context by ``configs_of``."""
    client = ClientApp()

    def reply(msg: Message, context: Context, handler: Handler) -> Message:
        return answer(msg, handler, *configs_of(context))

    @client.query("hello")
    def hello(msg: Message, context: Context) -> Message:
        """Introduce this site to the server."""
        return reply(msg, context, handle_hello)

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        """One client step of the configured method (as a SecAgg+ stage under
        ``privacy.secure_aggregation``)."""
        if is_secure(msg):
            return secure_train(msg, context, handle_train, configs_of(context))
        return reply(msg, context, handle_train)

    @client.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        """Evaluate this site's model on the split the message names."""
        return reply(msg, context, handle_evaluate)

    return client


app = build_client_app(lambda context: (context.node_config, context.run_config))
