-- wrk script of scripts/bench. Environment:
--   BENCH_MODE   static | fresh (a new Idempotency-Key per request) | pool (keys from BENCH_KEYS)
--   BENCH_RATE   total requests/s to pace at (0: closed loop); BENCH_COUNT: stop after N (one thread)
--   BENCH_BODY, BENCH_AUTH (agent key), BENCH_TAG (key prefix), BENCH_OUT (result JSON)
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
int getpid(void);
int kill(int pid, int sig);
]]
local ts = ffi.new("bench_timespec")
local function now_ms()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end

local mode = os.getenv("BENCH_MODE") or "static"
local threads_n = tonumber(os.getenv("BENCH_THREADS") or "1")
local rate = tonumber(os.getenv("BENCH_RATE") or "0")
local count = tonumber(os.getenv("BENCH_COUNT") or "0")
local body = os.getenv("BENCH_BODY") or ""
local auth = os.getenv("BENCH_AUTH") or ""

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
if auth ~= "" then wrk.headers["Authorization"] = "Bearer " .. auth end

local threads = {}
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local keys, n, tag = {}, 0, ""
function init(args)
  tag = (os.getenv("BENCH_TAG") or "k") .. "-" .. tostring(id)
  if mode == "pool" then
    for line in io.lines(os.getenv("BENCH_KEYS")) do keys[#keys + 1] = line end
    math.randomseed(1000 + id)
  end
  if mode == "static" and os.getenv("BENCH_KEY") then
    wrk.headers["Idempotency-Key"] = os.getenv("BENCH_KEY")
  end
end

if mode ~= "static" then
  function request()
    n = n + 1
    local key
    if mode == "fresh" then
      key = string.format("bench-%s-%08d", tag, n)
    else
      key = keys[math.random(#keys)]
    end
    wrk.headers["Idempotency-Key"] = key
    return wrk.format(nil, nil, nil, body)
  end
end

if rate > 0 then
  -- Open-loop pacing per thread: every request gets the next slot of a fixed schedule.
  local interval = 1000 / (rate / threads_n)
  local next_slot = nil
  function delay()
    local t = now_ms()
    if next_slot == nil or next_slot < t - 1000 then next_slot = t end
    local slot = next_slot
    next_slot = next_slot + interval
    local d = slot - t
    if d < 0 then return 0 end
    return math.floor(d)
  end
end

if count > 0 then
  local seen = 0
  function response(status, headers, resp_body)
    seen = seen + 1
    if seen >= count then
      wrk.thread:stop()
      ffi.C.kill(ffi.C.getpid(), 2) -- SIGINT: wrk stops waiting for -d and reports
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local f = io.open(os.getenv("BENCH_OUT"), "w")
  f:write(string.format(
    '{"requests":%d,"duration_us":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},' ..
    '"latency_us":{"p50":%d,"p90":%d,"p99":%d,"p999":%d,"max":%d,"mean":%.1f}}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.max, latency.mean))
  f:close()
end
