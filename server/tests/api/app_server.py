# A task's web app for the apps proxy tests: a page, its request's headers as JSON, a POST
# echo, a cookie with a Domain, and a WebSocket echo (standard library only).
import base64
import hashlib
import json
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class App(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        if self.path.startswith("/headers"):
            seen = {k.lower(): v for k, v in self.headers.items()}
            body = json.dumps({"path": self.path, "headers": seen}).encode()
            kind = "application/json"
        else:
            body = (
                "<!doctype html><title>Notebook</title><style>body{font:16px sans-serif;margin:3em}"
                "h1{color:#2f6f4f}</style><h1>Hello from the task</h1>"
                "<p>This page is served by the task's own process, through the server.</p>"
            ).encode()
            kind = "text/html; charset=utf-8"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Set-Cookie", "_xsrf=abc; Domain=apps.localhost; Path=/")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b"got " + data
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"] + GUID
        accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        wanted = self.headers.get("Sec-WebSocket-Protocol")
        if wanted:
            self.send_header("Sec-WebSocket-Protocol", wanted.split(",")[0].strip())
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            op, n = head[0] & 15, head[1] & 127
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            if op == 8:
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            if op in (1, 2):
                out = b"echo: " + data
                size = bytes([len(out)]) if len(out) < 126 else b"\x7e" + struct.pack(">H", len(out))
                self.wfile.write(bytes([0x80 | op]) + size + out)
                self.wfile.flush()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), App).serve_forever()
