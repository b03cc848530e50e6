-- ljworkload.lua MODE SECONDS [joff] - LuaJIT workloads for the profiler's
-- LuaJIT tests (test/integration/luajit_test.go).
--
-- Prints "hot phase from <unix time>" when the measured phase starts, then
-- spins for SECONDS. Lines marked "# hot: NAME" are where the tests expect
-- each frame ("def NAME" where the function is defined: LuaJIT's frames
-- are named file:line of the definition); the test reads the marks.
--
-- chain: leaf (an arithmetic loop) called by mid, called by top, from the
-- main chunk.
-- ffi: the same chain with fleaf, whose loop calls libc's strlen through
-- the FFI on a 1 MB string: most samples are in strlen, a native frame
-- above the Lua frames.
-- math: the chain with mleaf, whose loop calls math.sin (libm's sin, from
-- the VM's fast function or from a trace).
-- recursion: leaf <- mid <- rec, recursing 40 deep, from the main chunk
-- (more frames than one run of the BPF unwinder walks).
-- coroutine: the chain inside a coroutine (coroutine.wrap): its frames,
-- then the main thread's that resumed it.
-- joff: turn the JIT off (for a host that runs the script without the
-- luajit command's -joff).
local ffi = require("ffi")
ffi.cdef [[
typedef long time_t;
struct timespec { time_t tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct timespec *ts);
size_t strlen(const char *s);
]]
local C = ffi.C

local mode, seconds, jitmode = arg[1], tonumber(arg[2]), arg[3]
local modes = { chain = true, ffi = true, math = true, recursion = true, coroutine = true }
if not modes[mode] or not seconds then
  io.stderr:write("usage: ljworkload.lua chain|ffi|math|recursion|coroutine SECONDS [joff]\n")
  os.exit(2)
end
if jitmode == "joff" then
  jit.off()
end

local ts = ffi.new("struct timespec")
local function clock(id)
  C.clock_gettime(id, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
local function now() return clock(1) end

local big = string.rep("x", 1048576)

local function leaf(deadline) -- # hot: def leaf
  local x = 0
  for i = 1, 100000 do x = x + i % 7 end -- # hot: leaf
  return now() < deadline, x
end

local function fleaf(deadline) -- # hot: def fleaf
  local n = 0
  for _ = 1, 20 do n = n + tonumber(C.strlen(big)) end -- # hot: fleaf
  return now() < deadline, n
end

local sin = math.sin
local function mleaf(deadline) -- # hot: def mleaf
  local s = 0
  for i = 1, 20000 do s = s + sin(i) end -- # hot: mleaf
  return now() < deadline, s
end

local step = mode == "ffi" and fleaf or mode == "math" and mleaf or leaf

local function mid(deadline) -- # hot: def mid
  while step(deadline) do end -- # hot: mid
end

local function top(deadline) -- # hot: def top
  mid(deadline) -- # hot: top
  return true
end

local function rec(n, deadline) -- # hot: def rec
  if n > 0 then rec(n - 1, deadline) -- # hot: rec
  else mid(deadline) end -- # hot: rec mid
end

local function wrapped(deadline) -- # hot: def wrapped
  top(deadline) -- # hot: wrapped
end

io.stdout:setvbuf("line")
io.write(string.format("hot phase from %.6f\n", clock(0)))
local deadline = now() + seconds
if mode == "recursion" then
  rec(40, deadline) -- # hot: rec main
elseif mode == "coroutine" then
  coroutine.wrap(wrapped)(deadline) -- # hot: coroutine main
else
  top(deadline) -- # hot: main
end

-- WORKLOAD_HOLD: the process stays, its memory readable, until its
-- standard input ends, after saying so: a test stops profiling first, so
-- that the daemon symbolizes every sample while the process lives.
if os.getenv("WORKLOAD_HOLD") then
  io.write("holding\n")
  for _ in io.lines() do end
end
