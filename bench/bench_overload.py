"""Overload test of ``bertkit serve``: a burst of concurrent requests far above what the server admits, then
clients that give up early, on 127.0.0.1 only; bounded in requests (``--flood`` + ``--unloaded`` + ``--quitters``
+ 2) and in time (``--max-seconds``).

The server is ``bertkit serve`` on MiniLM with a seeded two-label head (text-classification), one model thread
(``--server-threads``), run as its own process. Each request carries ``--texts-per-request`` texts of
``--words`` words cut from SST-2 dev sentences. Phases, one after the other:

1. unloaded: ``--unloaded`` requests one at a time (latency p50/p99 of a server with nothing else to do);
2. flood: ``--flood`` requests at once, each client waiting up to ``--client-timeout`` s, while /health is
   polled every 100 ms: how many are answered, refused (429/503, and how fast), or time out, the admitted
   requests' latency, /health's latency, and how long one short request sent right after the last answer
   takes to be answered (retrying a refusal every 100 ms);
3. quitters: ``--quitters`` clients send a request and disconnect after ``--quit-after-ms``; then one short
   request, timed the same way: its wait says whether the abandoned work was computed.

    .venv/bin/python bench/bench_overload.py --model models/minilm

Prints one JSON line: the figures above, the server's counters, its peak RSS, and the load average.

``--soak`` runs a soak test instead, on the same server, with one fixed request shape (``--soak-texts-per-request``
texts of ``--soak-words`` words):

1. capacity: ``--capacity-requests`` requests from as many closed-loop clients as admission lets in at once
   (never refused): requests/s at saturation;
2. soak: open-loop arrivals (Poisson, seeded) at ``--soak-overload`` (2) x that rate for ``--soak-minutes``
   (20), at most ``--soak-clients`` requests in flight (an arrival finding none free is counted, not sent),
   each client waiting up to ``--client-timeout`` s; the server's RSS (VmRSS of /proc/PID/status) is sampled
   every ``--rss-every-s`` (5) s.

Its JSON line: the capacity, the arrival rate asked and reached, the RSS after the first minute, the largest RSS
after it and their ratio (goal <= 1.10), the counts of 200 / 429 / other statuses / client timeouts (goal: the
excess refused with 429 and every admitted request answered 200), the admitted requests' p50/p99 latency, the RSS
every minute, the server's counters and the load average.

    nohup .venv/bin/python bench/bench_overload.py --soak --soak-minutes 20 > soak.log 2>&1 &
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from bench_serve import SST2, free_port, make_classifier, percentile, server_stats, start

ROOT = Path(__file__).resolve().parents[1]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def texts_for(sentences: list[str], words: int, count: int) -> list[str]:
    """``count`` texts of ``words`` words each, cut in order from the sentences (wrapping around)."""
    pool = " ".join(sentences).split()
    return [" ".join(pool[(i * words + j) % len(pool)] for j in range(words)) for i in range(count)]


async def request(port: int, method: str, path: str, body: bytes, timeout: float) -> tuple[str, float, dict]:
    """One HTTP/1.1 request on its own connection to 127.0.0.1:``port``, closed afterwards (or at ``timeout``,
    as a client that gives up does): (outcome, seconds, headers), the outcome being the status code as text,
    "timeout" or "error:<kind>". Plain asyncio streams: the load generator must cost little CPU next to the
    server on a 2-core machine (httpx spends ~1 ms per request)."""
    t0 = time.perf_counter()
    writer = None

    async def exchange() -> tuple[str, dict]:
        nonlocal writer
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        await writer.drain()
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
        headers = {k.lower(): v for k, v in headers.items()}
        await reader.readexactly(int(headers.get("content-length", 0)))
        return head[0].split()[1], headers

    try:
        status, headers = await asyncio.wait_for(exchange(), timeout)
        return status, time.perf_counter() - t0, headers
    except asyncio.TimeoutError:
        return "timeout", time.perf_counter() - t0, {}
    except (OSError, asyncio.IncompleteReadError) as e:
        return f"error:{type(e).__name__}", time.perf_counter() - t0, {}
    finally:
        if writer is not None:
            writer.close()


async def post(port: int, inputs, timeout: float) -> tuple[str, float, dict]:
    return await request(port, "POST", "/predict", json.dumps({"inputs": inputs}).encode(), timeout)


async def run(port: int, args: argparse.Namespace, long_texts: list[str], short: str) -> dict:
    per = args.texts_per_request
    texts = [long_texts[i * per:(i + 1) * per] for i in range(args.flood + args.unloaded + args.quitters)]
    out: dict = {}
    await post(port, texts[0], 120)  # warm-up
    lat = [(await post(port, texts[i], args.client_timeout))[1] for i in range(args.unloaded)]
    out["unloaded"] = {"requests": len(lat), "p50_ms": ms(percentile(lat, 0.5)), "p99_ms": ms(percentile(lat, 0.99))}

    health: list[float] = []
    done = asyncio.Event()

    async def poll_health() -> None:  # a load balancer's liveness probe, on its own connections
        while not done.is_set():
            outcome, seconds, _ = await request(port, "GET", "/health", b"", 30)
            health.append(seconds if outcome == "200" else float("inf"))
            await asyncio.sleep(0.1)

    prober = asyncio.create_task(poll_health())
    cpu0, t0 = time.process_time(), time.perf_counter()
    flood = await asyncio.gather(*(post(port, texts[args.unloaded + i], args.client_timeout)
                                   for i in range(args.flood)))
    wall, client_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    done.set()
    await prober
    after = await answered(port, short, args.client_timeout)
    ok = [s for o, s, _ in flood if o == "200"]
    refused = [(s, h) for o, s, h in flood if o in ("429", "503")]
    out["flood"] = {
        "requests": args.flood, "inputs_per_request": per, "answered": len(ok), "refused": len(refused),
        "client_timeouts": sum(o == "timeout" for o, _, _ in flood),
        "other": sorted({o for o, _, _ in flood} - {"200", "429", "503", "timeout"}),
        "admitted_p50_ms": ms(percentile(ok, 0.5)) if ok else None,
        "admitted_p99_ms": ms(percentile(ok, 0.99)) if ok else None,
        "admitted_max_ms": ms(max(ok)) if ok else None,
        "refused_p50_ms": ms(percentile([s for s, _ in refused], 0.5)) if refused else None,
        "refused_p99_ms": ms(percentile([s for s, _ in refused], 0.99)) if refused else None,
        "retry_after_s": sorted({int(h.get("retry-after", 0)) for _, h in refused}),
        "wall_s": round(wall, 1), "client_cpu_share": round(client_cpu / wall, 2),
        "health_p50_ms": ms(percentile(health, 0.5)) if health else None,
        "health_p99_ms": ms(percentile(health, 0.99)) if health else None,
        "health_max_ms": ms(max(health)) if health else None, "health_probes": len(health),
        "short_request_after_ms": ms(after[1]), "short_request_after": {"status": after[0], "attempts": after[2]}}

    # Clients that give up: each connection is closed after quit_after_ms, its request queued or running.
    base = args.unloaded + args.flood
    quitters = await asyncio.gather(*(post(port, texts[base + i], args.quit_after_ms / 1000)
                                      for i in range(args.quitters)))
    after = await answered(port, short, args.client_timeout)
    out["quitters"] = {"clients": args.quitters, "quit_after_ms": args.quit_after_ms,
                       "gave_up": sum(o == "timeout" for o, _, _ in quitters),
                       "short_request_after_ms": ms(after[1]),
                       "short_request_after": {"status": after[0], "attempts": after[2]}}
    return out


async def answered(port: int, inputs, timeout: float) -> tuple[str, float, int]:
    """(final outcome, seconds until answered, attempts) for a client that retries a refusal every 100 ms
    (sooner than Retry-After asks, to time when the server takes work again)."""
    t0 = time.perf_counter()
    attempt = 0
    while True:
        attempt += 1
        outcome, _, _ = await post(port, inputs, timeout)
        if outcome not in ("429", "503") or time.perf_counter() - t0 > timeout:
            return outcome, time.perf_counter() - t0, attempt
        await asyncio.sleep(0.1)


def rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    """The process's ``field`` of /proc/PID/status (VmRSS: resident now; VmHWM: its peak), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


async def soak(port: int, pid: int, args: argparse.Namespace, texts: list[str]) -> dict:
    """Capacity at saturation, then open-loop arrivals at ``--soak-overload`` x it, sampling the server's RSS."""
    per = args.soak_texts_per_request
    bodies = [texts[i * per:(i + 1) * per] for i in range(len(texts) // per)]
    for i in range(0, 64, 16):  # warm-up: the first calls of each size allocate
        await asyncio.gather(*(post(port, bodies[i + j], 120) for j in range(16)))
    # 1. Capacity: closed-loop clients, as many as admission lets in at once (so none is refused, and a full
    # batch waits while one is computed: fewer would leave the model idle between calls).
    clients = max(1, min(64, args.max_concurrent_requests_effective // per))
    sent = 0
    cap_outcomes: list[str] = []

    async def closed_client() -> None:
        nonlocal sent
        while sent < args.capacity_requests:
            i = sent
            sent += 1
            outcome, _, _ = await post(port, bodies[i % len(bodies)], args.client_timeout)
            cap_outcomes.append(outcome)

    t0 = time.perf_counter()
    await asyncio.gather(*(closed_client() for _ in range(clients)))
    capacity = len(cap_outcomes) / (time.perf_counter() - t0)
    if set(cap_outcomes) != {"200"}:
        raise RuntimeError(f"capacity phase: not every request answered 200: {sorted(set(cap_outcomes))}")

    # 2. Soak: Poisson arrivals at overload x capacity, at most soak_clients in flight.
    rate = args.soak_overload * capacity
    rng = random.Random(0)
    duration = 60 * args.soak_minutes
    counts: dict[str, int] = {}
    admitted: list[float] = []
    rss: list[tuple[float, float | None]] = []
    in_flight = 0
    not_sent = 0
    arrivals = 0
    pending: set[asyncio.Task] = set()

    async def one(body) -> None:
        nonlocal in_flight
        try:
            outcome, seconds, _ = await post(port, body, args.client_timeout)
        finally:
            in_flight -= 1
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "200":
            admitted.append(seconds)

    async def sample_rss() -> None:
        while True:
            rss.append((time.perf_counter() - start, rss_mb(pid)))
            await asyncio.sleep(args.rss_every_s)

    start = time.perf_counter()
    sampler = asyncio.create_task(sample_rss())
    next_t = 0.0
    while True:
        next_t += rng.expovariate(rate)
        if next_t >= duration:
            break
        delay = next_t - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        arrivals += 1
        if in_flight >= args.soak_clients:
            not_sent += 1
            continue
        in_flight += 1
        task = asyncio.create_task(one(bodies[arrivals % len(bodies)]))
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    wall = time.perf_counter() - start
    rss.append((wall, rss_mb(pid)))
    sampler.cancel()
    first = [m for t, m in rss if t >= 60 and m is not None]
    after_first_minute = first[0] if first else None
    max_after = max(first) if first else None
    other = {k: v for k, v in counts.items() if k not in ("200", "429", "timeout")}
    out = {"capacity": {"requests_per_s": round(capacity, 2), "clients": clients, "requests": len(cap_outcomes)},
           "soak": {"minutes": args.soak_minutes, "overload": args.soak_overload,
                    "arrival_rate_asked_per_s": round(rate, 2), "arrivals": arrivals,
                    "arrival_rate_reached_per_s": round(arrivals / duration, 2), "not_sent_client_bound": not_sent,
                    "wall_s": round(wall, 1), "status_200": counts.get("200", 0), "status_429": counts.get("429", 0),
                    "other_statuses": other, "client_timeouts": counts.get("timeout", 0),
                    "answered_per_s": round(counts.get("200", 0) / wall, 2),
                    "admitted_p50_ms": ms(percentile(admitted, 0.5)) if admitted else None,
                    "admitted_p99_ms": ms(percentile(admitted, 0.99)) if admitted else None,
                    "admitted_max_ms": ms(max(admitted)) if admitted else None},
           "rss": {"at_start_mb": rss[0][1], "after_first_minute_mb": after_first_minute,
                   "max_after_first_minute_mb": max_after,
                   "ratio": round(max_after / after_first_minute, 3) if first else None,
                   "final_mb": rss[-1][1], "samples": len(rss),
                   "per_minute_mb": [m for t, m in rss if m is not None][::max(1, round(60 / args.rss_every_s))]}}
    out["goals"] = {"rss_ratio_le_1_10": bool(first) and max_after / after_first_minute <= 1.10,
                    "only_200_and_429": not other and not counts.get("timeout", 0),
                    "excess_refused": counts.get("429", 0) > 0}
    return out


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "models" / "minilm")
    p.add_argument("--flood", type=int, default=400, help="concurrent requests in the burst")
    p.add_argument("--texts-per-request", type=int, default=4)
    p.add_argument("--words", type=int, default=300, help="words per text")
    p.add_argument("--unloaded", type=int, default=10, help="requests sent one at a time before the flood")
    p.add_argument("--quitters", type=int, default=20, help="clients that give up after --quit-after-ms")
    p.add_argument("--quit-after-ms", type=float, default=50.0)
    p.add_argument("--client-timeout", type=float, default=120.0)
    p.add_argument("--max-concurrent-requests", type=int, default=None, help="the server's (default: its own)")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--server-threads", type=int, default=1, help="OMP_NUM_THREADS of the server")
    p.add_argument("--max-seconds", type=float, default=900.0,
                   help="the whole run stops after this long (--soak: the soak's minutes plus this)")
    p.add_argument("--soak", action="store_true", help="run the soak test (module doc) instead of the phases")
    p.add_argument("--soak-minutes", type=float, default=20.0)
    p.add_argument("--soak-overload", type=float, default=2.0, help="arrival rate as a multiple of capacity")
    p.add_argument("--soak-texts-per-request", type=int, default=2)
    p.add_argument("--soak-words", type=int, default=64, help="words per text in the soak")
    p.add_argument("--soak-clients", type=int, default=256, help="most soak requests in flight at once")
    p.add_argument("--capacity-requests", type=int, default=600, help="requests of the capacity phase")
    p.add_argument("--rss-every-s", type=float, default=5.0)
    args = p.parse_args()
    if args.flood < 1 or args.flood > 2000:
        raise SystemExit(f"--flood {args.flood}: choose 1..2000 (one connection per request)")
    with open(SST2, encoding="utf-8", newline="") as f:
        sentences = [r["sentence"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    n = (args.flood + args.unloaded + args.quitters) * args.texts_per_request
    long_texts = texts_for(sentences, args.words, 4096 if args.soak else n)
    if args.soak:
        long_texts = texts_for(sentences, args.soak_words, 4096 - 4096 % args.soak_texts_per_request)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_classifier(args.model, Path(tmp) / "clf")
        port = free_port()
        cmd = [sys.executable, "-m", "bertkit", "serve", "--model", str(model_dir), "--task", "text-classification",
               "--port", str(port), "--max-batch-size", str(args.max_batch_size), "--log-level", "warning"]
        if args.max_concurrent_requests:
            cmd += ["--max-concurrent-requests", str(args.max_concurrent_requests),
                    "--max-items", str(min(64, args.max_concurrent_requests))]
        load_before = os.getloadavg()
        proc = start(cmd, port, args.server_threads)
        try:
            import httpx

            ready = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=30).json()
            args.max_concurrent_requests_effective = ready["max_concurrent_requests"]
            if args.soak:
                work = soak(port, proc.pid, args, long_texts)
                out = asyncio.run(asyncio.wait_for(work, 60 * args.soak_minutes + args.max_seconds))
            else:
                out = asyncio.run(asyncio.wait_for(run(port, args, long_texts, sentences[0]), args.max_seconds))
            out["server_stats"] = server_stats(f"http://127.0.0.1:{port}")
            rss = peak_rss_mb(proc.pid)
        finally:
            proc.terminate()
            proc.wait(60)
    import torch

    shape = ({"words_per_text": args.soak_words, "texts_per_request": args.soak_texts_per_request} if args.soak
             else {"words_per_text": args.words})
    print(json.dumps({"bench": "soak" if args.soak else "overload", "model": str(args.model),
                      "task": "text-classification", **shape, "max_concurrent_requests": ready["max_concurrent_requests"],
                      "max_batch_size": args.max_batch_size, "server_threads": args.server_threads, **out,
                      "server_peak_rss_mb": rss, "load_average_before": [round(x, 2) for x in load_before],
                      "load_average_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
                      "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
