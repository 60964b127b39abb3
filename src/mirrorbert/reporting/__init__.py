"""What a run tells its user: progress bars, time per phase, metric logging and library versions, score formatting."""
