#!/usr/bin/env python3
"""A small prefill/decode proxy for scripts/run_pd.sh (stdlib only).

    python scripts/pd_proxy.py --port 8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 [--parallel]

POST /v1/completions and /v1/chat/completions: the request goes to the
prefill server with max_tokens=1 (it computes the prompt's KV and writes it
to the pool), then unchanged to the decode server, whose answer (streamed or
not) is the client's. --parallel sends both at once, the decode one with
kv_transfer_params {"mcxl_wait_s": N}: the decode side waits on the pool's
announcement channel and loads the prompt's blocks as the prefill side
writes them. GET /health, /v1/models go to the decode server.
"""
import argparse
import json
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    cfg = None

    def log_message(self, fmt, *args):  # one line per request on stderr
        sys.stderr.write("pd_proxy: " + fmt % args + "\n")

    def _reply(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        try:
            with urllib.request.urlopen(self.cfg.decode + self.path, timeout=10) as r:
                self._reply(r.status, r.read(), r.headers.get("Content-Type", "application/json"))
        except urllib.error.HTTPError as e:
            self._reply(e.code, e.read())
        except OSError as e:
            self._reply(502, {"error": f"decode server: {e}"})

    def _prefill(self, body, errors):
        pre = dict(body, max_tokens=1, stream=False)
        pre.pop("max_completion_tokens", None)
        pre.pop("stream_options", None)
        try:
            with _post(self.cfg.prefill + self.path, pre, self.cfg.timeout) as r:
                r.read()
        except (OSError, urllib.error.HTTPError) as e:
            errors.append(f"prefill server: {e}")

    def do_POST(self):
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._reply(404, {"error": f"no route {self.path}"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        except ValueError as e:
            return self._reply(400, {"error": f"bad JSON: {e}"})
        errors = []
        if self.cfg.parallel:
            t = threading.Thread(target=self._prefill, args=(body, errors), daemon=True)
            t.start()
            params = dict(body.get("kv_transfer_params") or {}, mcxl_wait_s=self.cfg.wait_s)
            body = dict(body, kv_transfer_params=params)
        else:
            self._prefill(body, errors)
            if errors:  # the decode side would recompute the whole prompt: say so
                sys.stderr.write(f"pd_proxy: {errors[0]}; decode recomputes the prompt\n")
        try:
            r = _post(self.cfg.decode + self.path, body, self.cfg.timeout)
        except urllib.error.HTTPError as e:
            return self._reply(e.code, e.read())
        except OSError as e:
            return self._reply(502, {"error": f"decode server: {e}"})
        with r:
            self.send_response(r.status)
            self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
                if not chunk:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--prefill", required=True)
    p.add_argument("--decode", required=True)
    p.add_argument("--parallel", action="store_true")
    p.add_argument("--wait-s", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=600.0)
    cfg = p.parse_args()
    cfg.prefill, cfg.decode = cfg.prefill.rstrip("/"), cfg.decode.rstrip("/")
    Proxy.cfg = cfg
    srv = ThreadingHTTPServer((cfg.host, cfg.port), Proxy)
    print(f"pd_proxy on http://{cfg.host}:{cfg.port}: prefill {cfg.prefill} -> decode {cfg.decode}"
          f"{' (parallel)' if cfg.parallel else ''}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
