# Defines functions of every shape a profile shows, prints one JSON line
# describing their code objects, then sleeps until stdin closes so that
# TestSymbolizerAgainstCPython can read them out of this process's memory.
# It must run unchanged on CPython 3.6 to 3.13: no newer syntax or library.
#
# Per code object: its address (id()), co_name, co_qualname (null before
# 3.11), co_filename, co_firstlineno, and the line CPython gives every
# 2-byte code unit offset (null for none): co_lines() on 3.10+, else the
# line of the last dis.findlinestarts() start at or before the offset.
# "not_code" holds addresses of objects that are no code objects.
import dis
import json
import sys


class Klass:
    def method(self, x):
        y = x * 2
        return y

    class Inner:
        @staticmethod
        def deep():
            return [i for i in range(3)]


def outer(a):
    def inner(b):
        return a + b
    return inner


lam = lambda x: (x +
                 1)


def gen(n):
    for i in range(n):
        yield i


def plain(a, b):
    c = a + b
    if c > 10:
        c = c - 1
    else:
        c = c + 1
    return c


def compiled(source, filename):
    ns = {}
    exec(compile(source, filename, "exec"), ns)
    return ns


# Names and files of every PEP 393 kind: Latin-1 (1 byte), BMP (2 bytes)
# and astral (4 bytes) code points.
latin1 = compiled("def na\u00efve(x):\n    y = x + 1\n    return y\n",
                  "/tmp/donn\u00e9es/fa\u00e7ade.py")
bmp = compiled("class \u7c7b:\n    def \u65b9\u6cd5(self):\n        return 1\n\n"
               "def \u51fd\u6570(x):\n    return [x,\n            x]\n",
               "/srv/\u6570\u636e/\u6a21\u5757.py")
astral = compiled("def \U00020002\U00020003():\n    return 4\n\ndef ascii_in_astral_file():\n    return 5\n",
                  "/srv/\U00020000/\U00020001.py")

# A long function: byte offsets past 255 and line jumps past 127 in one
# step, which both line table formats encode specially.
long_lines = ["def long_function(n):", "    total = 0"]
for i in range(300):
    long_lines.append("    total += n * %d" % i)
    if i % 60 == 0:
        long_lines.extend([""] * 200)
long_lines.append("    for i in range(n):")
long_lines.append("        total -= i")
long_lines.append("    return total")
long_ns = compiled("\n".join(long_lines) + "\n", "generated_long.py")


def lines_of(co):
    if hasattr(co, "co_lines"):
        out = []
        for start, end, line in co.co_lines():
            for off in range(start, end, 2):
                out.append([off, line])
        return out
    starts = list(dis.findlinestarts(co))
    out, line, j = [], None, 0
    for off in range(0, len(co.co_code), 2):
        while j < len(starts) and starts[j][0] <= off:
            line = starts[j][1]
            j += 1
        out.append([off, line])
    return out


def describe(label, co):
    return {
        "label": label,
        "id": id(co),
        "name": co.co_name,
        "qualname": getattr(co, "co_qualname", None),
        "filename": co.co_filename,
        "firstlineno": co.co_firstlineno,
        "lines": lines_of(co),
    }


targets = [
    ("module", sys._getframe().f_code),
    ("method", Klass.method.__code__),
    ("nested class static method", Klass.Inner.deep.__code__),
    ("closure", outer(1).__code__),
    ("outer", outer.__code__),
    ("lambda", lam.__code__),
    ("generator", gen.__code__),
    ("plain", plain.__code__),
    ("latin-1 names", latin1["na\u00efve"].__code__),
    ("bmp method", bmp["\u7c7b"].__dict__["\u65b9\u6cd5"].__code__),
    ("bmp function", bmp["\u51fd\u6570"].__code__),
    ("astral function", astral["\U00020002\U00020003"].__code__),
    ("ascii in astral file", astral["ascii_in_astral_file"].__code__),
    ("long function", long_ns["long_function"].__code__),
]
# The comprehension's code object is a constant of deep's (before 3.12,
# which inlines comprehensions).
for const in Klass.Inner.deep.__code__.co_consts:
    if hasattr(const, "co_code"):
        targets.append(("comprehension", const))

out = {
    "version": "%d.%d.%d" % sys.version_info[:3],
    "codes": [describe(label, co) for label, co in targets],
    "not_code": {"function": id(plain), "str": id(plain.__code__.co_name), "class": id(Klass)},
}
sys.stdout.write(json.dumps(out) + "\n")
sys.stdout.flush()
sys.stdin.read()
