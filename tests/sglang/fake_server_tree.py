"""A stand-in server process tree for the lifecycle tests (no SGLang, starts in < 1 s).

Like ``sglang.launch_server`` it answers ``GET /health`` on the given port and has a
child process (SGLang's scheduler) that asks Linux to kill it when its parent dies.
Usage: ``python fake_server_tree.py PORT``.
"""

import ctypes
import http.server
import signal
import subprocess
import sys

CHILD = (
    "import ctypes, signal, time\nctypes.CDLL(None).prctl(1, signal.SIGKILL)\ntime.sleep(3600)\n"
)


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    print(f"child {child.pid}", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
