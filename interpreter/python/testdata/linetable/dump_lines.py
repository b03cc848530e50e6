# Prints, for every code object of a corpus compiled by the running
# interpreter, its raw line table and the line CPython itself gives each
# instruction offset. TestLineTableAgainstCPython runs it under every CPython
# 3.6+ it finds and checks LineForOffset against it. It must run unchanged on
# 3.6 to 3.14: no syntax or library newer than 3.6.
#
# Per code object, one list entry per 2-byte code unit, None = no line:
#   lines: the Python-level decoder: the line of the last dis.findlinestarts()
#          start at or before the offset (3.6-3.9), co_lines() (3.10+);
#   c:     the C decoder, PyCode_Addr2Line(code, offset in bytes), via ctypes;
#   pos:   the start line of co_positions() (3.11+), else None.
import ctypes
import dis
import json
import os
import random
import sys
import types

V = sys.version_info[:2]

SAMPLE = r'''
import functools

def deco(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper

@deco
@deco
def decorated(a, b=2,
              *rest,
              c=3, **kw):
    total = (a +
             b +
             c)
    for x in rest:
        if x % 2:
            continue
        elif x > 100:
            break
        total += x
    else:
        total -= 1
    while total > 10:
        total //= 2
    return total

def exceptions(v):
    try:
        r = 1 / v
    except ZeroDivisionError as e:
        r = None
    except (TypeError,
            ValueError):
        raise
    else:
        r = r * 2
    finally:
        v = 0
    try:
        pass
    finally:
        try:
            v += 1
        except Exception:
            pass
    with open(__file__) as fh, \
         open(__file__) as gh:
        pass
    return r

def comprehensions(n):
    squares = [i * i for i in range(n)
               if i % 3]
    table = {i: [j for j in range(i)] for i in range(n)}
    uniq = {x % 7 for x in squares}
    gen = (x
           for x in uniq
           if x)
    f = lambda q, w=1: (q +
                        w)
    return sum(gen) + f(len(table))

class Klass(object):
    attr = [1,
            2]

    def method(self, x):
        return self.attr[x] if x < 2 else \
            None

    @property
    def prop(self):
        return (
            self
            .attr
        )

    @staticmethod
    def static():
        def inner():
            def innermost():
                return 1
            return innermost
        return inner

def generator(n):
    yield 1
    yield from range(n)
    x = yield
    return x

async def coro(aw):
    async with aw as a:
        await a
    async for item in aw:
        print(item)
    return [i async for i in aw]

def formatted(a, b):
    return f"{a!r:>{b}} and {b}" + "%s" % (
        a,)

def chained(obj):
    return (obj
            .a()
            .b(1,
               2)
            .c[3])

def global_and_assert(x):
    global GLOBAL_Y
    assert x, (
        "message"
    )
    GLOBAL_Y = x
    del x

def nested_loops(m):
    out = []
    for i in range(m):
        for j in range(i):
            while j:
                j -= 1
                if j == 3:
                    break
            out.append(
                (i,
                 j))
    return out
'''


def blank(n):
    return "\n" * n


def generated():
    """Code shaped to hit every extension rule of every format."""
    parts = []
    # Offsets past 255 (and EXTENDED_ARG) with many distinct lines.
    body = ["    v0 = 0"]
    for i in range(1, 700):
        body.append("    v%d = v%d + %d" % (i % 50, (i * 7) % 50, i))
    parts.append("def long_function():\n" + "\n".join(body) + "\n    return v0\n")
    # One line whose code is far longer than 254 bytes.
    parts.append("def long_line(a):\n    x = " + " + ".join(["a"] * 400) + "\n    return x\n")
    # Forward line jumps around the byte and varint limits.
    body = []
    for n in (1, 62, 63, 64, 126, 127, 128, 129, 254, 255, 256, 1000, 5000, 70000):
        body.append("    x = %d%s" % (n, blank(n)))
    parts.append("def forward_jumps():\n" + "\n".join(body) + "    return x\n")
    # Backward jumps: the store goes back to the first line of the call.
    for n in (10, 127, 128, 129, 300, 5000):
        parts.append("def backward_%d(f, a):\n    x = f(%s        a,\n        a)\n    return x\n"
                     % (n, blank(n)))
    # A first line far from the body.
    parts.append("@deco%sdef far_body(a,%s        b):%s    return (a +%s            b)\n"
                 % (blank(300), blank(500), blank(200), blank(150)))
    # A jump that needs a four-chunk varint in 3.11+.
    parts.append("def huge_jump():\n    y = 1%s    return y\n" % blank(300000))
    return "\n".join(parts)


def synthetic_lnotab(rng):
    """A random co_lnotab (3.6-3.9) and a first line keeping lines positive."""
    table = bytearray()
    for _ in range(rng.randint(0, 60)):
        table.append(rng.choice([0, 0, 1, 2, 6, 254, 255, rng.randint(0, 255)]))
        table.append(rng.choice([0, 1, 127, 0x80, 0x81, 0xff, rng.randint(0, 255)]))
    return bytes(table), 1 + 128 * len(table), sum(table[0::2]) + 8


def synthetic_ranges(rng):
    """A random 3.10 co_linetable whose last range is not empty."""
    table = bytearray()
    for _ in range(rng.randint(0, 60)):
        table.append(rng.choice([0, 2, 4, 254, 255, rng.randint(0, 255)]))
        table.append(rng.choice([0, 1, 127, 0x80, 0x80, 0x81, rng.randint(0, 255)]))
    table += bytes([rng.randint(1, 255), rng.randint(0, 255)])
    return bytes(table), 1 + 128 * len(table), sum(table[0::2]) + 8


def varint(v):
    out = bytearray()
    while v >= 64:
        out.append(64 | (v & 63))
        v >>= 6
    out.append(v)
    return out


def svarint(v):
    return varint((-v << 1) | 1 if v < 0 else v << 1)


def synthetic_locations(rng):
    """A random, well-formed 3.11+ location table keeping lines positive."""
    first = rng.choice([0, 1, 100, 1 << 20])
    line, units, table = first, 0, bytearray()
    for _ in range(rng.randint(0, 60)):
        code, length = rng.randint(0, 15), rng.randint(1, 8)
        units += length
        table.append(0x80 | code << 3 | (length - 1))
        if code <= 9:
            table.append(rng.randint(0, 127))
        elif code <= 12:
            line += code - 10
            table += bytes([rng.randint(0, 127), rng.randint(0, 127)])
        elif code <= 14:
            delta = rng.choice([0, 1, -1, 31, 32, -33, 2047, rng.randint(-(1 << 22), 1 << 22)])
            delta = max(delta, -line)
            line += delta
            table += svarint(delta)
            if code == 14:
                for _ in range(3):
                    table += varint(rng.choice([0, 1, 63, 64, rng.randint(0, 1 << 16)]))
    return bytes(table), first, 2 * units + 8


def synthetic_codes():
    """Code objects whose tables use every rule of the running version's
    format, in combinations the compiler may never emit, for CPython's own
    decoders to answer."""
    rng = random.Random(626)
    template = compile("def f(): pass", "<synthetic>", "exec").co_consts[0]
    nop = bytes([dis.opmap["NOP"], 0])
    make = {(3, 6): synthetic_lnotab, (3, 10): synthetic_ranges, (3, 11): synthetic_locations}
    key = (3, 6) if V < (3, 10) else (3, 10) if V < (3, 11) else (3, 11)
    for i in range(300):
        table, first, codelen = make[key](rng)
        code = nop * ((codelen + 1) // 2)
        if V >= (3, 8):
            field = "co_lnotab" if V < (3, 10) else "co_linetable"
            kwargs = {"co_code": code, "co_firstlineno": first, field: table}
            yield template.replace(**kwargs)
        else:
            t = template
            yield types.CodeType(t.co_argcount, t.co_kwonlyargcount, t.co_nlocals, t.co_stacksize,
                                 t.co_flags, code, t.co_consts, t.co_names, t.co_varnames,
                                 t.co_filename, "synthetic%d" % i, first, table)


def stdlib_sources():
    base = os.path.dirname(os.__file__)
    for rel in ("argparse.py", "dis.py", "typing.py", "inspect.py",
                os.path.join("json", "decoder.py"),
                os.path.join("asyncio", "base_events.py")):
        path = os.path.join(base, rel)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                yield path, f.read()


def code_objects(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            for sub in code_objects(c):
                yield sub


ADDR2LINE = ctypes.pythonapi.PyCode_Addr2Line
ADDR2LINE.argtypes = [ctypes.py_object, ctypes.c_int]
ADDR2LINE.restype = ctypes.c_int


def c_lines(co, n):
    out = []
    for i in range(n):
        line = ADDR2LINE(co, 2 * i)
        out.append(None if V >= (3, 10) and line < 0 else line)
    return out


def python_lines(co, n):
    out = [None] * n
    if V >= (3, 10):
        for start, end, line in co.co_lines():
            # Synthetic 3.10 ranges may start at odd bytes.
            for off in range(start + start % 2, min(end, 2 * n), 2):
                out[off // 2] = line
        return out
    starts = sorted(dis.findlinestarts(co))
    line, k = co.co_firstlineno, 0
    for i in range(n):
        while k < len(starts) and starts[k][0] <= 2 * i:
            line = starts[k][1]
            k += 1
        out[i] = line
    return out


def positions(co, n):
    if V < (3, 11):
        return None
    starts = [p[0] for p in co.co_positions()][:n]
    return starts + [None] * (n - len(starts))


def dump(name, cos):
    for co in cos:
        code = co.co_code
        table = co.co_lnotab if V < (3, 10) else co.co_linetable
        n = len(code) // 2
        yield {
            "file": name,
            "name": co.co_name,
            "first": co.co_firstlineno,
            "table": table.hex(),
            "codelen": len(code),
            "lines": python_lines(co, n),
            "c": c_lines(co, n),
            "pos": positions(co, n),
        }


def main():
    codes = []
    for name, source in [("<sample>", SAMPLE), ("<generated>", generated())] + list(stdlib_sources()):
        codes.extend(dump(name, code_objects(compile(source, name, "exec"))))
    codes.extend(dump("<synthetic>", synthetic_codes()))
    json.dump({"version": "%d.%d.%d" % sys.version_info[:3], "codes": codes}, sys.stdout)


main()
