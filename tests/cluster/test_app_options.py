"""The worker deployment's options follow the configuration: fixed replicas or Serve autoscaling."""
from cluster.app import worker_options
from cluster.config import config_from_dict


def test_fixed_replicas_and_resources():
    options = worker_options(config_from_dict({"workers": {"num_replicas": 3, "num_cpus": 2, "num_gpus": 0.5}}))
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0.5}
    assert options["max_ongoing_requests"] == 17  # admission's default bound of 16, plus one


def test_autoscaling_replaces_the_fixed_count():
    config = config_from_dict(
        {"autoscaling": {"min_replicas": 1, "max_replicas": 4}, "admission": {"max_queued_per_worker": 4}}
    )
    options = worker_options(config)
    assert "num_replicas" not in options
    assert options["autoscaling_config"]["min_replicas"] == 1 and options["autoscaling_config"]["max_replicas"] == 4
    assert options["max_ongoing_requests"] == 5


def test_autoscaling_starts_from_the_configured_count_under_the_blendserve_policy():
    config = config_from_dict({"autoscaling": {"min_replicas": 1, "max_replicas": 4}, "workers": {"num_replicas": 2}})
    autoscaling = worker_options(config)["autoscaling_config"]
    assert autoscaling["initial_replicas"] == 2
    assert autoscaling["policy"]["policy_function"] == "scheduler.serve_policy:ServeAutoscalingPolicy"
