"""Run the application on a local (or already running) Ray cluster, with the HTTP API where configured."""
import logging
import signal
import threading

import ray
from ray import serve

from cluster.app import build_app
from cluster.auth import KeyRing, check_exposure, load_api_keys
from cluster.config import ServeConfig, config_to_dict

APP_NAME = "blendserve"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_log = logging.getLogger(__name__)


def run_server(config: ServeConfig, blocking: bool = True) -> None:
    """Deploy the app behind Serve's HTTP proxy; when blocking, serve until SIGTERM or SIGINT, then drain."""
    # Before anything starts: an open API on an address other machines reach is refused (AuthConfigError).
    check_exposure(config.server, KeyRing(load_api_keys(config.server)))
    if not ray.is_initialized():
        # Joins the cluster named by RAY_ADDRESS when there is one, else starts a local one.
        ray.init(include_dashboard=False)
    serve.start(http_options={"host": config.server.host, "port": config.server.port})
    serve.run(build_app(config_to_dict(config)), name=APP_NAME, route_prefix="/", blocking=False)
    if blocking:
        wait_for_stop_signal()
        drain()


def wait_for_stop_signal() -> int:
    """Block until SIGTERM (what Kubernetes sends) or SIGINT arrives; returns which."""
    # Ray's driver handler for SIGTERM exits mid-call with a traceback; this one only records the signal.
    received: list[int] = []
    stop = threading.Event()

    def record(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()

    previous = {signum: signal.signal(signum, record) for signum in STOP_SIGNALS}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    _log.info("blendserve: %s received; draining", signal.Signals(received[0]).name)
    return received[0]


def drain() -> None:
    """Stop Serve gracefully (replicas finish the requests they hold, up to their shutdown timeout), then Ray."""
    serve.shutdown()
    ray.shutdown()
    _log.info("blendserve: drained and stopped")
