"""Load a test or benchmark puts on a shared resource, as programs another local user runs (each a
``python -c`` string: that user's Python need not see this package)."""

SILENT_CONNECTIONS = (  # argv: port, connections, seconds; prints "flooding" once it has opened them
    "import socket, sys, time\n"
    "port, n, until = int(sys.argv[1]), int(sys.argv[2]), time.monotonic() + float(sys.argv[3])\n"
    "held, opened = [], 0\n"
    "while time.monotonic() < until:\n"
    "    live = []\n"
    "    for s in held:\n"
    "        try:\n"
    "            s.setblocking(False)\n"
    "            if s.recv(1) == b'': s.close(); continue\n"
    "        except BlockingIOError: pass\n"
    "        except OSError: s.close(); continue\n"
    "        live.append(s)\n"
    "    held = live\n"
    "    while len(held) < n:\n"
    "        try: held.append(socket.create_connection(('127.0.0.1', port), timeout=2)); opened += 1\n"
    "        except OSError: break\n"
    "    if opened >= n: print('flooding', flush=True); opened = -10**9\n"
    "    time.sleep(0.05)\n"
)
