"""What a run tells its user: progress bars, the heartbeat (a line at least every 30 s, whatever a command is
doing), time per phase, metric logging and library versions, score formatting."""
