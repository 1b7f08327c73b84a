"""``flows.worker_watch.cluster_workers``: the scheduler's worker list as it is now, on an
in-process cluster (no sockets to other processes, about a second)."""

from __future__ import annotations

import dask
from distributed import Client, LocalCluster

from flows.worker_watch import cluster_workers


def test_the_worker_list_holds_the_worker_whatever_the_clients_refresh_does() -> None:
    """``Client.scheduler_info()`` returned the client's cache, which its own refresh
    replaces with an identity listing no worker: 9 of 300 looks read an empty cluster
    here with the refresh every 5 ms, and the run warned "no workers left" while its only
    worker ran a chunk."""
    refresh = {"distributed.client.scheduler-info-interval": "5ms"}
    with (
        dask.config.set(refresh),
        LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        looks = [cluster_workers(client) for _ in range(300)]
        address = cluster.workers[0].address
    assert all(look is not None and list(look) == [address] for look in looks)


def test_a_closed_client_gives_no_answer_not_an_empty_cluster() -> None:
    with (
        LocalCluster(n_workers=1, processes=False, dashboard_address="127.0.0.1:0") as cluster,
        Client(cluster) as client,
    ):
        assert cluster_workers(client)
        client.close()
        assert cluster_workers(client) is None
