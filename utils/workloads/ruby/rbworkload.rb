# rbworkload.rb MODE SECONDS - Ruby workloads for the profiler's Ruby tests.
#
# Prints "hot phase from <unix time>" when the measured phase starts, then
# spins for SECONDS. Lines marked "# hot: NAME" are where the tests expect
# each frame; test/integration/ruby_test.go reads the marks.
#
# chain: leaf, called by mid, called from a block top passes to
# Hash#each_pair (a C function), so the stack interleaves Ruby and C.

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def leaf(deadline)
  x = 0
  while true # hot: leaf loop
    x += 1; break if x % 100_000 == 0 && now > deadline # hot: leaf
  end
  x
end

def mid(deadline)
  leaf(deadline) # hot: mid
end

def top(deadline)
  {a: 1}.each_pair { mid(deadline) } # hot: top
end

mode, seconds = ARGV
abort "usage: #{$0} chain SECONDS" unless mode == "chain" && seconds
STDOUT.puts "hot phase from #{Process.clock_gettime(Process::CLOCK_REALTIME)}"
STDOUT.flush
top(now + Float(seconds)) # hot: main
