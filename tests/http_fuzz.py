"""Hostile requests for the pack's HTTP routes (``fastar play``'s server, the Live World node's key route): raw bytes
on a socket, so malformed framing reaches the server as an attacker would send it. Each case expects a 4xx; a
server under test must answer every one and keep serving."""

from __future__ import annotations

import json
import socket
import time


def raw_request(port: int, data: bytes, timeout: float = 15.0, close_write: bool = False, pause: float = 0.0):
    """Send ``data`` to 127.0.0.1:``port`` and read the answer: (status or None, body bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if pause:
            time.sleep(pause)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
                head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if length is not None and len(body) >= length:
                    break
        except (ConnectionResetError, TimeoutError):
            pass
    answer = b"".join(chunks)
    if not answer.startswith(b"HTTP/1."):
        return None, answer
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def post(path: str, host: str, body: bytes, length: str | None = "auto", extra: str = "") -> bytes:
    headers = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}"
    if length == "auto":
        headers += f"Content-Length: {len(body)}\r\n"
    elif length is not None:
        headers += f"Content-Length: {length}\r\n"
    return headers.encode() + b"Connection: close\r\n\r\n" + body


def chunked(path: str, host: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            f"{len(body):x}\r\n").encode() + body + b"\r\n0\r\n\r\n"


# Bodies a key-state route refuses with 400 (name, body).
BAD_BODIES = [
    ("not JSON", b"hello"),
    ("not UTF-8", b"\xff\xfe\xfd"),
    ("NaN", b'{"keys": [], "mouse": [NaN, 1]}'),
    ("a huge number", b'{"keys": [], "mouse": [1e400, 0]}'),
    ("an array", b"[1, 2]"),
    ("a string", b'"w"'),
    ("keys not a list", b'{"keys": "w"}'),
    ("a key that is a number", b'{"keys": [1]}'),
    ("a key that is a list", b'{"keys": [["w"]]}'),
    ("a key that is an object", b'{"keys": [{"a": 1}]}'),
    ("an unknown key", b'{"keys": ["Escape"]}'),
    ("a long key name", json.dumps({"keys": ["a" * 3000]}).encode()),
    ("too many keys", json.dumps({"keys": ["w"] * 17}).encode()),
    ("an unknown field", b'{"keys": [], "x": 1}'),
    ("nested 10 deep", b"[" * 10 + b"]" * 10),
    ("nested 2000 deep", b"[" * 2000 + b"]" * 2000),
    ("a key state nested deep", b'{"keys": [[[[[["w"]]]]]]}'),
    ("a mouse that is not a pair", b'{"keys": [], "mouse": [1]}'),
]


def framing_cases(path: str, host: str) -> list:
    """(name, raw request, expected status, send options) with broken framing or sizes."""
    body = b'{"keys": ["w"]}'
    return [
        ("no Content-Length (chunked)", chunked(path, host, body), 400, {}),
        ("Content-Length 0", post(path, host, b"", "0"), 400, {}),
        ("Content-Length over the limit, body sent", post(path, host, b" " * 5000), 400, {}),
        ("Content-Length of a gigabyte, no body", post(path, host, b"", "1000000000"), 400, {}),
        ("Content-Length not a number", post(path, host, body, "ten"), 400, {}),
        ("Content-Length negative", post(path, host, body, "-5"), 400, {}),
        ("two Content-Lengths", post(path, host, body, None, f"Content-Length: {len(body)}\r\nContent-Length: 3\r\n"),
         400, {}),
        # sent short and left open: refused when the rest does not come (a client that closes instead is gone)
        ("body shorter than its length", post(path, host, body, "100"), 400, {"timeout": 30}),
    ]


def one_line_error(status: int, body: bytes) -> str | None:
    """The one-line message of a JSON error answer (what the pack's routes send), or None for another body."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    message = data.get("error") if isinstance(data, dict) else None
    assert isinstance(message, str) and message and "\n" not in message, (status, body[:200])
    return message
