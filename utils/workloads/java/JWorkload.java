// Java workloads with known hot stacks, for the profiler's integration
// tests: java JWorkload.java MODE SECONDS [WARMUP] (or compiled: java -cp
// DIR JWorkload MODE SECONDS [WARMUP]). Compiles with --release 8 and
// runs on JDK 8 and later (the tests compile it with --release 11 for JDK
// 11 and later). Prints "hot phase from T" (T in Unix seconds)
// once it starts its hot phase and "hot phase to T" once it ends it,
// before the JVM exits.
//
// Each hot loop sits on one line, which the tests look up by the marker
// comment at its end ("// hot: NAME").
import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.util.ArrayList;
import java.util.List;
import java.util.zip.Deflater;

public class JWorkload {
    static final int LOOP = 20000;
    // Results go here so the JIT cannot drop the loops.
    static volatile long sink;

    // chain: Thread.run -> Worker.run -> top -> mid -> leaf in the thread
    // "worker". Left alone, C2 inlines leaf and mid into top's compiled
    // loop; the tests also run it with mid excluded from compilation, an
    // interpreted frame between compiled ones. The stack must show all.
    static long leaf(long seed) {
        long x = seed;
        for (int i = 0; i < LOOP; i++) { x = x * 31 + (i ^ (x >>> 7)); } // hot: leaf
        return x;
    }

    static long mid(long seed) {
        return leaf(seed) + 1;
    }

    static void top(long deadline) {
        long s = 0;
        while (System.nanoTime() < deadline) {
            s += mid(s);
        }
        sink = s;
    }

    // inline: step is small enough that C2 inlines it into inlineTop's
    // loop; inlineLeaf, which it calls, is kept out of line by the tests
    // (CompileCommand dontinline). The stack must still show step as a
    // frame of its own between them. inlineLeaf is short so that
    // inlineTop's loop turns often, and C2 compiles it within a few
    // milliseconds; the clock is read once per 256 turns.
    static long inlineLeaf(long seed) {
        long x = seed;
        for (int i = 0; i < 500; i++) { x = x * 29 + (i ^ (x >>> 3)); } // hot: inlineLeaf
        return x;
    }

    static long step(long x) {
        return inlineLeaf(x ^ (x >>> 7)) + 1; // hot: step
    }

    static void inlineTop(long deadline) {
        long s = 0;
        for (int n = 1; (n & 255) != 0 || System.nanoTime() < deadline; n++) {
            s += step(s);
        }
        sink = s;
    }

    // churn: a class loaded anew by a loader of its own each round, run
    // until the JIT compiled it, then dropped; every few rounds the
    // collector unloads the dropped classes, freeing their methods and
    // compiled code for others to reuse. Each new class also deoptimizes
    // churnTop's compiled call site, which had seen only the earlier ones.
    public interface LongOp {
        long apply(long x);
    }

    public static final class Churn implements LongOp {
        @Override
        public long apply(long seed) {
            long x = seed;
            for (int i = 0; i < 1000; i++) { x = x * 37 + (i ^ (x >>> 5)); } // hot: churnApply
            return x;
        }
    }

    // ChurnLoader defines its own Churn from the class file's bytes and
    // leaves every other class to the application's loader.
    static final class ChurnLoader extends ClassLoader {
        final byte[] churn;

        ChurnLoader(byte[] churn) {
            super(JWorkload.class.getClassLoader());
            this.churn = churn;
        }

        @Override
        protected Class<?> loadClass(String name, boolean resolve) throws ClassNotFoundException {
            if (!name.equals(Churn.class.getName())) {
                return super.loadClass(name, resolve);
            }
            synchronized (getClassLoadingLock(name)) {
                Class<?> c = findLoadedClass(name);
                return c != null ? c : defineClass(name, churn, 0, churn.length);
            }
        }
    }

    static void churnTop(long deadline) throws Exception {
        // Read by hand: InputStream.readAllBytes is JDK 9's.
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        try (InputStream in = JWorkload.class.getResourceAsStream("JWorkload$Churn.class")) {
            byte[] chunk = new byte[4096];
            for (int n; (n = in.read(chunk)) > 0; ) { buf.write(chunk, 0, n); }
        }
        byte[] bytes = buf.toByteArray();
        long s = 0;
        for (int round = 1; System.nanoTime() < deadline; round++) {
            Class<?> c = new ChurnLoader(bytes).loadClass(Churn.class.getName());
            LongOp op = (LongOp) c.getDeclaredConstructor().newInstance();
            for (int i = 0; i < 3000; i++) { s += op.apply(s); } // hot: churnTop
            if (round % 20 == 0) {
                System.gc();
            }
        }
        sink = s;
    }

    // dispatch: calls through the JVM's dispatch code, which makes no frame
    // of its own: an interface call with three receiver classes, which C2
    // leaves to an itable stub, and a method handle read from a field, which
    // it calls through the handle's invokeBasic and linkToStatic intrinsics.
    // The callees are tiny, so that a good share of the samples is in that
    // code.
    static final class Add implements LongOp {
        @Override
        public long apply(long x) { return x + 1; }
    }

    static final class Mul implements LongOp {
        @Override
        public long apply(long x) { return x * 3; }
    }

    static final class Xor implements LongOp {
        @Override
        public long apply(long x) { return x ^ 5; }
    }

    static long viaHandle(long x) { return x - 7; }

    // Not final: the JIT cannot take it for a constant and inline the call.
    static MethodHandle handle;

    static void dispatchTop(long deadline) throws Throwable {
        LongOp[] ops = {new Add(), new Mul(), new Xor()};
        handle = MethodHandles.lookup().findStatic(JWorkload.class, "viaHandle",
                MethodType.methodType(long.class, long.class));
        long s = 0;
        for (int n = 1; (n & 1023) != 0 || System.nanoTime() < deadline; n++) {
            s += ops[n % 3].apply(s);
            s += (long) handle.invokeExact(s);
        }
        sink = s;
    }

    // The thread of chain, inline, churn and dispatch.
    static final class Worker implements Runnable {
        final String mode;
        final long deadline;

        Worker(String mode, long deadline) {
            this.mode = mode;
            this.deadline = deadline;
        }

        @Override
        public void run() {
            try {
                switch (mode) {
                    case "chain": top(deadline); break;
                    case "inline": inlineTop(deadline); break;
                    case "dispatch": dispatchTop(deadline); break;
                    default: churnTop(deadline); break;
                }
            } catch (Throwable e) {
                throw new RuntimeException(e);
            }
        }
    }

    // recursion: 40 levels of recurse above recLeaf.
    static long recurse(int depth, long seed) {
        if (depth == 0) {
            return recLeaf(seed);
        }
        return recurse(depth - 1, seed) + depth;
    }

    static long recLeaf(long seed) {
        long x = seed;
        for (int i = 0; i < LOOP; i++) { x = x * 17 + (i ^ (x >>> 5)); } // hot: recLeaf
        return x;
    }

    static void recursionTop(long deadline) {
        long s = 0;
        while (System.nanoTime() < deadline) {
            s += recurse(40, s);
        }
        sink = s;
    }

    // threads: each thread runs a chain of its own, named after it. Each
    // reads the clock every 16th call: in an emulated arm64 VM its reads
    // took 12% of a thread's samples (JDK 25 on 6.12, 88.2% with the chain).
    static long t0Leaf(long seed) {
        long x = seed;
        for (int i = 0; i < LOOP; i++) { x = x * 31 + i; } // hot: t0Leaf
        return x;
    }

    static long t0Mid(long seed) { return t0Leaf(seed) + 1; }

    static void t0Top(long deadline) {
        long s = 0;
        for (int n = 1; (n & 15) != 0 || System.nanoTime() < deadline; n++) { s += t0Mid(s); }
        sink = s;
    }

    static long t1Leaf(long seed) {
        long x = seed;
        for (int i = 0; i < LOOP; i++) { x = x * 37 + i; } // hot: t1Leaf
        return x;
    }

    static long t1Mid(long seed) { return t1Leaf(seed) + 1; }

    static void t1Top(long deadline) {
        long s = 0;
        for (int n = 1; (n & 15) != 0 || System.nanoTime() < deadline; n++) { s += t1Mid(s); }
        sink = s;
    }

    static long t2Leaf(long seed) {
        long x = seed;
        for (int i = 0; i < LOOP; i++) { x = x * 41 + i; } // hot: t2Leaf
        return x;
    }

    static long t2Mid(long seed) { return t2Leaf(seed) + 1; }

    static void t2Top(long deadline) {
        long s = 0;
        for (int n = 1; (n & 15) != 0 || System.nanoTime() < deadline; n++) { s += t2Mid(s); }
        sink = s;
    }

    static long t3Leaf(long seed) {
        long x = seed;
        for (int i = 0; i < LOOP; i++) { x = x * 43 + i; } // hot: t3Leaf
        return x;
    }

    static long t3Mid(long seed) { return t3Leaf(seed) + 1; }

    static void t3Top(long deadline) {
        long s = 0;
        for (int n = 1; (n & 15) != 0 || System.nanoTime() < deadline; n++) { s += t3Mid(s); }
        sink = s;
    }

    static void threads(long deadline) throws InterruptedException {
        List<Thread> ts = new ArrayList<>();
        ts.add(new Thread(() -> t0Top(deadline), "t0"));
        ts.add(new Thread(() -> t1Top(deadline), "t1"));
        ts.add(new Thread(() -> t2Top(deadline), "t2"));
        ts.add(new Thread(() -> t3Top(deadline), "t3"));
        for (Thread t : ts) { t.start(); }
        for (Thread t : ts) { t.join(); }
    }

    // vthreads: four virtual threads (JDK 21+; started through reflection,
    // the workload compiles for JDK 8) each run vTop -> vMid -> vLeaf and
    // sleep now and then. Mounted again, a virtual thread's frames are
    // thawed onto its carrier's stack lazily: the oldest thawed one returns
    // into the continuation return barrier, not into its caller, which
    // stays frozen in the heap.
    static long vLeaf(long seed) {
        long x = seed;
        for (int i = 0; i < LOOP; i++) { x = x * 47 + (i ^ (x >>> 9)); } // hot: vLeaf
        return x;
    }

    static long vMid(long seed) { return vLeaf(seed) + 1; }

    static void vTop(long deadline) {
        long s = 0;
        for (int n = 1; System.nanoTime() < deadline; n++) {
            s += vMid(s);
            if ((n & 63) == 0) { sleepBriefly(); }
        }
        sink = s;
    }

    // A virtual thread sleeping is unmounted, and mounted again on a free
    // carrier once its time is up.
    static void sleepBriefly() {
        try {
            Thread.sleep(0, 1000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static void vthreads(long deadline) throws Exception {
        Object builder = Thread.class.getMethod("ofVirtual").invoke(null);
        java.lang.reflect.Method start = Class.forName("java.lang.Thread$Builder").getMethod("start", Runnable.class);
        List<Thread> ts = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            Runnable r = () -> vTop(deadline);
            ts.add((Thread) start.invoke(builder, r));
        }
        for (Thread t : ts) { t.join(); }
    }

    // zlib: Java calls into the JDK's native zip library (JNI), which
    // calls zlib: native frames beneath a Java frame.
    static void compress(byte[] in, byte[] out) {
        Deflater d = new Deflater(9);
        d.setInput(in);
        d.finish();
        while (!d.finished()) { d.deflate(out); } // hot: compress
        d.end();
    }

    static void zlibTop(long deadline) {
        byte[] in = new byte[1 << 20];
        java.util.Random r = new java.util.Random(1);
        for (int i = 0; i < in.length; i++) { in[i] = (byte) ('a' + r.nextInt(4)); }
        byte[] out = new byte[1 << 21];
        while (System.nanoTime() < deadline) { compress(in, out); }
    }

    // offcpu: threads that wait in known places: one sleeps 10 ms at a time
    // in offSleepLeaf, one reads a pipe in offPipeLeaf (a feeder writes to
    // it every 20 ms), one takes a lock in offLockLeaf (a holder keeps it
    // 15 ms at a time, sleeping), one spins in offBusyLeaf. Each sums the
    // time its waiting calls took when they blocked (50 us or more) and
    // prints "thread NAME TID WAITED_NS".
    interface Wait { void run() throws Exception; }

    static void offSleepLeaf() throws Exception {
        Thread.sleep(10); // hot: offSleepLeaf
    }

    static void offSleepMid() throws Exception { offSleepLeaf(); }

    static java.nio.channels.Pipe offPipe;
    static final java.nio.ByteBuffer offByte = java.nio.ByteBuffer.allocate(1);

    static void offPipeLeaf() throws Exception {
        offByte.clear();
        offPipe.source().read(offByte); // hot: offPipeLeaf
    }

    static void offPipeMid() throws Exception { offPipeLeaf(); }

    static final java.util.concurrent.locks.ReentrantLock offLock = new java.util.concurrent.locks.ReentrantLock();

    static void offLockLeaf() {
        offLock.lock(); // hot: offLockLeaf
        offLock.unlock();
    }

    static void offLockMid() { offLockLeaf(); }

    static void offBusyLeaf() {
        long x = 0;
        for (int i = 0; i < LOOP; i++) { x += i ^ (x >>> 3); } // hot: offBusyLeaf
        sink = x;
    }

    static void offBusyMid() { offBusyLeaf(); }

    // The thread's kernel id, from /proc/thread-self ("PID/task/TID").
    static String tid() throws Exception {
        String self = java.nio.file.Files.readSymbolicLink(java.nio.file.Paths.get("/proc/thread-self")).toString();
        return self.substring(self.lastIndexOf('/') + 1);
    }

    static Thread offWaiter(final String name, final Wait wait, final boolean blocks, final long deadline,
            final List<String> results) {
        return new Thread(new Runnable() {
            public void run() {
                try {
                    String tid = tid();
                    long waited = 0;
                    while (System.nanoTime() < deadline) {
                        long t0 = System.nanoTime();
                        wait.run();
                        long took = System.nanoTime() - t0;
                        if (blocks && took >= 50000) { waited += took; }
                    }
                    synchronized (results) { results.add("thread " + name + " " + tid + " " + waited); }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            }
        }, "off-" + name);
    }

    static void offCPU(final long deadline) throws Exception {
        offPipe = java.nio.channels.Pipe.open();
        final long helpersUntil = deadline + 100000000L;
        Thread feeder = new Thread(new Runnable() {
            public void run() {
                try {
                    while (System.nanoTime() < helpersUntil) {
                        Thread.sleep(20);
                        offPipe.sink().write(java.nio.ByteBuffer.wrap(new byte[] {'x'}));
                    }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            }
        });
        Thread holder = new Thread(new Runnable() {
            public void run() {
                try {
                    while (System.nanoTime() < helpersUntil) {
                        offLock.lock();
                        try { Thread.sleep(15); } finally { offLock.unlock(); }
                        Thread.sleep(1);
                    }
                } catch (Exception e) {
                    throw new RuntimeException(e);
                }
            }
        });
        List<String> results = new ArrayList<String>();
        List<Thread> threads = new ArrayList<Thread>();
        threads.add(feeder);
        threads.add(holder);
        threads.add(offWaiter("sleep", new Wait() { public void run() throws Exception { offSleepMid(); } }, true, deadline, results));
        threads.add(offWaiter("pipe", new Wait() { public void run() throws Exception { offPipeMid(); } }, true, deadline, results));
        threads.add(offWaiter("lock", new Wait() { public void run() { offLockMid(); } }, true, deadline, results));
        threads.add(offWaiter("busy", new Wait() { public void run() { offBusyMid(); } }, false, deadline, results));
        for (Thread t : threads) { t.start(); }
        for (Thread t : threads) { t.join(); }
        for (String r : results) { System.out.println(r); }
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        // An optional warm-up first (seconds): the mode runs that long
        // before its hot phase, which then starts with its code compiled.
        if (args.length > 2) {
            run(mode, System.nanoTime() + (long) (Double.parseDouble(args[2]) * 1e9));
        }
        long deadline = System.nanoTime() + (long) (Double.parseDouble(args[1]) * 1e9);
        // The first run of the line's string concatenation links it (a
        // bootstrap method) and loads the classes that format a double:
        // done before the clock is read.
        phaseLine("from", System.currentTimeMillis());
        System.out.println(phaseLine("from", System.currentTimeMillis()));
        System.out.flush();
        run(mode, deadline);
        System.out.println(phaseLine("to", System.currentTimeMillis()));
        System.out.flush();
    }

    static void run(String mode, long deadline) throws Exception {
        switch (mode) {
            case "chain":
            case "inline":
            case "churn":
            case "dispatch":
                Thread w = new Thread(new Worker(mode, deadline), "worker");
                w.start();
                w.join();
                break;
            case "recursion": recursionTop(deadline); break;
            case "threads": threads(deadline); break;
            case "vthreads": vthreads(deadline); break;
            case "zlib": zlibTop(deadline); break;
            case "offcpu": offCPU(deadline); break;
            default: throw new IllegalArgumentException("unknown mode " + mode);
        }
    }

    static String phaseLine(String edge, long millis) {
        return "hot phase " + edge + " " + millis / 1000.0;
    }
}
