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
// It prints "hot phase from <unix seconds>": half a second after it
// starts its hot loop.
'use strict';
const { Worker, isMainThread, workerData } = require('worker_threads');

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

function main() {
  const mode = process.argv[2];
  const deadline = Date.now() + Number(process.argv[3] || 5) * 1000;
  const bodies = {
    chain: top,
    shapes: (n) => new Shape(n).area(n) + arrow(n) + anon(n),
    gc: (n) => churn(n) | 0,
  };
  // The first half second is start-up (node loading its modules, the
  // profiler attaching): the hot phase begins after it.
  console.log('hot phase from ' + ((Date.now() + 500) / 1000).toFixed(3));
  if (mode === 'workers') {
    const ws = ['a', 'b'].map((which) => new Worker(__filename, { workerData: { which, deadline } }));
    for (const w of ws) w.on('error', (e) => { console.error(e); process.exit(1); });
    return;
  }
  if (mode === 'async') {
    asyncLoop(deadline).then((s) => { if (s < 0) console.log(s); });
    return;
  }
  if (!bodies[mode]) {
    console.error('unknown mode ' + mode);
    process.exit(2);
  }
  const sink = loop(deadline, bodies[mode]);
  if (sink < 0) console.log(sink);
}

if (isMainThread) {
  main();
} else {
  const sink = loop(workerData.deadline, workerData.which === 'a' ? waTop : wbTop);
  if (sink < 0) console.log(sink);
}
