"""Rollout clients: thin Ray actors that play league matches with policies read from the node's store.

They import only the rules (``league``) and the store (``policystore``), never the trainer: anything that hands
them a league actor and learner handles can drive them.
"""

from policystore.extras import needs

with needs("trainer", "policystore.workers"):
    import gymnasium  # noqa: F401  (the league's games)
