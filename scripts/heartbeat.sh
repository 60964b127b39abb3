# Sourced by the set-up scripts: `heartbeat_run WHAT COMMAND...` runs COMMAND and, while it runs, writes
# "HH:MM:SS setup: still WHAT: N s" on stderr every MIRRORBERT_PROGRESS_INTERVAL seconds (default 30), so a
# quiet install (pip -q, uv) is never a silent minute on a terminal or in a log. Returns COMMAND's status.
heartbeat_run() {
  local what="$1"
  shift
  local interval="${MIRRORBERT_PROGRESS_INTERVAL:-30}" started
  started="$(date +%s)"
  echo "$(date +%H:%M:%S) setup: $what" >&2
  ( while sleep "$interval" >/dev/null 2>&1; do  # the sleep holds no pipe open after the kill below
      echo "$(date +%H:%M:%S) setup: still $what: $(( $(date +%s) - started )) s" >&2
    done ) &
  local beat=$! status=0
  "$@" || status=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$status"
}
