"""Run the application on a local (or already running) Ray cluster, with the HTTP API where configured."""
import logging
import signal
import threading
import time

import ray
from ray import serve

from cluster.api.auth import KeyRing, check_exposure, load_api_keys
from cluster.app import build_app
from cluster.config import ServeConfig, config_to_dict

APP_NAME = "blendserve"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DRAIN_POLL_S = 0.5

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
        drain(config.server.drain_timeout_s)


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


def drain(timeout_s: float) -> None:
    """Refuse new requests, let those in flight finish (up to `timeout_s`), then stop Serve and Ray."""
    # Serve's own shutdown does not wait for a response still streaming through its proxy: the ingress
    # counts its requests in flight, and Serve stops only once they are done.
    ingress = serve.get_app_handle(APP_NAME)
    in_flight = ingress.drain.remote().result()
    deadline_s = time.monotonic() + timeout_s
    while in_flight and time.monotonic() < deadline_s:
        time.sleep(DRAIN_POLL_S)
        in_flight = ingress.in_flight.remote().result()
    if in_flight:
        _log.warning("blendserve: %d requests still in flight after %.0f s; stopping anyway", in_flight, timeout_s)
    serve.shutdown()
    ray.shutdown()
    _log.info("blendserve: drained and stopped")
