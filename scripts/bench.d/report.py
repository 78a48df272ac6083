import json, sys, os, math, statistics

cmd = sys.argv[1]
if cmd == "record":
    (path, name, out, url, mode, rate, conns, threads, ticks, tck, w0, w1, hwm, load1) = sys.argv[2:16]
    w = json.load(open(out))
    dur = w["duration_us"] / 1e6
    wall = float(w1) - float(w0)
    cpu_s = int(ticks) / int(tck)
    errors = sum(w["errors"].values())
    r = {
        "name": name, "url": url, "mode": mode, "target_rps": float(rate), "connections": int(conns),
        "threads": int(threads), "requests": w["requests"], "duration_s": round(dur, 3),
        "rps": round(w["requests"] / dur, 1) if dur > 0 else 0.0,
        "errors": w["errors"], "error_count": errors,
        "latency_us": w["latency_us"],
        "server_cpu_s": round(cpu_s, 3),
        "server_cpu_pct": round(100 * cpu_s / wall, 1) if wall > 0 else None,
        "server_cpu_us_per_req": round(1e6 * cpu_s / w["requests"], 1) if w["requests"] else None,
        "server_peak_rss_mib": round(int(hwm) / 1024, 1) if hwm else None,
        "load1": float(load1),
    }
    with open(path, "a") as f:
        f.write(json.dumps(r) + "\n")
    lat = r["latency_us"]
    print(f"  {name:<28} {r['rps']:>9.0f} req/s  p50 {lat['p50']/1000:7.3f} ms  p99 {lat['p99']/1000:7.3f} ms"
          f"  p99.9 {lat['p999']/1000:7.3f} ms  errors {errors:<4} cpu {r['server_cpu_pct']}%  rss {r['server_peak_rss_mib']} MiB",
          file=sys.stderr)
elif cmd == "record-paid":
    (path, name, out, conns, ticks, tck, w0, w1, hwm, load1) = sys.argv[2:12]
    w = json.loads(open(out).read().strip().splitlines()[-1])
    wall = float(w1) - float(w0)
    cpu_s = int(ticks) / int(tck)
    r = {"name": name, "url": "(direct)", "mode": "paid-client", "target_rps": 0.0,
         "connections": int(conns), "threads": 1, "requests": w["ok"], "duration_s": round(w["duration_s"], 3),
         "rps": round(w["rps"], 2), "errors": {"client": w["errors"]}, "error_count": w["errors"],
         "first_error": w.get("first_error"),
         "latency_us": {k: int(v) for k, v in w["latency_us"].items()},
         "server_cpu_s": round(cpu_s, 3), "server_cpu_pct": round(100 * cpu_s / wall, 1),
         "server_cpu_us_per_req": round(1e6 * cpu_s / w["ok"], 1) if w["ok"] else None,
         "server_peak_rss_mib": round(int(hwm) / 1024, 1) if hwm else None, "load1": float(load1)}
    with open(path, "a") as f:
        f.write(json.dumps(r) + "\n")
    lat = r["latency_us"]
    print(f"  {name:<28} {r['rps']:>9.1f} req/s  p50 {lat['p50']/1000:7.3f} ms  p99 {lat['p99']/1000:7.3f} ms"
          f"  errors {w['errors']}", file=sys.stderr)
elif cmd == "breakdown":
    # Where a paid /route spends its time, from the router's own histograms (deltas).
    import re
    def parse(path):
        out = {}
        for line in open(path):
            m = re.match(r'^(x402_router_(?:upstream|rpc)_seconds_(?:sum|count))\{(\w+)="([^"]*)"\} (\S+)$', line)
            if m:
                out[(m.group(1), m.group(3))] = float(m.group(4))
        return out
    a, b = parse(sys.argv[2]), parse(sys.argv[3])
    res = {}
    for (name, label), v in b.items():
        if not name.endswith("_count"):
            continue
        base = name[: -len("_count")]
        n = v - a.get((name, label), 0)
        if n <= 0:
            continue
        total = b.get((base + "_sum", label), 0) - a.get((base + "_sum", label), 0)
        kind = "upstream" if "upstream" in base else "rpc"
        res[f"{kind}:{label}"] = {"calls": int(n), "total_s": round(total, 4), "mean_ms": round(1000 * total / n, 3)}
    # Postgres's counters (scripts/bench `pg_counters`), per paid call.
    def counters(path):
        return {m.group(1): int(m.group(2)) for m in (re.match(r'^(pg_\w+) (\d+)$', l) for l in open(path)) if m}
    ca, cb = counters(sys.argv[2]), counters(sys.argv[3])
    calls = res.get("upstream:paid", {}).get("calls") or 0
    if calls:
        for name in ("pg_xact_commit", "pg_wal_sync", "pg_wal_records"):
            if name in ca and name in cb:
                res[f"sql:{name[3:]}"] = {"total": cb[name] - ca[name], "per_call": round((cb[name] - ca[name]) / calls, 2)}
    print(json.dumps(res))
elif cmd == "rps":
    vals = [json.loads(l)["rps"] for l in open(sys.argv[2]) if json.loads(l)["name"].split("#")[0] == sys.argv[3]]
    print(statistics.median(vals))
elif cmd == "final":
    runs_path, meta_path, out_dir = sys.argv[2:5]
    # Runs repeated over rounds ("name#1", "name#2", …) become one: the median of each
    # figure (peak RSS: the maximum; errors and requests: the sums), the rounds kept beside.
    groups = {}
    for line in open(runs_path):
        r = json.loads(line)
        groups.setdefault(r["name"].split("#")[0], []).append(r)

    def aggregate(name, rs):
        med = statistics.median
        r = dict(rs[0])
        r["name"], r["rounds"] = name, len(rs)
        if len(rs) > 1:
            r["rps"] = round(med(x["rps"] for x in rs), 1)
            r["latency_us"] = {k: med(x["latency_us"][k] for x in rs) for k in rs[0]["latency_us"]}
            for k in ("server_cpu_pct", "server_cpu_us_per_req", "load1"):
                vals = [x[k] for x in rs if x.get(k) is not None]
                r[k] = round(med(vals), 1) if vals else None
            r["server_peak_rss_mib"] = max((x["server_peak_rss_mib"] or 0) for x in rs)
            r["requests"] = sum(x["requests"] for x in rs)
            r["error_count"] = sum(x["error_count"] for x in rs)
            r["errors"] = {k: sum(x["errors"].get(k, 0) for x in rs) for k in rs[0]["errors"]}
            r["rounds_detail"] = [{"rps": x["rps"], "p50_us": x["latency_us"]["p50"], "p99_us": x["latency_us"]["p99"],
                                   "p999_us": x["latency_us"]["p999"], "load1": x.get("load1")} for x in rs]
        return r

    runs = {name: aggregate(name, rs) for name, rs in groups.items()}
    meta = json.load(open(meta_path))
    ms = lambda us: round(us / 1000, 3)

    def pair(path, router_sat, floor_sat, router_paced, floor_paced, floor_name):
        rs, fs, rp, fp = (runs.get(n) for n in (router_sat, floor_sat, router_paced, floor_paced))
        row = {"path": path, "floor": floor_name,
               "router_rps": rs["rps"], "floor_rps": fs["rps"],
               "throughput_ratio": round(rs["rps"] / fs["rps"], 3) if fs["rps"] else None,
               "paced_rps": rp["target_rps"],
               "router_latency_ms": {k: ms(rp["latency_us"][k]) for k in ("p50", "p99", "p999")},
               "floor_latency_ms": {k: ms(fp["latency_us"][k]) for k in ("p50", "p99", "p999")},
               "router_sat_latency_ms": {k: ms(rs["latency_us"][k]) for k in ("p50", "p99", "p999")},
               "floor_sat_latency_ms": {k: ms(fs["latency_us"][k]) for k in ("p50", "p99", "p999")},
               "router_cpu_pct": rs["server_cpu_pct"], "router_cpu_us_per_req": rs["server_cpu_us_per_req"],
               "router_peak_rss_mib": max(rs["server_peak_rss_mib"] or 0, rp["server_peak_rss_mib"] or 0),
               "errors": rs["error_count"] + rp["error_count"],
               "runs": [router_sat, floor_sat, router_paced, floor_paced]}
        row["p50_added_ms"] = round(row["router_latency_ms"]["p50"] - row["floor_latency_ms"]["p50"], 3)
        return row

    rows = [
        pair("replay, Redis hit", "replay-redis.sat", "floor-redis-get.sat", "replay-redis.paced", "floor-redis-get.paced", "handler + 1 Redis GET"),
        pair("replay, Redis down (Postgres)", "replay-pg.sat", "floor-pg-select.sat", "replay-pg.paced", "floor-pg-select.paced", "handler + 1 Postgres SELECT by PK"),
        pair("fresh unpaid, local upstream", "fresh.sat", "upstream-direct.sat", "fresh.paced", "upstream-direct.paced", "upstream called directly"),
    ]
    sql = pair("  (SQL round trips alone)", "fresh.sat", "floor-sql-fresh.sat", "fresh.paced", "floor-sql-fresh.paced", "the fresh call's 5 SQL statements")
    # The router's own share of a fresh call: what is left after the upstream and the SQL floor.
    rows[2]["own_p50_ms"] = round(rows[2]["router_latency_ms"]["p50"] - sql["floor_latency_ms"]["p50"]
                                  - rows[2]["floor_latency_ms"]["p50"], 3)
    light = pair("fresh unpaid, light load", "fresh.sat", "upstream-direct.sat", "fresh.light", "upstream-direct.light", "upstream called directly")
    sql_light = pair("  (SQL round trips alone, light load)", "fresh.sat", "floor-sql-fresh.sat", "fresh.light", "floor-sql-fresh.light", "the fresh call's 5 SQL statements")
    light["own_p50_ms"] = round(light["router_latency_ms"]["p50"] - sql_light["floor_latency_ms"]["p50"]
                                - light["floor_latency_ms"]["p50"], 3)
    warn = None
    if runs.get("replay-redis-warn.sat"):
        warn = pair("replay, Redis hit, RUST_LOG=warn", "replay-redis-warn.sat", "floor-redis-get.sat",
                    "replay-redis-warn.paced", "floor-redis-get.paced", "handler + 1 Redis GET")
    def paid_row(label, router_run, floor_run, floor_label):
        rp, fp = runs.get(router_run), runs.get(floor_run)
        if not (rp and fp and rp["rps"] and fp["rps"]):
            return None
        row = {"path": label, "floor": floor_label,
               "router_rps": rp["rps"], "floor_rps": fp["rps"],
               "throughput_ratio": round(rp["rps"] / fp["rps"], 3) if fp["rps"] else None,
               "paced_rps": None, "concurrency": rp["connections"], "count": rp["requests"],
               "router_latency_ms": {k: ms(rp["latency_us"][k]) for k in ("p50", "p99", "p999")},
               "floor_latency_ms": {k: ms(fp["latency_us"][k]) for k in ("p50", "p99", "p999")},
               "router_cpu_pct": rp["server_cpu_pct"], "router_cpu_us_per_req": rp["server_cpu_us_per_req"],
               "router_peak_rss_mib": rp["server_peak_rss_mib"], "errors": rp["error_count"] + fp["error_count"],
               "runs": [router_run, floor_run]}
        row["p50_added_ms"] = round(row["router_latency_ms"]["p50"] - row["floor_latency_ms"]["p50"], 3)
        row["p50_ratio"] = round(row["router_latency_ms"]["p50"] / row["floor_latency_ms"]["p50"], 3) if row["floor_latency_ms"]["p50"] else None
        return row
    # Warm: the router knows the upstream's terms (pays with the first request); cold: it
    # probes unpaid first on every call (REQUIREMENTS_CACHE_SECONDS=0).
    paid = paid_row("fresh paid, terms known (anvil, test upstream)", "paid.router", "paid.direct", "minimal client paying directly")
    if paid:
        paid["breakdown"] = meta.get("paid_breakdown")
    paid_cold = paid_row("fresh paid, terms unknown", "paid.router-cold", "paid.direct", "minimal client paying directly")
    paid_official = paid_row("fresh paid, terms known", "paid.router", "paid.official", "official @x402/fetch client paying directly")
    paid_rows = [r for r in (paid, paid_cold, paid_official) if r]

    lookups = []
    for size in meta["lookup_sizes"]:
        r, f = runs.get(f"lookup.{size}"), runs.get(f"lookup-floor.{size}")
        if not r:
            continue
        lookups.append({"rows_target": size, "rows": meta["lookup_rows"].get(str(size)),
                        "rate": r["target_rps"], "rps": r["rps"],
                        "router_latency_ms": {k: ms(r["latency_us"][k]) for k in ("p50", "p99", "p999")},
                        "floor_latency_ms": {k: ms(f["latency_us"][k]) for k in ("p50", "p99", "p999")} if f else None,
                        "router_cpu_pct": r["server_cpu_pct"], "router_peak_rss_mib": r["server_peak_rss_mib"],
                        "errors": r["error_count"]})
    for l in lookups:
        base = lookups[0]["router_latency_ms"]
        l["p99_growth"] = round(l["router_latency_ms"]["p99"] / base["p99"], 3) if base["p99"] else None
        l["p50_growth"] = round(l["router_latency_ms"]["p50"] / base["p50"], 3) if base["p50"] else None

    gc = None
    g0, g1, g2 = runs.get("gc.before"), runs.get("gc.during"), runs.get("gc.after")
    if g0 and g1:
        gc = {"expired_rows": meta["gc"]["rows"], "deleted": meta["gc"].get("deleted"),
              "gc_seconds": meta["gc"].get("seconds"), "rate": g0["target_rps"],
              "baseline_latency_ms": {k: ms(g0["latency_us"][k]) for k in ("p50", "p99", "p999")},
              "during_latency_ms": {k: ms(g1["latency_us"][k]) for k in ("p50", "p99", "p999")},
              "p99_increase_pct": round(100 * (g1["latency_us"]["p99"] / g0["latency_us"]["p99"] - 1), 1),
              "after_latency_ms": {k: ms(g2["latency_us"][k]) for k in ("p50", "p99", "p999")} if g2 else None,
              "after_p99_increase_pct": round(100 * (g2["latency_us"]["p99"] / g0["latency_us"]["p99"] - 1), 1) if g2 else None,
              "window_seconds": meta["gc"].get("window_seconds"),
              "router_cpu_pct": g1["server_cpu_pct"], "router_peak_rss_mib": g1["server_peak_rss_mib"],
              "errors": g0["error_count"] + g1["error_count"]}

    router_runs = [r for r in runs.values() if r["name"].split(".")[0] in
                   ("replay-redis", "replay-redis-warn", "replay-pg", "fresh", "paid", "lookup", "gc", "warmup") and r["name"] != "paid.direct"]
    peak_rss = max((r["server_peak_rss_mib"] or 0) for r in router_runs)
    targets = []
    def target(name, value, limit, ok, unit=""):
        targets.append({"target": name, "value": value, "limit": limit, "unit": unit, "met": bool(ok)})
    for row, label in ((rows[0], "replay (Redis)"), (rows[1], "replay (Postgres)")):
        target(f"{label} throughput ≥ 0.85× floor", row["throughput_ratio"], 0.85, row["throughput_ratio"] >= 0.85, "×")
        target(f"{label} p99 ≤ 1 ms at half saturation", row["router_latency_ms"]["p99"], 1.0, row["router_latency_ms"]["p99"] <= 1.0, "ms")
    target(f"fresh unpaid adds ≤ 1.5 ms p50 over the upstream (light load, {light['paced_rps']:.0f} req/s)", light["p50_added_ms"], 1.5, light["p50_added_ms"] <= 1.5, "ms")
    target("  (info) same, router's own share beyond the SQL floor", light["own_p50_ms"], 1.5, light["own_p50_ms"] <= 1.5, "ms")
    target("  (info) same at half saturation", rows[2]["p50_added_ms"], 1.5, rows[2]["p50_added_ms"] <= 1.5, "ms")
    target("  (info) same at half saturation, router's own share beyond the SQL floor", rows[2]["own_p50_ms"], 1.5, rows[2]["own_p50_ms"] <= 1.5, "ms")
    if len(lookups) > 1:
        g = lookups[-1]["p99_growth"]
        target(f"lookup p99 at {lookups[-1]['rows_target']:,} rows ≤ 1.2× at {lookups[0]['rows_target']:,}", g, 1.2, g is not None and g <= 1.2, "×")
    if gc:
        target(f"GC of {gc['expired_rows']:,} expired rows raises route p99 ≤ 20 %", gc["p99_increase_pct"], 20, gc["p99_increase_pct"] <= 20, "%")
        if gc["after_p99_increase_pct"] is not None:
            target("  (info) same, in the window after GC (vacuum, write-back)", gc["after_p99_increase_pct"], 20, gc["after_p99_increase_pct"] <= 20, "%")
    if paid_cold:
        target("paid p50, terms unknown, ≤ minimal direct client + 2 ms", paid_cold["p50_added_ms"], 2.0, paid_cold["p50_added_ms"] <= 2.0, "ms")
    if paid_official:
        target("paid p50, terms known, ≤ 0.8× official @x402/fetch client", paid_official["p50_ratio"], 0.8, paid_official["p50_ratio"] is not None and paid_official["p50_ratio"] <= 0.8, "×")
    if paid:
        target("  (info) paid p50, terms known, vs minimal direct client", paid["p50_ratio"], 1.0, paid["p50_ratio"] is not None and paid["p50_ratio"] <= 1.0, "×")
    target("router peak RSS ≤ 150 MiB under load", peak_rss, 150, peak_rss <= 150, "MiB")

    extra = [sql, light, sql_light] + ([warn] if warn else [])
    result = {"meta": meta, "paths": rows + extra + paid_rows, "lookup": lookups,
              "gc": gc, "targets": targets, "router_peak_rss_mib": peak_rss, "runs": list(runs.values()), "raw_runs": sum(groups.values(), [])}
    os.makedirs(out_dir, exist_ok=True)
    stamp = meta["started_at"]
    for name in (f"{stamp}.json", "latest.json"):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")

    def lat(d):
        return f"{d['p50']:.3f} / {d['p99']:.3f} / {d['p999']:.3f}"
    print()
    print(f"x402-router benchmarks ({meta['mode']}, {meta['started_at']}, medians of {meta['settings']['rounds']} round(s) "
          f"of {meta['settings']['sat_seconds']} s; {meta['machine']['nproc']} cores "
          f"{meta['machine']['cpu']}, load {meta['load_before']} → {meta['load_after']})")
    print()
    print("| path | floor | router req/s | floor req/s | ratio | paced at req/s | router p50/p99/p99.9 ms | floor p50/p99/p99.9 ms | +p50 ms | router CPU % (µs/req) | router peak RSS MiB |")
    print("|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for r in rows + extra + paid_rows:
        paced = f"{r['paced_rps']:.0f}" if r.get("paced_rps") else f"c={r.get('concurrency')}, n={r.get('count')}"
        print(f"| {r['path']} | {r['floor']} | {r['router_rps']:.0f} | {r['floor_rps']:.0f} | {r['throughput_ratio']:.2f} | {paced} | "
              f"{lat(r['router_latency_ms'])} | {lat(r['floor_latency_ms'])} | {r['p50_added_ms']:+.3f} | "
              f"{r['router_cpu_pct']} ({r['router_cpu_us_per_req']}) | {r['router_peak_rss_mib']} |")
    if paid and paid.get("breakdown"):
        print()
        timed = {k: v for k, v in paid["breakdown"].items() if "mean_ms" in v}
        counted = {k: v for k, v in paid["breakdown"].items() if "per_call" in v}
        print("paid /route, mean per call from the router's histograms: " + ", ".join(
            f"{k} {v['mean_ms']} ms ×{v['calls'] / max(1, paid['count']):.1f}" for k, v in sorted(timed.items())))
        if counted:
            print("paid /route, Postgres per call (transactions committed, WAL flushes, WAL records): " + ", ".join(
                f"{k[4:]} {v['per_call']}" for k, v in sorted(counted.items())))
    if lookups:
        print()
        print("| idempotency lookup (replay, Redis down) | rows | paced at req/s | router p50/p99/p99.9 ms | floor SELECT p50/p99/p99.9 ms | p99 growth |")
        print("|---|---:|---:|---|---|---:|")
        for l in lookups:
            fl = lat(l["floor_latency_ms"]) if l["floor_latency_ms"] else "-"
            print(f"| {l['rows_target']:,} rows | {l['rows']:,} | {l['rate']:.0f} | {lat(l['router_latency_ms'])} | {fl} | {l['p99_growth']:.2f}× |")
    if gc:
        print()
        print("| GC while under load (fresh unpaid calls) | expired rows | GC s | paced at req/s | p50/p99/p99.9 ms | p99 change |")
        print("|---|---:|---:|---:|---|---:|")
        print(f"| before GC ({gc['window_seconds']} s) | - | - | {gc['rate']:.0f} | {lat(gc['baseline_latency_ms'])} | |")
        print(f"| during `x402-router gc` | {gc['expired_rows']:,} | {gc['gc_seconds']} | {gc['rate']:.0f} | {lat(gc['during_latency_ms'])} | {gc['p99_increase_pct']:+.1f} % |")
        if gc["after_latency_ms"]:
            print(f"| after GC ({gc['window_seconds']} s) | - | - | {gc['rate']:.0f} | {lat(gc['after_latency_ms'])} | {gc['after_p99_increase_pct']:+.1f} % |")
    print()
    print("| target | value | limit | met |")
    print("|---|---:|---:|---|")
    for t in targets:
        v = t["value"]
        print(f"| {t['target']} | {v if v is not None else '-'} {t['unit']} | {t['limit']} {t['unit']} | {'yes' if t['met'] else '**no**'} |")
    errs = sum(r["error_count"] for r in runs.values())
    print()
    print(f"errors across all runs: {errs}; results in {out_dir}/{stamp}.json (and latest.json)")
