"""Request routing by cache affinity, admission control and autoscaling policy."""
