"""Run the application on a local (or already running) Ray cluster, with the HTTP API where configured."""
import ray
from ray import serve

from cluster.app import build_app
from cluster.config import ServeConfig, config_to_dict

APP_NAME = "blendserve"


def run_server(config: ServeConfig, blocking: bool = True) -> None:
    """Start Serve's HTTP proxy on the configured host and port and deploy the app (blocks when asked)."""
    if not ray.is_initialized():
        # Joins the cluster named by RAY_ADDRESS when there is one, else starts a local one.
        ray.init(include_dashboard=False)
    serve.start(http_options={"host": config.server.host, "port": config.server.port})
    serve.run(build_app(config_to_dict(config)), name=APP_NAME, route_prefix="/", blocking=blocking)
