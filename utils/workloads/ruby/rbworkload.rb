# rbworkload.rb MODE SECONDS - Ruby workloads for the profiler's Ruby tests.
#
# Prints "hot phase from <unix time>" when the measured phase starts, then
# spins for SECONDS. Lines marked "# hot: NAME" are where the tests expect
# each frame; test/integration/ruby_test.go reads the marks.
#
# chain: Leafy#leaf (a module's method), called by Chain#mid, called from
# a block Chain.top (a singleton method) passes to Hash#each_pair (a C
# function), so the stack interleaves Ruby and C.
# threads: four threads named t0-t3, each in its own chain tN_leaf <-
# tN_mid <- tN_top; they take turns holding the VM lock.
# fork: a forking server: two workers at a time, each forked to run the
# chain for 1 s and exit, as unicorn's and puma's workers are recycled.
# gc: the chain, with leaf allocating and dropping objects so that the
# garbage collector runs many times a second and compacts the heap
# (moving objects); GC.count is printed at the end.

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
$garbage = false

# leaf runs in short calls, as JITs compile a method on its calls (YJIT
# after 10 by default, with no entry into a running loop); it says whether
# the deadline is still ahead.
module Leafy
  def leaf(deadline)
    x = 0
    while x < 10_000 # hot: leaf loop
      x += 1 # hot: leaf
      Array.new(100) { "s" * x.bit_length } if $garbage && x % 64 == 0 # hot: leaf garbage
    end
    now < deadline
  end
end

class Chain
  include Leafy

  def mid(deadline)
    nil while leaf(deadline) # hot: mid
  end

  def self.top(deadline)
    {a: 1}.each_pair { new.mid(deadline) } # hot: top
  end
end

def t0_leaf(d) = (x = 0; x += 1 until x % 100_000 == 0 && now > d) # hot: t0_leaf
def t0_mid(d) = t0_leaf(d) # hot: t0_mid
def t0_top(d) = t0_mid(d) # hot: t0_top
def t1_leaf(d) = (x = 0; x += 1 until x % 100_000 == 0 && now > d) # hot: t1_leaf
def t1_mid(d) = t1_leaf(d) # hot: t1_mid
def t1_top(d) = t1_mid(d) # hot: t1_top
def t2_leaf(d) = (x = 0; x += 1 until x % 100_000 == 0 && now > d) # hot: t2_leaf
def t2_mid(d) = t2_leaf(d) # hot: t2_mid
def t2_top(d) = t2_mid(d) # hot: t2_top
def t3_leaf(d) = (x = 0; x += 1 until x % 100_000 == 0 && now > d) # hot: t3_leaf
def t3_mid(d) = t3_leaf(d) # hot: t3_mid
def t3_top(d) = t3_mid(d) # hot: t3_top

mode, seconds = ARGV
abort "usage: #{$0} chain|threads|fork|gc SECONDS" unless %w[chain threads fork gc].include?(mode) && seconds
STDOUT.puts "hot phase from #{Process.clock_gettime(Process::CLOCK_REALTIME)}"
STDOUT.flush
deadline = now + Float(seconds)
case mode
when "chain"
  Chain.top(deadline) # hot: main
when "fork"
  workers = 0
  while now < deadline
    if workers == 2
      Process.wait
      workers -= 1
    end
    fork do # hot: fork
      STDOUT.puts "worker #{Process.pid}"
      STDOUT.flush
      Chain.top([now + 1, deadline].min) # hot: fork main
      exit!
    end
    workers += 1
  end
  Process.waitall
when "gc"
  $garbage = true
  GC.auto_compact = true
  Chain.top(deadline) # hot: gc main
  STDOUT.puts "gc count #{GC.count}"
when "threads"
  4.times.map { |i| Thread.new { Thread.current.name = "t#{i}"; send(:"t#{i}_top", deadline) } }.each(&:join)
end
# WORKLOAD_HOLD: the process stays, its memory readable, until its
# standard input ends, after saying so: a test stops profiling first, so
# that the daemon symbolizes every sample while the process lives.
if ENV["WORKLOAD_HOLD"]
  STDOUT.puts "holding"
  STDOUT.flush
  STDIN.read
end
