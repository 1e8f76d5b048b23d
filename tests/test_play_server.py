"""``fastar play``'s server under load and attack: a burst of 50 clients, a soak of key and mode traffic with
clients that go away, hostile requests, its first line, a busy port. Everything on 127.0.0.1, bounded in count
and time. The soak lasts ``FASTAR_PLAY_SOAK_SECONDS`` (20 s here; the full run is 600:
``FASTAR_PLAY_SOAK_SECONDS=600 python -m pytest -q tests/test_play_server.py -k soak``)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from comfyui_fastar.tools.demo.bundled import load_demo_model
from comfyui_fastar.tools.demo.settings import WEIGHTS_DIR, WORLD_WEIGHTS_FILE
from comfyui_fastar.tools.play import HOST, PlaySession, serve

from http_fuzz import BAD_BODIES, framing_cases, one_line_error, post, raw_request

SOAK_SECONDS = float(os.environ.get("FASTAR_PLAY_SOAK_SECONDS", "20"))
# The server's resident size settles within its first few minutes of mode switches (the ten-minute soak: 803 MiB by
# its second quarter, at most 785 in its last); a shorter soak ends while dense phases still raise its peak, so
# only a soak this long is held to flat memory.
MEMORY_SOAK_SECONDS = 600
KEY_STATES = [[], ["w"], ["a"], ["s"], ["d"], ["ArrowUp"], ["ArrowLeft", "d"], ["W"], ["ArrowDown"], ["ArrowRight"]]


@pytest.fixture(scope="module")
def server():
    torch.set_num_threads(1)
    session = PlaySession(load_demo_model(WEIGHTS_DIR / WORLD_WEIGHTS_FILE), map_seed=2, max_fps=0)
    srv = serve(session, 0)
    session.start("fastar")
    yield session, srv.server_address[1]
    session.stop()
    srv.shutdown()


def request(port: int, path: str, body=None, timeout: float = 60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", data=data, method="POST" if data else "GET",
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_burst_of_50_clients_is_answered_every_one(server):
    session, port = server
    barrier = threading.Barrier(50)

    def client(i):
        barrier.wait()  # all 50 connect at once
        if i % 2:
            return request(port, "/api/key", {"keys": KEY_STATES[i % len(KEY_STATES)]})[0]
        return request(port, f"/api/state?after={10**9}")[0]

    with ThreadPoolExecutor(50) as pool:
        statuses = list(pool.map(client, range(50)))
    assert statuses == [200] * 50
    assert request(port, "/api/state")[1]["rollouts_running"] == 1


@pytest.mark.parametrize("name,body", BAD_BODIES, ids=[n for n, _ in BAD_BODIES])
def test_a_hostile_key_body_gets_one_400_line_and_changes_nothing(server, name, body):
    session, port = server
    request(port, "/api/key", {"keys": ["d"]})
    status, answer = raw_request(port, post("/api/key", f"{HOST}:{port}", body))
    assert status == 400 and one_line_error(status, answer), (status, answer[:200])
    assert session.keys.held() == ("D",)  # the refused body changed nothing
    status, answer = raw_request(port, post("/api/mode", f"{HOST}:{port}", body))
    assert status == 400 and one_line_error(status, answer), (status, answer[:200])
    request(port, "/api/key", {"keys": []})


def test_broken_framing_gets_a_4xx_and_the_server_keeps_serving(server):
    session, port = server
    host = f"{HOST}:{port}"
    for name, data, expected, options in framing_cases("/api/key", host):
        status, answer = raw_request(port, data, **options)
        assert status == expected, (name, status, answer[:200])
    for path, method in (("/nowhere", "GET"), ("/api/key", "GET"), ("/api/state", "POST")):
        status, _ = raw_request(port, f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 2\r\n"
                                      "Connection: close\r\n\r\n{}".encode())
        assert 400 <= status < 500, (path, method, status)
    status, answer = raw_request(port, f"GET /api/state HTTP/1.1\r\nHost: evil.example:{port}\r\n"
                                       "Connection: close\r\n\r\n".encode())
    assert status == 403 and one_line_error(status, answer)
    status, answer = raw_request(port, f"GET /api/state?after=zz HTTP/1.1\r\nHost: {host}\r\n"
                                       "Connection: close\r\n\r\n".encode())
    assert status == 400 and one_line_error(status, answer)
    assert raw_request(port, b"GARBAGE\r\n\r\n")[0] == 400
    assert request(port, "/api/state")[0] == 200  # still serving


def test_concurrent_mode_switches_leave_one_rollout_running(server):
    session, port = server
    modes = ["dense", "fastar"] * 6
    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(lambda m: request(port, "/api/mode", {"mode": m})[0], modes))
    assert statuses == [200] * 12
    state = request(port, "/api/state")[1]
    assert state["rollouts_running"] == 1 and state["error"] is None


# -- the command, as a person runs it ---------------------------------------------------------------------------
def start_play(port: int = 0, *args):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "comfyui_fastar", "play", "--port", str(port), "--max-fps", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    started = time.monotonic()
    # First "starting", said before the imports; then the address, as soon as the server listens.
    first = proc.stdout.readline()
    assert first.startswith("fastar play: starting"), first
    line = proc.stdout.readline()
    return proc, line, time.monotonic() - started


def port_of(line: str) -> int:
    match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert match, line
    return int(match.group(1))


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def stop(proc) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_the_first_line_comes_when_it_listens_and_a_busy_port_is_named():
    proc, line, seconds = start_play()
    try:
        port = port_of(line)
        assert "loading" in line  # printed before the model is loaded
        with socket.create_connection((HOST, port), timeout=5):
            pass  # the port it names is listening
        status, state = request(port, "/api/state")
        assert status == 200
        second = subprocess.run([sys.executable, "-m", "comfyui_fastar", "play", "--port", str(port)],
                                capture_output=True, text=True, timeout=120)
        assert second.returncode != 0
        assert f"--port {port}: 127.0.0.1:{port} is already in use" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
    finally:
        code, out, err = stop(proc)
    assert "Traceback" not in err, err[-2000:]


def test_soak_of_key_and_mode_traffic_keeps_memory_flat_and_answers_every_request():
    proc, line, _ = start_play()
    port = port_of(line)
    deadline = time.monotonic() + 120
    while request(port, "/api/state")[1]["loading"] and time.monotonic() < deadline:
        time.sleep(0.2)
    counts = {"sent": 0, "answered": 0, "rude": 0}
    failures: list = []
    lock = threading.Lock()
    stop_at = time.monotonic() + SOAK_SECONDS

    def count(ok: bool, what: str):
        with lock:
            counts["sent"] += 1
            counts["answered"] += ok
            if not ok and len(failures) < 10:
                failures.append(what)

    def keys(seed: int):
        rng = random.Random(seed)
        while time.monotonic() < stop_at:
            body = {"keys": rng.choice(KEY_STATES)}
            count(request(port, "/api/key", body)[0] == 200, f"key {body}")
            time.sleep(0.02)

    def modes():
        for i in range(10**9):
            if time.monotonic() >= stop_at:
                return
            mode = ("dense", "fastar")[i % 2]
            count(request(port, "/api/mode", {"mode": mode})[0] == 200, f"mode {mode}")
            time.sleep(2.0)

    def state():
        after = -1
        while time.monotonic() < stop_at:
            status, body = request(port, f"/api/state?after={after}")
            count(status == 200 and body["rollouts_running"] <= 1 and body["error"] is None, f"state {body}"[:300])
            if body.get("frames"):
                after = body["frames"][-1]["index"]
            time.sleep(0.06)

    def rude():  # clients that go away: half a request, a request never read
        while time.monotonic() < stop_at:
            with socket.create_connection((HOST, port)) as s:
                s.sendall(b"POST /api/key HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{\"ke")
            with socket.create_connection((HOST, port)) as s:
                s.sendall(f"GET /api/state HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode())
            with lock:
                counts["rude"] += 2
            time.sleep(0.5)

    memory: list = []

    def sample():
        while time.monotonic() < stop_at:
            memory.append((time.monotonic(), rss_mib(proc.pid)))
            time.sleep(1.0)

    threads = [threading.Thread(target=f, args=a) for f, a in
               [(keys, (1,)), (keys, (2,)), (keys, (3,)), (modes, ()), (state, ()), (rude, ()), (sample, ())]]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        final = request(port, "/api/state")[1]
    finally:
        code, out, err = stop(proc)
    assert not failures, failures
    assert counts["sent"] == counts["answered"] and counts["sent"] > 10 * SOAK_SECONDS, counts
    assert final["chunks"] > 0 and final["rollouts_running"] == 1
    # Flat memory: the last quarter's peak within 64 MiB of the first half's. Peaks, not means: every switch to
    # dense restarts a rollout whose cache grows until the next switch, and the allocator keeps what a dense phase
    # freed, so the resident size steps between phases rather than climbing; a leak climbs past every peak.
    quarter = len(memory) // 4
    settled = max(m for _, m in memory[:2 * quarter])
    late = max(m for _, m in memory[3 * quarter:])
    if SOAK_SECONDS >= MEMORY_SOAK_SECONDS:
        assert late - settled < 64, (settled, late, statistics.median(m for _, m in memory))
    assert "Traceback" not in err, err[-3000:]
    print(f"soak {SOAK_SECONDS:g} s: {counts['sent']} requests answered, {counts['rude']} rude clients, "
          f"RSS {settled:.0f} -> {late:.0f} MiB, {final['chunks']} chunks")
