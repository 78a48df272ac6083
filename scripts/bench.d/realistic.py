"""Records and reports the runs of scripts/bench --paid-realistic (scripts/bench.d/paid-realistic).

  realistic.py record RUNS.jsonl CHAIN CLIENT CONC ROUND OUT.json BEFORE AFTER LOAD1
  realistic.py final RUNS.jsonl META.json RESULTS_DIR

BEFORE/AFTER are snapshot prefixes: BEFORE.proxy (the delay proxy's counters, JSON) and
BEFORE.metrics (the router's /metrics text).
"""
import json
import math
import os
import re
import statistics
import sys

CLIENT_LABELS = {
    "official": "official @x402/fetch, direct (probe, pay)",
    "minimal": "minimal Rust client, direct (probe, pay)",
    "minimal-ahead": "minimal Rust client, terms known (pays at once)",
    "router-unknown": "router, terms unknown (probe, pay)",
    "router-known": "router, terms known (pays at once)",
}
CHAIN_LABELS = {"instant": "anvil, instant mining", "block1s": "anvil --block-time 1"}


def metrics_counts(path):
    """{(histogram, label): count} of the router's x402_router_{rpc,upstream}_seconds."""
    out = {}
    for line in open(path):
        m = re.match(r'^x402_router_(rpc|upstream)_seconds_count\{\w+="([^"]*)"\} (\S+)$', line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out


def record(args):
    (runs, chain, client, conc, rnd, out, before, after, load1) = args
    result = json.loads(open(out).read().strip().splitlines()[-1])
    pa, pb = json.load(open(before + ".proxy")), json.load(open(after + ".proxy"))
    ma, mb = metrics_counts(before + ".metrics"), metrics_counts(after + ".metrics")

    def delta(side, field):
        return pb[side][field] - pa[side][field]

    methods = {k: v - pa["rpc"]["methods"].get(k, 0) for k, v in pb["rpc"]["methods"].items()}
    router_counts = {f"{kind}:{label}": int(v - ma.get((kind, label), 0)) for (kind, label), v in mb.items()}
    r = {
        "chain": chain, "client": client, "concurrency": int(conc), "round": int(rnd),
        "ok": result["ok"], "errors": result["errors"],
        "first_error": result.get("first_error"), "duration_s": result["duration_s"],
        "latencies_us": result["latencies_us"],
        "upstream_http_requests": delta("upstream", "http_requests"),
        "upstream_connections": delta("upstream", "connections"),
        "rpc_http_requests": delta("rpc", "http_requests"),
        "rpc_jsonrpc_calls": delta("rpc", "jsonrpc_calls"),
        "rpc_methods": {k: v for k, v in methods.items() if v},
        "router_metrics": {k: v for k, v in router_counts.items() if v},
        "load1": float(load1),
    }
    with open(runs, "a") as f:
        f.write(json.dumps(r) + "\n")
    lat = sorted(r["latencies_us"])
    print(f"  {chain:<8} {client:<15} c={conc:<3} round {rnd}: {r['ok']} ok, {r['errors']} errors, "
          f"p50 {pct(lat, 50) / 1000:8.1f} ms, {r['ok'] / r['duration_s'] if r['duration_s'] else 0:6.1f} calls/s",
          file=sys.stderr)


def pct(sorted_values, p):
    """The same percentile as the clients: the value of rank ceil(p% of n)."""
    if not sorted_values:
        return 0
    rank = math.ceil(p / 100 * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


def aggregate(rs):
    lat = sorted(x for r in rs for x in r["latencies_us"])
    calls = sum(r["ok"] + r["errors"] for r in rs)
    ok = sum(r["ok"] for r in rs)
    secs = sum(r["duration_s"] for r in rs)
    per_call = lambda total: round(total / calls, 2) if calls else None
    methods, metrics = {}, {}
    for r in rs:
        for k, v in r["rpc_methods"].items():
            methods[k] = methods.get(k, 0) + v
        for k, v in r["router_metrics"].items():
            metrics[k] = metrics.get(k, 0) + v
    rpc_reads = sum(v for k, v in metrics.items() if k.startswith("rpc:"))
    return {
        "rounds": len(rs), "calls": ok, "errors": sum(r["errors"] for r in rs),
        "first_error": next((r["first_error"] for r in rs if r["first_error"]), None),
        "p50_ms": round(pct(lat, 50) / 1000, 2), "p99_ms": round(pct(lat, 99) / 1000, 2),
        "max_ms": round(lat[-1] / 1000, 2) if lat else 0,
        "calls_per_s": round(ok / secs, 2) if secs else 0,
        "round_p50_ms": [round(pct(sorted(r["latencies_us"]), 50) / 1000, 2) for r in rs],
        "per_call": {
            "upstream_http_requests": per_call(sum(r["upstream_http_requests"] for r in rs)),
            "upstream_new_connections": per_call(sum(r["upstream_connections"] for r in rs)),
            "rpc_jsonrpc_calls": per_call(sum(r["rpc_jsonrpc_calls"] for r in rs)),
            "rpc_http_requests": per_call(sum(r["rpc_http_requests"] for r in rs)),
            "rpc_methods": {k: per_call(v) for k, v in sorted(methods.items())},
            "router_rpc_reads": per_call(rpc_reads),
            "router_metrics": {k: per_call(v) for k, v in sorted(metrics.items())},
        },
        "load1_median": statistics.median(r["load1"] for r in rs),
    }


def final(args):
    runs_path, meta_path, out_dir = args
    meta = json.load(open(meta_path))
    raw = [json.loads(line) for line in open(runs_path)]
    groups = {}
    for r in raw:
        groups.setdefault((r["chain"], r["concurrency"], r["client"]), []).append(r)
    table = []
    for (chain, conc, client), rs in groups.items():
        row = {"chain": chain, "concurrency": conc, "client": client, "label": CLIENT_LABELS[client]}
        row.update(aggregate(rs))
        table.append(row)
    order = {c: i for i, c in enumerate(CLIENT_LABELS)}
    chains = {c: i for i, c in enumerate(CHAIN_LABELS)}
    table.sort(key=lambda r: (chains.get(r["chain"], 9), r["concurrency"], order[r["client"]]))
    at = {(r["chain"], r["concurrency"], r["client"]): r for r in table}

    targets = []
    for chain in CHAIN_LABELS:
        for conc in (1, 16):
            get = lambda c: at.get((chain, conc, c))
            official, minimal, ahead = get("official"), get("minimal"), get("minimal-ahead")
            unknown, known = get("router-unknown"), get("router-known")
            info = "" if chain == "instant" else "(info: the block time dominates) "
            where = f"{CHAIN_LABELS[chain]}, c={conc}"

            def ratio(name, a, b, limit):
                if a and b and b["p50_ms"]:
                    v = round(a["p50_ms"] / b["p50_ms"], 3)
                    targets.append({"target": f"{info}{name}", "where": where, "value": v, "limit": limit,
                                    "unit": "×", "met": v <= limit})

            def added(name, a, b, limit):
                if a and b:
                    v = round(a["p50_ms"] - b["p50_ms"], 2)
                    targets.append({"target": f"{info}{name}", "where": where, "value": v, "limit": limit,
                                    "unit": "ms", "met": v <= limit})

            ratio("router p50, terms known ≤ 0.8× official client", known, official, 0.8)
            ratio("router p50, terms unknown ≤ 1.0× official client", unknown, official, 1.0)
            added("router p50, terms unknown ≤ minimal client (probe, pay) + 5 ms", unknown, minimal, 5.0)
            added("router p50, terms known ≤ minimal client (terms known) + 5 ms", known, ahead, 5.0)

    result = {"meta": meta, "table": table, "targets": targets, "raw_runs": raw}
    os.makedirs(out_dir, exist_ok=True)
    for name in (f"{meta['started_at']}-paid-realistic.json", "paid-realistic-latest.json"):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")

    s = meta["settings"]
    print()
    print(f"x402-router paid calls over a delayed network ({meta['mode']}, {meta['started_at']}, "
          f"{s['delay_ms_one_way']} ms one way = {2 * s['delay_ms_one_way']} ms RTT to the upstream and to the "
          f"router's RPC; {meta['machine']['nproc']} cores, load {meta['load_before']} → {meta['load_after']})")
    print()
    print("| chain | client | c | calls | p50 ms | p99 ms | calls/s | upstream requests (new connections) / call | "
          "RPC / call: JSON-RPC calls (HTTP requests) | RPC reads timed / call (router metrics) | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in table:
        pc = r["per_call"]
        router = r["client"].startswith("router")
        rpc = f"{pc['rpc_jsonrpc_calls']} ({pc['rpc_http_requests']})" if router else "-"
        reads = f"{pc['router_rpc_reads']}" if router else "-"
        print(f"| {CHAIN_LABELS[r['chain']]} | {r['label']} | {r['concurrency']} | {r['calls']} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['calls_per_s']:.1f} | {pc['upstream_http_requests']} ({pc['upstream_new_connections']}) | {rpc} | {reads} | {r['errors']} |")
    methods = {}
    for r in table:
        if r["client"].startswith("router"):
            methods[(r["chain"], r["concurrency"], r["client"])] = r["per_call"]["rpc_methods"]
    if methods:
        print()
        print("RPC methods per paid call, at the delay proxy:")
        for (chain, conc, client), m in methods.items():
            print(f"  {CHAIN_LABELS[chain]}, c={conc}, {client}: " + (", ".join(f"{k} {v}" for k, v in m.items()) or "none"))
    print()
    print("| target | where | value | limit | met |")
    print("|---|---|---:|---:|---|")
    for t in targets:
        print(f"| {t['target']} | {t['where']} | {t['value']} {t['unit']} | {t['limit']} {t['unit']} | "
              f"{'yes' if t['met'] else '**no**'} |")
    errs = sum(r["errors"] for r in table)
    print()
    print(f"errors across all runs: {errs}; results in {out_dir}/{meta['started_at']}-paid-realistic.json "
          f"(and paid-realistic-latest.json)")
    if errs:
        first = next(r["first_error"] for r in table if r["first_error"])
        print(f"first error: {first}")


if __name__ == "__main__":
    {"record": record, "final": final}[sys.argv[1]](sys.argv[2:])
