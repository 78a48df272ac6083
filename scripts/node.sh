# Sourced by the scripts that install pinned npm packages or run a node service in the
# background (scripts/solana-chain, scripts/solana-official, scripts/solana-interop,
# scripts/interop, scripts/agent-clients-test). Callers define `log`.

# npm_ci_pinned DIR STAMP [NPM-CI-ARGS…]: `npm ci` in DIR when its node_modules is missing or
# was installed from another package.json / package-lock.json (recorded in
# DIR/node_modules/STAMP). One install at a time per DIR (flock): tests start several
# services at once from a fresh checkout, and parallel installs into one node_modules fail.
npm_ci_pinned() {
  local dir="$1" stamp="$1/node_modules/$2" want
  shift 2
  exec 9>"$dir/.npm-ci.lock"
  flock 9
  want="$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "npm ci in $dir (pinned by its package-lock.json)"
    (cd "$dir" && npm ci "$@" --no-audit --no-fund --loglevel=error >&2)
    printf '%s\n' "$want" >"$stamp"
  fi
  exec 9>&-
}

# wait_for_line FILE SED-EXPR SECONDS PID: waits up to SECONDS for a line of FILE matching
# SED-EXPR while PID runs; prints the match.
wait_for_line() {
  local file="$1" expr="$2" seconds="$3" pid="$4" value=""
  local tries=$((seconds * 10))
  while [ "$tries" -gt 0 ]; do
    value="$(sed -n "$expr" "$file" 2>/dev/null | head -n 1)"
    if [ -n "$value" ]; then
      printf '%s\n' "$value"
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
    tries=$((tries - 1))
  done
  return 1
}

# recorded_pid STATEFILE: the "pid" a state file records.
recorded_pid() {
  sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p' "$1" | head -n 1
}

# json_field JSON NAME: the string value of NAME in the one-line JSON.
json_field() {
  printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"\\([^\"]*\\)\".*/\\1/p"
}

# stop_recorded STATEFILE MARKER NAME: stops the process STATEFILE records if its command
# line still contains MARKER (a recycled pid is left alone): TERM, then KILL after 5 s; then
# removes STATEFILE.
stop_recorded() {
  local state="$1" marker="$2" name="$3" pid
  if [ ! -f "$state" ]; then
    log "no state file at $state; nothing to stop"
    return 0
  fi
  pid="$(recorded_pid "$state")"
  if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then
    log "$name (pid ${pid:-none}) is not running"
  elif [ -r "/proc/$pid/cmdline" ] && ! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$marker"; then
    log "pid $pid is no longer the $name; leaving it alone"
  else
    kill -TERM "$pid" 2>/dev/null || true
    local stopped=0
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || { stopped=1; break; }
      sleep 0.1
    done
    if [ "$stopped" = 1 ]; then
      log "stopped $name (pid $pid)"
    else
      kill -KILL "$pid" 2>/dev/null || true
      log "killed $name (pid $pid) after 5 s"
    fi
  fi
  rm -f "$state"
}
