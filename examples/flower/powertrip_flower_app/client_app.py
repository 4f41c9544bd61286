"""The ClientApp: one emulated datacenter per Flower node.

It answers two kinds of message: ``train`` (local epochs on its MNIST-1D partition with the
local optimizer recipe the server put in the config, ``recipe_from_config``, plain SGD when
there is none; the reply carries the new weights and ``num-examples`` for FedAvg; the node's
optimizer state stays in its ``context.state`` between rounds) and PowerTrip's property query (its
site's power fraction, RTT and bandwidth: ``register_property_query``). A real deployment
would read those three from the SuperNode's ``--node-config``; here node ``partition-id`` i
reports site i of the seeded ``generate_sites`` draw, the same sites the server's report uses.
The task comes from the run config and the node's ``num-partitions`` (the federation's size).
"""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from powertrip.integrations.flower import (
    recipe_from_config,
    register_property_query,
    site_properties,
)
from powertrip.learning.site_optim import SiteState
from powertrip_flower_app.task import TaskConfig, sites, task_config, train_node

STEPS, MOMENTS = "optimizer-steps", "optimizer-moments"  # the node's state between rounds


def load_state(context: Context) -> SiteState | None:
    """The node's local optimizer state from its earlier rounds (None: none yet)."""
    if STEPS not in context.state:
        return None
    steps, moments = context.state[STEPS], context.state[MOMENTS].to_torch_state_dict()
    by_name: dict[str, dict] = {}
    for key, t in moments.items():
        kind, name = key.split("/", 1)
        by_name.setdefault(name, {})[kind] = t
    return SiteState(int(steps["step"]), by_name, int(steps["moment-step"]))


def save_state(context: Context, state: SiteState) -> None:
    """Keep the node's state in ``context.state``, which Flower keeps for the node."""
    moment_step = state.step if state.moment_step is None else state.moment_step
    context.state[STEPS] = ConfigRecord({"step": state.step, "moment-step": moment_step})
    flat = {f"{k}/{n}": t for n, kinds in state.moments.items() for k, t in kinds.items()}
    context.state[MOMENTS] = ArrayRecord(flat)


def node_task(context: Context) -> tuple[TaskConfig, int]:
    """The run's task and this node's partition (= site) index."""
    nodes = int(context.node_config["num-partitions"])
    wanted = int(context.run_config["num-nodes"])
    if nodes != wanted:
        raise ValueError(
            f"the federation has {nodes} nodes and the run config's num-nodes is {wanted}: "
            f'run with --federation-config "num-supernodes={wanted}" (or set num-nodes={nodes})'
        )
    return task_config(context.run_config, nodes), int(context.node_config["partition-id"])


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    cfg, node = node_task(context)
    params = msg.content["arrays"].to_torch_state_dict()
    config = msg.content["config"]
    recipe = recipe_from_config(config)  # None: plain SGD at the task's lr
    state = load_state(context) if recipe is not None else None
    server_round = int(config["server-round"])
    new, samples, loss, state = train_node(cfg, node, server_round, params, recipe, state)
    if state is not None:
        save_state(context, state)
    content = RecordDict(
        {
            "arrays": ArrayRecord(new),
            "metrics": MetricRecord({"num-examples": samples, "train-loss": loss}),
        }
    )
    return Message(content=content, reply_to=msg)


def properties(context: Context, now_s: float) -> dict[str, Any]:
    """This node's site at the server's emulated time (PowerTrip's property query)."""
    cfg, node = node_task(context)
    return {"partition-id": node, **site_properties(sites(cfg), node, now_s)}


register_property_query(app, properties)
