# Sourced by scripts/test, scripts/run and scripts/bench: makes Postgres and Redis
# available on 127.0.0.1. A server already listening (as on the CI machine) is used as
# it is; otherwise a private one is started from the system's binaries (installing
# Debian's packages when they are absent) with its data under .run/, and stopped by
# `services_stop` (call it from an EXIT trap).
#
# Exports TEST_DATABASE_URL / TEST_REDIS_URL (admin URLs) for the callers.

services_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
services_run="$services_root/.run"
services_started=()

svc_log() { printf '[services] %s\n' "$*" >&2; }

# The debug binaries the scripts start (x402-router, x402-test-upstream), built with the
# feature set that `cargo test --all-targets` resolves: naming the examples, which need the
# dev-dependencies, makes cargo unify their features, so after scripts/test's "cargo test"
# phase this is a no-op instead of a rebuild of tokio and everything above it with other
# features (about 100 s on 2 cores).
build_debug_bins() {
  (cd "$services_root" && cargo build --locked --quiet --bin x402-router --bin x402-test-upstream --examples >&2)
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  svc_log "installing Debian packages: $*"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq >&2
  as_root apt-get install -y -qq --no-install-recommends "$@" >&2
}

pg_bindir() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

ensure_postgres() {
  local port="${PGPORT_WANTED:-5432}"
  export TEST_DATABASE_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:$port/postgres}"
  # The server binaries are needed even next to a running server: the TLS tests start
  # TLS-only servers of their own (as the postgres user when run as root).
  local bin; bin="$(pg_bindir || true)"
  if [ -z "$bin" ]; then apt_install postgresql; bin="$(pg_bindir)"; fi
  export PG_BIN_DIR="${PG_BIN_DIR:-$bin}"
  mkdir -p "$services_run"
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home "$services_run" postgres
  fi
  if listening "$port"; then
    svc_log "using the Postgres already listening on 127.0.0.1:$port"
    return 0
  fi
  local data="$services_run/pg"
  # initdb refuses to run as root: run the private server as the postgres user.
  local runas=()
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres "$services_run"
    runas=(runuser -u postgres --)
  fi
  if [ ! -f "$data/PG_VERSION" ]; then
    svc_log "initialising a private Postgres in $data"
    "${runas[@]}" "$bin/initdb" -D "$data" -U postgres --auth=trust >/dev/null
  fi
  svc_log "starting a private Postgres on 127.0.0.1:$port"
  "${runas[@]}" "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w \
    -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off" start >/dev/null
  services_started+=("pg:$bin:$data")
}

ensure_redis() {
  local port="${REDIS_PORT_WANTED:-6379}"
  export TEST_REDIS_URL="${TEST_REDIS_URL:-redis://127.0.0.1:$port}"
  # redis-server with TLS support and redis-cli (cluster creation) for the deployment tests.
  { command -v redis-server && command -v redis-cli; } >/dev/null 2>&1 || apt_install redis-server redis-tools
  if listening "$port"; then
    svc_log "using the Redis already listening on 127.0.0.1:$port"
    return 0
  fi
  mkdir -p "$services_run"
  svc_log "starting a private Redis on 127.0.0.1:$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
    --pidfile "$services_run/redis.pid" --logfile "$services_run/redis.log" --dir "$services_run"
  for _ in $(seq 50); do listening "$port" && break; sleep 0.1; done
  services_started+=("redis:$services_run/redis.pid")
}

services_stop() {
  local s
  for s in "${services_started[@]}"; do
    case "$s" in
      pg:*)
        IFS=: read -r _ bin data <<<"$s"
        local runas=(); [ "$(id -u)" -eq 0 ] && runas=(runuser -u postgres --)
        "${runas[@]}" "$bin/pg_ctl" -D "$data" -m fast stop >/dev/null 2>&1 || true
        ;;
      redis:*)
        local pidfile="${s#redis:}"
        [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
        ;;
    esac
  done
  services_started=()
}
