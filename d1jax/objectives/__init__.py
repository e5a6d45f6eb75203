"""What is optimised: log-prob estimators, losses and advantages."""
