"""The standalone league trainer: ``python -m policystore.trainer``; ``load_policy(run_dir)`` plays a trained agent."""

from policystore.trainer.policy import load_policy

__all__ = ["load_policy"]
