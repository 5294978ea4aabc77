"""The rules: games, the policy net and the AlphaStar league, pure and Ray-free.

This package sits between the store and everything that runs on Ray::

    policystore/trainer/     the driver: league actor, learner shards, live display, report (imports all below)
    policystore/workers/     thin rollout clients: play matches with views from the store (imports league, policystore)
    policystore/league/      this package: Connect Four and other games, scripted players, the policy net, GAE, PFSP,
                 payoff, Elo and the league's matchmaking (imports numpy, torch, gymnasium; never Ray)
    policystore/ the per-node snapshot store (imports none of the above)

Everything here is a plain function or class, so every rule is unit-tested without starting Ray; the trainer
runs the league inside a Ray actor and the workers play its games. ``tests/test_layers.py`` keeps the arrows
pointing down.
"""
