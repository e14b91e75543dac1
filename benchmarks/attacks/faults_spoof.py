"""The spoofing part of ``benchmarks/attacks/bench_faults.py``: forged and replayed reports, another user's
control requests, a hijacked agent port (see that file's docstring)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from faults_common import NOBODY, PY, TOY_CONFIG, TOY_JOB, Daemon, Tally, cli, stop_and_count, trains, wait, workdir

# ---------------------------------------------------------------- spoofing
def signed_raw(obj: dict[str, Any], key: bytes) -> bytes:
    """A frame signed with ``key`` whatever its payload holds (NaN included): what a job's own
    worker could send, so the monitor's checks, not the encoder's, must stop it."""
    from contract.messages import sign

    body = json.dumps(obj, separators=(",", ":")).encode()
    return body[:-1] + b',"sig":"' + sign(body[:-1], key) + b'"}'


def part_spoof(t: Tally) -> None:
    print("spoofing: forged and replayed reports; another user's control requests", flush=True)
    import zmq

    from contract.messages import Report, new_secret, secret_key
    from contract.messages import job_secret

    with workdir("mt-faults-spoof-") as top:
        d = Daemon(top, TOY_CONFIG.format(trace="none"))
        d.start()
        victim = d.submit(TOY_JOB.format(name="victim", rate=200, lo=1, hi=1, profile="false", samples=""), "victim")
        other = d.submit(TOY_JOB.format(name="other", rate=200, lo=1, hi=1, profile="false", samples=""), "other")
        wait(lambda: all(d.jobs()[j]["samples"] > 0 for j in (victim, other)), 60)
        info = json.loads((d.state / "daemon.json").read_text())
        master = (d.state / "monitor.key").read_bytes()  # the bench runs as the daemon's user
        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 2000)
        push.connect(info["monitor"])
        now = time.time()
        big = 10**12
        own_key = secret_key(job_secret(master, victim))
        legit = Report(victim, 1, big, now, 1, 99, "bench").encode(own_key)
        forged = {
            "unsigned": Report(victim, 1, big, now, 1, 99, "x").encode(None),
            "wrong key": Report(victim, 1, big, now, 1, 99, "x").encode(secret_key(new_secret())),
            "another job's key": Report(victim, 1, big, now, 1, 99, "x").encode(
                secret_key(job_secret(master, other))),
            "unknown job": Report("j999999", 1, big, now, 1, 99, "x").encode(secret_key(new_secret())),
            "samples 10^400": legit.replace(str(big).encode(), b"1" + b"0" * 400, 1),
            "NaN time": signed_raw({"v": 2, "type": "report", "job": victim, "seq": 2, "payload": {
                "samples": big, "timestamp": float("nan"), "world_size": 1, "generation": 99, "worker": "y"}},
                own_key),
            "generation 'abc'": signed_raw({"v": 2, "type": "report", "job": victim, "seq": 3, "payload": {
                "samples": big, "timestamp": now, "world_size": 1, "generation": "abc", "worker": "z"}},
                own_key),
        }
        before = d.jobs()[victim]["samples"]
        probe = Report(victim, 1, 1, now, 1, 99, "probe").encode(own_key)  # genuine: proves frames arrive
        push.send(probe)
        if not wait(lambda: d.jobs()[victim]["samples"] > before, 15):
            t.lost += 1
            t.note("spoof: a genuine report was never counted, so the forgery checks prove nothing")
        before = d.jobs()[victim]["samples"]
        for name, frame in forged.items():
            push.send(frame)
            t.spoofed += 1
        time.sleep(3.0)
        after = d.jobs()[victim]
        if after["samples"] - before >= big or after["state"] != "running":
            t.accepted += 1
            t.note(f"spoof: a forged report changed {victim}: {before} -> {after['samples']}, {after['state']}")
        # replay: one genuine frame (as if sniffed on the wire) counts once, never twice
        push.send(legit)
        wait(lambda: d.jobs()[victim]["samples"] >= before + big, 10)
        once = d.jobs()[victim]["samples"]
        for _ in range(3):
            push.send(legit)
            t.spoofed += 1
        time.sleep(3.0)
        if d.jobs()[victim]["samples"] >= once + big:
            t.accepted += 1
            t.note("spoof: a replayed report was counted again")
        push.close()

        # another local user: cancel root's job, shut the daemon down, submit as someone else
        if os.geteuid() == 0 and shutil.which("setpriv"):
            res = cli("cancel", victim, "--state-dir", str(d.state), as_nobody=True)
            t.spoofed += 1
            if res.returncode == 0 or d.jobs()[victim]["state"] == "cancelled":
                t.accepted += 1
                t.note(f"spoof: another user cancelled {victim}")
            code = ("import json,sys; from pathlib import Path; from malletrain.daemon.control import ask; "
                    "s=Path(sys.argv[1]); print(json.dumps([ask(s, {'cmd': 'shutdown'}), "
                    "ask(s, {'cmd': 'submit', 'spec': {'name': 'x', 'command': ['id']}, 'owner_uid': 0})]))")
            res = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                                  PY, "-c", code, str(d.state)], capture_output=True, text=True, timeout=60, cwd="/")
            t.spoofed += 2
            replies = json.loads(res.stdout) if res.returncode == 0 else [None, None]
            time.sleep(1.0)
            if not d.alive():
                t.accepted += 1
                t.note("spoof: another user shut the daemon down")
            if any(j["owner_uid"] == 0 and j["name"] == "x" for j in d.jobs().values()):
                t.accepted += 1
                t.note("spoof: another user submitted a job owned by root")
            if replies[0] and replies[0].get("ok"):
                t.accepted += 1
                t.note(f"spoof: shutdown answered ok for another user: {replies[0]}")
        else:
            t.note("spoof: not root (or no setpriv): the other-user requests were not tried")
        hijack_agents(t, d, top)
        if not trains(d, victim, 90):
            t.lost += 1
            t.note(f"spoof: {victim} did not train again after the hijack and the daemon's return")
        stop_and_count(d, t)


def hijack_agents(t: Tally, d: Daemon, top: Path) -> None:
    """The daemon dies; a local user binds its agent port first, without the key, and sends every
    command it can make. Accepted: a command an agent ran. Then the real daemon comes back."""
    import secrets

    import zmq

    from scavenger import channel as C
    from scavenger import protocol as P

    address = json.loads((d.state / "daemon.json").read_text())["agents"]
    d.kill9()
    t.kills += 1
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    wrong = secrets.token_bytes(32)
    markers = top / "hijack"
    markers.mkdir()
    nonces: dict[bytes, tuple[bytes, bytes]] = {}
    deadline = time.monotonic() + 8.0
    sent = 0
    while time.monotonic() < deadline:
        if sock.poll(100):
            ident, frame = sock.recv_multipart()
            node = P.node_of(ident)
            kind = C.kind_of(frame)
            if kind is C.Kind.CHALLENGE:
                nonces[ident] = (C.parse_challenge(frame), C.new_nonce())
                sock.send_multipart([ident, C.nonce_frame(nonces[ident][1])])
            elif kind is C.Kind.FINISH and ident in nonces:
                sock.send_multipart([ident, C.proof_frame(C.hub_proof(wrong, node, *nonces[ident]))])
                session = C.Session.for_hub(C.session_key(wrong, node, *nonces[ident]))
                argv = ("/bin/sh", "-c", f"touch {markers}/{node}-{sent}")
                for frame_out in (session.seal(P.encode(P.StartWorker(node, f"evil{sent}", argv))),
                                  P.encode(P.StartWorker(node, f"raw{sent}", argv)),
                                  P.encode(P.Shutdown(node))):
                    sock.send_multipart([ident, frame_out])
                    sent += 1
    sock.close(0)
    ctx.term()
    t.spoofed += sent
    ran = list(markers.iterdir())
    if ran:
        t.accepted += len(ran)
        t.note(f"spoof: agents ran {len(ran)} command(s) of a hijacker on the agent port")
    if sent == 0:
        t.note("spoof: no agent reached the hijacker (nothing tried)")
    d.start()  # the real daemon is back: its agents prove themselves to it again
