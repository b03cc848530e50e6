"""Python workloads with known hot stacks, for the profiler's integration
tests: python3 pyworkload.py MODE SECONDS. Runs on CPython 3.6 and later.

Each hot loop sits on one line, which the tests look up by the marker
comment at its end ("# hot: NAME").
"""
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
