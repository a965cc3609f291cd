"""moejax: MoE serving with host-resident experts and a policy-driven device expert cache."""

__version__ = "0.1.0"
