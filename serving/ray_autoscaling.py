"""Ray Serve's autoscaling for replicas that share a port: their own requests counted.

Ray's autoscaler sizes a deployment by the requests Ray sees: those its ingress and handles
route, queued or running at a replica. A client of the shared port (:mod:`serving.shared_port`)
reaches a replica with no Ray component on its way, so Ray's count misses it, and a deployment
under load on the shared port alone would stay at ``min_replicas``. So each replica reports its
shared port's requests in flight as a custom autoscaling metric (:data:`SHARED_PORT_ONGOING`,
from ``ServerReplica.record_autoscaling_stats``; Ray samples it as it samples its own count and
averages it over ``look_back_period_s``), and :func:`shared_port_policy` adds them to Ray's count
before it does what Ray's default policy does::

    desired replicas = (requests Ray routes + requests on the shared port) / target_ongoing_requests

Ray then applies the deployment's ``upscaling_factor`` / ``downscaling_factor``,
``upscale_delay_s`` / ``downscale_delay_s`` and ``min_replicas`` / ``max_replicas`` to that number,
as it does to its default policy's. ``serving.ray_deployment.build`` names this policy when it is
given both ``shared_port`` and ``max_replicas``; in a Serve config file::

    autoscaling_config:
      max_replicas: 4
      target_ongoing_requests: 32
      policy:
        policy_function: serving.ray_autoscaling:shared_port_policy

A replica that scale-down stops closes its socket. Linux resets the connections still waiting
in a closing socket's accept queue unless ``net.ipv4.tcp_migrate_req`` is 1 (Linux 5.14 and
later; it moves them to another socket of the port), so set it on every node that autoscales a
shared port (:func:`serving.shared_port.migrates_queued_connections`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["POLICY", "SHARED_PORT_ONGOING", "shared_port_policy"]

#: The custom autoscaling metric: one replica's requests in flight on the shared port.
SHARED_PORT_ONGOING = "shared_port_ongoing_requests"

#: The policy's import path, as a Serve config names it.
POLICY = "serving.ray_autoscaling:shared_port_policy"


def shared_port_policy(ctx: Any) -> tuple[float, dict[str, Any]]:
    """Replicas wanted for Ray's requests and the shared port's together.

    Parameters
    ----------
    ctx : ray.serve.config.AutoscalingContext
        What Ray's controller knows of the deployment: ``total_num_requests`` (the requests it
        routes, averaged over the look-back period), ``aggregated_metrics`` (each running
        replica's averaged custom metrics), ``config.target_ongoing_requests``.

    Returns
    -------
    replicas : float
        ``(Ray's requests + the shared port's) / target_ongoing_requests``; Ray rounds it up and
        applies the scaling factors, delays and bounds.
    state : dict
        No state of its own.
    """
    if ctx.current_num_replicas == 0:  # (Ray starts a replica on the first request it sees)
        return ctx.target_num_replicas, {}
    shared = (ctx.aggregated_metrics or {}).get(SHARED_PORT_ONGOING, {})
    total = ctx.total_num_requests + sum(shared.values())
    return total / ctx.config.get_target_ongoing_requests(), {}
