"""Starting the league's catalog and a node's store when ``connect()`` finds one missing: the one place that
loads their classes for a client, so a process that only reads (a rollout worker) never imports the store's code.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import ray
from ray._common.constants import HEAD_NODE_RESOURCE_NAME
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from . import remote
from .catalog import CatalogServer, ask_stores
from .config import StoreConfig
from .ids import SnapshotId
from .remote import catalog_name, store_name
from .server import StoreServer


def catalog(config: StoreConfig) -> ray.actor.ActorHandle:
    """The league's catalog (``config.league``), started with ``config`` as the league's settings unless it runs
    already (creation is atomic in Ray's GCS: concurrent starters get the same actor)."""
    session = ray.get_runtime_context().get_session_name()
    return remote.start(
        CatalogServer, catalog_name(config.league), config.catalog_db(session), config, watchers=config.max_watchers,
        seed=_durable_seed(config), holdings=functools.partial(ask_stores, config.league),
        options={
            "max_concurrency": 8,
            # On the head node, with the GCS, whoever starts it and wherever it restarts: on a worker node, that
            # node's loss would stall every publish and "latest" lookup until the GCS declares the node dead.
            "resources": {HEAD_NODE_RESOURCE_NAME: 0.001},
            "scheduling_strategy": "DEFAULT",  # never the caller's placement group (a Tune trial's captures its own)
        })


def store(node_id: str, config: StoreConfig) -> ray.actor.ActorHandle:
    """The league's store on ``node_id`` (pinned to it), started with ``config`` unless it runs already."""
    return remote.start(StoreServer, store_name(node_id, config.league), config, node_id,
                        watchers=config.max_watchers,
                        options={"max_concurrency": config.max_concurrency,
                                 "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)})


def _durable_seed(config: StoreConfig) -> Callable[[], tuple[list, list[str], list[SnapshotId]]] | None:
    """What a new catalog database adopts: the league committed in the durable tier (None without one)."""
    if config.durable_uri is None:
        return None
    from .durable import survey

    return functools.partial(survey, config.durable_uri)
