"""The learner-connector piece that lets PPO (and friends) train while frozen modules live only on EnvRunners.

Episodes still map agents to frozen opponents, so after ``AgentToModuleMapping`` the train batch has entries
for modules the Learner does not hold, and ``GeneralAdvantageEstimation`` fails with a KeyError on them.
Dropping those entries right after the mapping is all it takes: the Learner never trains frozen modules.
"""

from __future__ import annotations

from typing import Any

from ray.rllib.connectors.common.agent_to_module_mapping import AgentToModuleMapping
from ray.rllib.connectors.connector_pipeline_v2 import ConnectorPipelineV2
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation


class DropModulesNotOnLearner(ConnectorV2):
    """Removes batch data of module ids that the Learner's MultiRLModule does not contain."""

    def __call__(
        self, *, rl_module: Any, batch: dict[str, Any], episodes: Any, **kwargs: Any
    ) -> dict[str, Any]:
        for module_id in [mid for mid in batch if mid not in rl_module]:
            del batch[module_id]
        return batch


def install(pipeline: ConnectorPipelineV2) -> bool:
    """Put one DropModulesNotOnLearner into a learner pipeline, where the batch is first keyed by module id.

    Idempotent; returns whether a piece was added. Falls back to "before GAE", then to the end of the
    pipeline, for pipelines built without RLlib's default pieces.
    """
    kinds = [type(piece) for piece in pipeline.connectors]
    if DropModulesNotOnLearner in kinds:
        return False
    if AgentToModuleMapping in kinds:
        pipeline.insert_after(AgentToModuleMapping, DropModulesNotOnLearner())
    elif GeneralAdvantageEstimation in kinds:
        pipeline.insert_before(GeneralAdvantageEstimation, DropModulesNotOnLearner())
    else:
        pipeline.append(DropModulesNotOnLearner())
    return True
