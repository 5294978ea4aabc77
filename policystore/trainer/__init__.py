"""The standalone league trainer: ``python -m policystore.trainer``; ``load_policy(run_dir)`` plays a trained agent."""

from policystore.extras import needs

with needs("trainer", "policystore.trainer"):
    import gymnasium  # noqa: F401  (the league's games)
    import matplotlib  # noqa: F401  (the report's figures)

from policystore.trainer.policy import load_policy  # noqa: E402

__all__ = ["load_policy"]
