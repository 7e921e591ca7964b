"""localplane: the embedded trainer platform (trainer-api.md), with real trainer
processes, real checkpoints and the real ways hosted platforms fail."""
