// The V8 unwinder's workload: hot JavaScript in known functions and lines
// ("// hot: NAME" marks the line a sample of NAME should name).
// Usage: node [flags] v8work.js MODE SECONDS
//   chain    top -> mid -> leaf, plain functions (TurboFan inlines leaf and
//            mid into top with default flags)
//   shapes   a class method, a constructor, an arrow function and an
//            anonymous function expression, each hot
//   workers  two worker threads running different chains (wa*, wb*)
//   gc       closures allocated in a loop, the garbage collector busy
//   async    an async function awaiting resolved promises in a loop
//   offcpu   off-CPU profiling: a worker waits 10 ms at a time in
//            Atomics.wait under offWaitMid -> offWaitLeaf, while the main
//            thread's event loop runs a 1 ms timer job every 10 ms (it
//            waits in epoll_wait between them); prints "worker waited NS
//            from MS": the time the worker measured in its waits that
//            began after MS (unix milliseconds), a second after its start
// It prints "hot phase from <unix seconds> to <unix seconds>": from half a
// second after it starts its hot loop (in workers mode, once both workers
// are ready to) to its end. With WORKLOAD_HOLD set it then prints
// "holding" and stays, its memory readable, until its standard input ends.
'use strict';
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');

function leaf(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s += (i * 7) % 13; // hot: leaf
  return s;
}

function mid(n) {
  return leaf(n) + 1; // hot: mid
}

function top(n) {
  return mid(n) + 1; // hot: top
}

class Shape {
  constructor(n) {
    this.n = 0;
    for (let i = 0; i < n; i++) this.n += i % 5; // hot: Shape
  }
  area(n) {
    let a = 0;
    for (let i = 0; i < n; i++) a += (i * this.n) % 11; // hot: Shape.area
    return a;
  }
}

const arrow = (n) => {
  let s = 0;
  for (let i = 0; i < n; i++) s ^= i * 31; // hot: arrow
  return s;
};

// Passed through a call, the function expression gets no name, not even
// an inferred one (V8 infers "anon" for "const anon = [function…][0]").
function id(f) {
  return f;
}
const anon = id(function (n) {
  let s = 0;
  for (let i = 0; i < n; i++) s += i & 3; // hot: anonymous
  return s;
});

function waLeaf(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s += (i * 3) % 17; // hot: waLeaf
  return s;
}
function waTop(n) { return waLeaf(n) + 1; } // hot: waTop

function wbLeaf(n) {
  let s = 1;
  for (let i = 0; i < n; i++) s = (s * 5 + i) % 1000003; // hot: wbLeaf
  return s;
}
function wbTop(n) { return wbLeaf(n) + 2; } // hot: wbTop

function makeAdder(k) {
  return (x) => (x + k) & 0xffff; // hot: adder
}

// Closures kept in a ring, so that they escape and the young generation
// fills and is collected all the time.
const ring = new Array(4096).fill(makeAdder(0));

function churn(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    ring[i & 4095] = makeAdder(i); // hot: churn
    s = ring[(i * 7) & 4095](s);
  }
  return s;
}

async function step(i) {
  await null;
  let s = 0;
  for (let j = 0; j < 2000; j++) s += (i + j) % 7; // hot: step
  return s;
}

async function asyncLoop(deadline) {
  let sink = 0;
  while (Date.now() < deadline) sink += await step(sink & 0xff);
  return sink;
}

function loop(deadline, body) {
  let sink = 0;
  while (Date.now() < deadline) {
    for (let j = 0; j < 20; j++) sink += body(10000);
  }
  return sink;
}

// announce prints the hot phase of a run that began now and ends at
// deadline. The first half second is start-up (the profiler attaching,
// the first tiers of code): the hot phase begins after it.
function announce(deadline) {
  const from = (Date.now() + 500) / 1000;
  console.log('hot phase from ' + from.toFixed(3) + ' to ' + (deadline / 1000).toFixed(3));
}

// done ends the run, holding first if asked to.
function done() {
  if (!process.env.WORKLOAD_HOLD) return;
  console.log('holding');
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
}

// workers runs the two worker chains for seconds from when both workers
// are ready: a worker's start (an isolate of its own, deserialized from
// the snapshot) takes seconds under emulation.
function workers(seconds) {
  const ws = ['a', 'b'].map((which) => new Worker(__filename, { workerData: { which } }));
  let ready = 0;
  let exited = 0;
  for (const w of ws) {
    w.on('error', (e) => { console.error(e); process.exit(1); });
    w.on('message', () => {
      if (++ready < ws.length) return;
      const deadline = Date.now() + seconds * 1000;
      announce(deadline);
      for (const x of ws) x.postMessage(deadline);
    });
    w.on('exit', () => { if (++exited === ws.length) done(); });
  }
}

function offWaitLeaf(cell) {
  const t0 = process.hrtime.bigint();
  Atomics.wait(cell, 0, 0, 10); // hot: offWaitLeaf
  return process.hrtime.bigint() - t0;
}

function offWaitMid(cell) {
  return offWaitLeaf(cell); // hot: offWaitMid
}

// offCPU runs the offcpu mode for seconds.
function offCPU(seconds) {
  const deadline = Date.now() + seconds * 1000;
  const w = new Worker(__filename, { workerData: { which: 'offcpu', deadline } });
  w.on('error', (e) => { console.error(e); process.exit(1); });
  w.on('message', (waited) => console.log('worker waited ' + waited));
  const tick = () => {
    const until = Date.now() + 1;
    while (Date.now() < until);
    if (Date.now() < deadline) setTimeout(tick, 10);
  };
  setTimeout(tick, 10);
}

function main() {
  const mode = process.argv[2];
  const seconds = Number(process.argv[3] || 5);
  if (mode === 'offcpu') {
    offCPU(seconds);
    return;
  }
  const bodies = {
    chain: top,
    shapes: (n) => new Shape(n).area(n) + arrow(n) + anon(n),
    gc: (n) => churn(n) | 0,
  };
  if (mode === 'workers') {
    workers(seconds);
    return;
  }
  const deadline = Date.now() + seconds * 1000;
  if (mode === 'async') {
    announce(deadline);
    asyncLoop(deadline).then((s) => { if (s < 0) console.log(s); done(); });
    return;
  }
  if (!bodies[mode]) {
    console.error('unknown mode ' + mode);
    process.exit(2);
  }
  announce(deadline);
  const sink = loop(deadline, bodies[mode]);
  if (sink < 0) console.log(sink);
  done();
}

if (isMainThread) {
  main();
} else if (workerData.which === 'offcpu') {
  // The first second is start-up (the profiler reading a new process):
  // its waits are not counted.
  const cell = new Int32Array(new SharedArrayBuffer(4));
  const from = Date.now() + 1000;
  let waited = 0n;
  while (Date.now() < workerData.deadline) {
    const w = offWaitMid(cell);
    if (Date.now() >= from + 10) waited += w;
  }
  parentPort.postMessage(waited.toString() + ' from ' + from);
} else {
  parentPort.postMessage('ready');
  parentPort.once('message', (deadline) => {
    const sink = loop(deadline, workerData.which === 'a' ? waTop : wbTop);
    if (sink < 0) console.log(sink);
    process.exit(0);
  });
}
