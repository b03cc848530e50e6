"""Python workloads with known hot stacks, for the profiler's integration
tests: python3 pyworkload.py MODE SECONDS. Runs on CPython 3.6 and later.

Each hot loop sits on one line, which the tests look up by the marker
comment at its end ("# hot: NAME").
"""
import hashlib
import os
import random
import sys
import threading
import time
import zlib

LOOP = 20000


def cf_leaf():
    x = 0
    for i in range(LOOP): x += i * i  # hot: cf_leaf
    return x


def cf_mid():
    return cf_leaf()


def cf_top():
    return cf_mid()


def recurse(depth):
    if depth == 0:
        return rec_leaf()
    return recurse(depth - 1)


def rec_leaf():
    x = 0
    for i in range(LOOP): x += i  # hot: rec_leaf
    return x


# Each thread of the "threads" mode runs its own chain.
def t0_leaf():
    x = 0
    for i in range(LOOP): x += i  # hot: t0_leaf
    return x


def t0_mid():
    return t0_leaf()


def t0_top(deadline):
    while time.time() < deadline:
        t0_mid()


def t1_leaf():
    x = 0
    for i in range(LOOP): x += i  # hot: t1_leaf
    return x


def t1_mid():
    return t1_leaf()


def t1_top(deadline):
    while time.time() < deadline:
        t1_mid()


def t2_leaf():
    x = 0
    for i in range(LOOP): x += i  # hot: t2_leaf
    return x


def t2_mid():
    return t2_leaf()


def t2_top(deadline):
    while time.time() < deadline:
        t2_mid()


def t3_leaf():
    x = 0
    for i in range(LOOP): x += i  # hot: t3_leaf
    return x


def t3_mid():
    return t3_leaf()


def t3_top(deadline):
    while time.time() < deadline:
        t3_mid()


def cf_compress():
    return len(zlib.compress(DATA, 9))  # hot: cf_compress


# The offcpu mode's threads wait in known places: one sleeps 10 ms at a
# time, one reads a pipe (a feeder writes to it every 20 ms), one takes a
# lock (a holder keeps it 15 ms at a time, sleeping), one spins, hashing
# (with the GIL released: a thread spinning in Python would have the others
# wait for the GIL more than for what they asked for). Each sums the time
# its waiting calls took when they blocked (50 us or more).
def off_sleep_leaf(_):
    time.sleep(0.01)  # hot: off_sleep_leaf


def off_sleep_mid(arg):
    off_sleep_leaf(arg)


def off_pipe_leaf(fd):
    os.read(fd, 1)  # hot: off_pipe_leaf


def off_pipe_mid(fd):
    off_pipe_leaf(fd)


def off_lock_leaf(lock):
    lock.acquire()  # hot: off_lock_leaf
    lock.release()


def off_lock_mid(lock):
    off_lock_leaf(lock)


OFF_BUSY_DATA = bytes(16 << 20)


def off_busy_leaf(_):
    return hashlib.sha256(OFF_BUSY_DATA).digest()  # hot: off_busy_leaf


def off_busy_mid(arg):
    off_busy_leaf(arg)


def off_waiter(name, wait, arg, blocks, deadline, results):
    tid = threading.get_native_id() if hasattr(threading, "get_native_id") else 0
    waited = 0.0
    while time.time() < deadline:
        t0 = time.monotonic()
        wait(arg)
        took = time.monotonic() - t0
        if blocks and took >= 50e-6:
            waited += took
    results.append((name, tid, waited))


def off_feeder(fd, deadline):
    while time.time() < deadline + 0.1:
        time.sleep(0.02)
        os.write(fd, b"x")


def off_holder(lock, deadline):
    while time.time() < deadline + 0.1:
        with lock:
            time.sleep(0.015)
        time.sleep(0.001)


def off_cpu(deadline):
    r, w = os.pipe()
    lock = threading.Lock()
    results = []
    helpers = [threading.Thread(target=off_feeder, args=(w, deadline)),
               threading.Thread(target=off_holder, args=(lock, deadline))]
    waiters = [threading.Thread(target=off_waiter, args=(name, wait, arg, blocks, deadline, results))
               for name, wait, arg, blocks in (("sleep", off_sleep_mid, None, True), ("pipe", off_pipe_mid, r, True),
                                               ("lock", off_lock_mid, lock, True), ("busy", off_busy_mid, None, False))]
    for t in helpers + waiters:
        t.start()
    for t in helpers + waiters:
        t.join()
    for name, tid, waited in results:
        print("thread %s %d %d" % (name, tid, int(waited * 1e9)))


# The modes run at module level: the chain mode's hot stack is
# <module> -> cf_top -> cf_mid -> cf_leaf. What runs before the hot phase
# (the interpreter starting, the imports, the zlib mode's data) is not
# part of it: the first line of output says when it begins (time.time()).
mode, seconds = sys.argv[1], float(sys.argv[2])
DATA = b""
if mode == "zlib":
    # Compressible but not trivially: zlib spends its time in deflate's
    # match search, native code beneath cf_compress.
    DATA = bytes(b & 0x0F for b in random.Random(1).getrandbits(8 << 18).to_bytes(1 << 18, "little"))
start = time.time()
print("hot phase from %.6f" % start)
sys.stdout.flush()
deadline = start + seconds
if mode == "chain":
    while time.time() < deadline:
        cf_top()
elif mode == "recursion":
    while time.time() < deadline:
        recurse(40)
elif mode == "threads":
    threads = [threading.Thread(target=f, args=(deadline,)) for f in (t0_top, t1_top, t2_top, t3_top)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
elif mode == "zlib":
    while time.time() < deadline:
        cf_compress()
elif mode == "offcpu":
    off_cpu(deadline)
else:
    sys.exit("unknown mode " + mode)
# The profiler symbolizes Python frames from the process's memory: stay
# alive (asleep, so not sampled) until it has read the last samples. With
# WORKLOAD_HOLD set, until standard input ends, after saying so: the test
# stops profiling first.
if os.environ.get("WORKLOAD_HOLD"):
    print("holding")
    sys.stdout.flush()
    sys.stdin.read()
else:
    time.sleep(0.5)
