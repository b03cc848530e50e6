<?php
// phpworkload.php MODE SECONDS - PHP workloads for the profiler's PHP tests.
//
// Prints "opcache on|off jit on|off" when OPcache is loaded, and "hot phase
// from <unix time>" when the measured phase starts, then spins for SECONDS. Lines marked with a hot comment ("# hot: NAME") are where the tests expect
// each frame; test/integration/php_test.go reads the marks.
//
// chain: Shop\Cart::leaf (a method), called by Shop\Cart::mid (a static
// method), called back by array_map (a C function) from Shop\top, so the
// stack interleaves PHP and C and spans two calls of the VM.
// eval: the chain's top called from eval'd code and an included file.
//
// Under php-fpm (SAPI fpm-fcgi) a request runs the chain for the query's
// ms milliseconds and answers with the worker's pid.
namespace Shop;

class Cart
{
    // leaf runs in short calls, as the tracing JIT compiles hot loops and
    // functions on their calls; it says whether the deadline is still ahead.
    public function leaf(float $deadline): bool
    {
        $x = 0;
        for ($i = 0; $i < 100000; $i++) { # hot: leaf loop
            $x += $i % 7; # hot: leaf
        }
        return \microtime(true) < $deadline;
    }

    public static function mid(float $deadline): int
    {
        $cart = new Cart();
        while ($cart->leaf($deadline)) { # hot: mid
        }
        return 0;
    }
}

function top(float $deadline): void
{
    \array_map([Cart::class, 'mid'], [$deadline]); # hot: top
}

if (\PHP_SAPI === 'fpm-fcgi') {
    top(\microtime(true) + (int)($_GET['ms'] ?? 20) / 1000); # hot: request
    echo \getmypid(), "\n";
    return;
}

[, $mode, $seconds] = $argv + [null, 'chain', '5'];
$deadline = \microtime(true) + (float)$seconds;
if (\function_exists('opcache_get_status')) {
    // What a test asked of OPcache may have failed quietly.
    $status = \opcache_get_status(false);
    echo "opcache ", $status === false ? 'off' : 'on', " jit ", ($status['jit']['on'] ?? false) ? 'on' : 'off', "\n";
}
echo "hot phase from ", \sprintf('%.6f', \microtime(true)), "\n";
\fflush(\STDOUT);
switch ($mode) {
    case 'chain':
        top($deadline); # hot: main
        break;
    case 'eval':
        require __DIR__ . '/included.php'; # hot: require
        break;
    default:
        \fwrite(\STDERR, "unknown mode $mode\n");
        exit(2);
}
// WORKLOAD_HOLD: the process stays, its memory readable, until its
// standard input ends, after saying so: a test stops profiling first, so
// that the daemon symbolizes every sample while the process lives.
if (\getenv('WORKLOAD_HOLD')) {
    echo "holding\n";
    \fflush(\STDOUT);
    while (\fgets(\STDIN) !== false) {
    }
}
