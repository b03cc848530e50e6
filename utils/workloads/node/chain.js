// A three-function JavaScript chain, top -> mid -> leaf, each hot enough
// for V8 to optimize it. Run with --perf-basic-prof --no-turbo-inlining,
// each function keeps a JIT frame of its own that the perf map names.
// Usage: node chain.js SECONDS
function leaf(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s += i % 7;
  return s;
}

function mid(n) {
  return leaf(n) + 1;
}

function top(n) {
  return mid(n) + 1;
}

const deadline = Date.now() + Number(process.argv[2] || 5) * 1000;
let sink = 0;
console.log('ready');
while (Date.now() < deadline) {
  for (let j = 0; j < 1000; j++) sink += top(1000);
}
if (sink < 0) console.log(sink);
