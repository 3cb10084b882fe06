#!/usr/bin/env python3
"""A stand-in for llama.cpp's llama-server, for testing scripts/bench_serve_cpu.sh without building
llama.cpp: it takes llama-server's command line (the flags the script passes), answers GET /health,
and streams POST /v1/completions the way llama-server does with logprobs 0 — one server-sent event
per generated token, `"logprobs": null`, then a final event with a finish_reason and `data: [DONE]`.
It generates max_tokens copies of " x" (ignore_eos) and checks that the prompt is a list of token ids.

    standin_llama_server.py -m FILE --port P [--host H] [-t N] [-tb N] [--parallel N] [-c N] [--no-webui]
"""
import argparse
import http.server
import json
import socketserver


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b'{"status":"ok"}' if self.path == "/health" else b'{"error":"not found"}'
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path != "/v1/completions" or not isinstance(req.get("prompt"), list) or not req.get("stream"):
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()

        def event(obj):
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        for _ in range(int(req.get("max_tokens", 16))):
            event({"choices": [{"text": " x", "index": 0, "logprobs": None, "finish_reason": None}],
                   "object": "text_completion"})
        event({"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
               "object": "text_completion"})
        event({"choices": [], "usage": {"prompt_tokens": len(req["prompt"]),
                                         "completion_tokens": int(req.get("max_tokens", 16))}})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-m", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    for flag in ("-t", "-tb", "--parallel", "-c"):
        p.add_argument(flag)
    p.add_argument("--no-webui", action="store_true")
    args = p.parse_args()

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    Server((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
