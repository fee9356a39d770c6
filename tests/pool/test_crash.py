"""A pool that crashes (every process of its cluster killed at once, ``kill -9``) after a
tenant fetched values of more than 100 KB from its islands: the tenant lives on, as one whose
values were all small does, its futures say the island was lost, and it closes.

Ray hands such a value over as a read-only view of its node's shared object store, and JAX
placed that view on a CPU device without copying it, so the tenant kept the store's memory
mapped; letting it go once the store had died made Ray end the tenant (exit status 1, no
Python error). ``pwkernel.backends.ray.hostvalues.own`` copies it into the tenant's memory.

A head of its own (``tests/helpers/pool.py``: ~20 s to start on 2 cores) with the pool's
islands, killed here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil

from pwkernel.pool import head as pool_head
from tests.helpers import ROOT
from tests.helpers.pool import TIMEOUT, Head

NAME = "crash"

TENANT = textwrap.dedent("""
    import gc, sys
    import numpy as np, ray
    import pwkernel as pw
    ctl = pw.Controller(backend="ray", ray_address=sys.argv[1], pool=sys.argv[2])
    f = pw.function(lambda x: x + 1, slice=ctl.slice(1, island=0))
    big = np.zeros(1 << 16, np.float32)  # 256 KB: fetched through Ray's object store
    seen = float(np.asarray(f(big).result(timeout=120)).sum())  # let go of at once
    kept = f(big).result(timeout=120)  # kept until the pool has died
    # (its renewals stop here, so the value goes before this process would leave the
    # cluster: as a cell that runs again soon after a crash, or Python's garbage collector,
    # lets go of a value while the heartbeat has not yet noticed)
    ctl.executor.keepalive.close()
    print("value", seen, float(np.asarray(kept).sum()), flush=True)
    sys.stdin.readline()  # the pool is killed meanwhile
    del kept
    gc.collect()
    print("dropped", flush=True)
    try:
        f(np.arange(2.0)).result(timeout=60)
    except pw.IslandLostError as e:
        print("lost:", e, flush=True)
    ctl.close()
    print("closed", flush=True)
""")



def test_a_tenant_that_fetched_large_values_outlives_a_killed_pool():
    from pwkernel.backends.ray import cluster, tenancy

    head = Head.start()
    put_back = cluster.lend_token(head.token_path)
    tenant = None
    try:
        cluster.connect(head.address)
        tenancy.create_islands(NAME, (2, 2), "cpu", lease=4.0)
        tenant = subprocess.Popen([sys.executable, "-c", TENANT, head.address, NAME],
                                  env=head.env, cwd=ROOT, text=True, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = tenant.stdout.readline().strip()
        assert line == f"value {float(1 << 16)} {float(1 << 16)}", tenant.stderr.read()[-3000:]
        crashed = pool_head.processes(head.record)
        for p in crashed:  # all at once, as a crash (`stop` sends SIGTERM first)
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(crashed, timeout=TIMEOUT)
        out, err = tenant.communicate("\n", timeout=TIMEOUT)
    finally:
        if tenant is not None:
            tenant.kill()
            tenant.wait(TIMEOUT)
        cluster.drop_lost()  # (this process joined the cluster too: it leaves as a tenant does)
        head.stop()
        put_back()
    assert tenant.returncode == 0, err[-3000:]
    lines = out.splitlines()
    assert lines[0] == "dropped", out
    assert lines[1].startswith("lost:") and "attach again once the pool runs" in lines[1]
    assert lines[-1] == "closed"
