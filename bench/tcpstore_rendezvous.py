"""PyTorch's TCPStore doing what torch.distributed's rendezvous does at init,
for N clients: each client `add`s 1 to a counter; the one that brings it to
N sets a key that every client `wait`s for (torch's store-based barrier);
then each `get`s one shared key (as init_process_group's rank 0 publishes
its address). The server is its own process (libuv, as torch uses by
default where this torch has it), the N clients are threads of one process: N processes of Python
would spend minutes starting on this machine, and TCPStore's calls release
the GIL, so the threads wait on the network, as preflight-rank-sim's tasks
do on one thread.

Usage: tcpstore_rendezvous.py N
Prints: tcpstore ranks=N clients=threads checkin_ms=A verdict_ms=B
        server_bytes_sent=C server=libuv|classic server_rss_mb=D
"""

import datetime
import os
import resource
import socket
import subprocess
import sys
import threading
import time

TIMEOUT = datetime.timedelta(seconds=600)


def server(port, world):
    from torch.distributed import TCPStore

    try:
        store = TCPStore(
            "127.0.0.1", port, world, True, TIMEOUT, wait_for_workers=False, use_libuv=True
        )
        backend = "libuv"
    except TypeError:
        # Debian's torch (1.13) predates the libuv server: its own
        # poll()-based daemon thread serves instead.
        store = TCPStore("127.0.0.1", port, world, True, TIMEOUT, wait_for_workers=False)
        backend = "classic"
    store.set("shared", "tcp://127.0.0.1:29500")
    store.wait(["finished"], TIMEOUT)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        f"server={backend} server_rss_mb={rss_kb / 1024:.1f}",
        flush=True,
    )


def clients(port, world):
    from torch.distributed import TCPStore

    threading.stack_size(256 * 1024)
    added = [0.0] * world
    got = [0.0] * world
    errors = []
    stores = [None] * world
    t0 = time.monotonic()

    def client(i):
        try:
            s = TCPStore("127.0.0.1", port, world, False, TIMEOUT)
            stores[i] = s
            if s.add("count", 1) == world:
                s.set("all_in", "1")
            added[i] = time.monotonic()
            s.wait(["all_in"], TIMEOUT)
            s.get("shared")
            got[i] = time.monotonic()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {e}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print(f"{len(errors)} clients failed, first: {errors[0]}", file=sys.stderr)
        return 1
    # What the server sent: the bytes the clients' sockets received (the
    # kernel's tcpi_bytes_received, read by ss while they are still open).
    ss = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( dport = :{port} )"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    received = sum(
        int(field.split(":")[1]) for field in ss.split() if field.startswith("bytes_received:")
    )
    last_add = max(added) - t0
    last_get = max(got) - t0
    print(
        f"tcpstore ranks={world} clients=threads checkin_ms={last_add * 1000:.0f} "
        f"verdict_ms={(last_get - last_add) * 1000:.0f} server_bytes_sent={received}",
        end=" ",
        flush=True,
    )
    # Closed while the server is up: torch 1.13's clients spin on a socket
    # whose server has gone.
    stores.clear()
    TCPStore("127.0.0.1", port, world, False, TIMEOUT).set("finished", "1")
    return 0


def wait_listening(srv, port):
    """True once the server listens; False if it exited first. Its start
    (importing torch takes seconds) is not part of the rendezvous."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if srv.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    srv.kill()
    return False


def main():
    world = int(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "--server":
        server(int(sys.argv[3]), world)
        return 0
    # The server binds the wildcard address, which conflicts with any
    # local address's use of the port (the simulator's thousands of
    # connections leave many in TIME_WAIT): a port free on the wildcard,
    # and another try should the server still fail to bind it.
    for _attempt in range(5):
        s = socket.socket()
        s.bind(("", 0))
        port = s.getsockname()[1]
        s.close()
        srv = subprocess.Popen([sys.executable, __file__, str(world), "--server", str(port)])
        if wait_listening(srv, port):
            break
    else:
        return 1
    code = clients(port, world)
    srv.wait(timeout=600)
    sys.stdout.flush()
    # Not sys.exit: tearing down thousands of TCPStore clients at
    # interpreter exit spins for minutes in torch 1.13; the figures are out.
    os._exit(code)


if __name__ == "__main__":
    main()
