"""The standalone league trainer: ``python -m trainer``; ``trainer.load_policy(run_dir)`` plays a trained agent."""

from trainer.policy import load_policy

__all__ = ["load_policy"]
