// The web view's page: header, filters, timeline, flame graph, top
// functions and the differential view, all drawn from the JSON API that
// reporter/webview/api.md describes. The daemon embeds this file as it is:
// no dependencies, no build step, and only relative URLs, so the page also
// works behind a path prefix.

const ROW = 18;             // flame graph row height, CSS px
const MIN_W = 0.5;          // narrower frames are not drawn (nor their children)
const LABEL_MIN_W = 22;     // narrower frames get no label
const LIVE_MS = 5000;       // refresh period while live
const TOP_LIMIT = 200;      // rows of the top functions table
const DIFF_FULL = 0.05;     // a change of share this large gets the strongest colour
const DIFF_SAME = 0.0005;   // a smaller change counts as unchanged
const MATCH_COLOR = 'hsl(300 68% 62%)';
const TEXT_COLOR = '#1b1f24';
const TL_AXIS = 15;         // timeline: height of the time axis under the bars

const $ = (id) => document.getElementById(id);

const state = {
  view: 'flame',        // 'flame' | 'top' | 'diff'
  icicle: false,
  live: true,
  range: null,          // [from, to) in ms; null: the whole store
  baseRange: null,      // the baseline's [from, to) in diff mode
  baseMode: 'range',    // 'range' | 'process'
  baseProc: '',   // 'pid:N' or 'name:EXE', as state.proc
  dragTarget: 'base',   // what a drag on the timeline sets in diff/range mode
  proc: '', container: '', thread: '', kinds: new Set(),   // proc: 'pid:N' or 'name:EXE'
  label: '',            // 'key=value': samples with that label
  namespace: '', pod: '',   // Kubernetes: pod is 'namespace/name'
  service: '',          // service.name
  trace: '',            // a trace id (32 hex digits): the samples taken in it
  measure: 'cpu',       // 'cpu' | 'offcpu' | 'wall' | 'inuse' | 'alloc' (api.md: measure)

  group: '',            // the flame graph's first level: '' (executables), 'container', 'thread', 'label:KEY'
  search: '',
  focus: [],            // ids from below the root to the zoomed node
  sort: 'self',
  summary: null,
  timeline: null,
  flame: null,          // prepareFlame's result
  drag: null,           // timeline drag in progress: {x0, x1}
  timelinePeak: '',     // the timeline's scale, shown when not hovering
  timelineHover: false,
};

// ---------------------------------------------------------------------------
// Hooks for the browser tests (WebDriver). See the end of the file for the
// two functions.

const hooks = {
  ready: false,         // a flame graph with data has been drawn
  firstDrawMs: null,    // performance.now() at that first draw
  lastDrawMs: null,     // how long the last flame draw took
  nodesDrawn: 0,
  rootName: null,
  focus: [],
  lastFetchBytes: 0,    // size of the last api/flame response
  draws: 0,             // flame draws so far, to wait for a redraw
  get pending() { return busy; },  // API requests in flight
};
window.__profiler = hooks;

// ---------------------------------------------------------------------------
// Formatting

const fmtInt = (n) => Math.round(n).toLocaleString('en-US');

// A count of the current measure: samples, (offcpu, wall) time in the
// summary's offCPUUnitNs, or (inuse, alloc) bytes.
function countsTime() {
  return state.measure === 'offcpu' || state.measure === 'wall';
}

function countsBytes() {
  return state.measure === 'inuse' || state.measure === 'alloc';
}

function fmtBytes(n) {
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(2)} GiB`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KiB`;
  return `${Math.round(n)} B`;
}

function fmtNs(ns) {
  if (ns >= 1e9) return `${(ns / 1e9).toFixed(ns >= 1e11 ? 0 : 2)} s`;
  if (ns >= 1e6) return `${(ns / 1e6).toFixed(ns >= 1e8 ? 0 : 1)} ms`;
  return `${(ns / 1e3).toFixed(0)} µs`;
}

// A count as a number: samples, a time, or bytes.
function fmtNum(n) {
  if (countsBytes()) return fmtBytes(n);
  return countsTime() ? fmtNs(n * (state.summary?.offCPUUnitNs || 100000)) : fmtInt(n);
}

// A count with its unit: "1,234 samples", "1.23 s off the CPU", "64.0 MiB
// in use".
function fmtCount(n) {
  if (countsBytes()) return `${fmtBytes(n)} ${state.measure === 'inuse' ? 'in use' : 'allocated'}`;
  if (!countsTime()) return `${fmtInt(n)} samples`;
  return `${fmtNum(n)} ${state.measure === 'wall' ? 'wall time' : 'off the CPU'}`;
}
const pad2 = (n) => String(n).padStart(2, '0');

function fmtTime(ms) {
  const d = new Date(ms);
  return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`;
}

function fmtDateTime(ms) {
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())} ${fmtTime(ms)}`;
}

function fmtDuration(ms) {
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function fmtRange([from, to]) {
  return `${fmtTime(from)} – ${fmtTime(to)} (${fmtDuration(to - from)})`;
}

// A share as a percentage: small shares keep two decimals so they do not
// all read "0.0%".
function pct(part, whole) {
  if (!whole) return '–';
  const p = (100 * part) / whole;
  return `${p > 0 && p < 1 ? p.toFixed(2) : p.toFixed(1)}%`;
}

// A change of share in percentage points, signed.
function fmtDelta(d) {
  const pp = d * 100;
  if (Math.abs(pp) < DIFF_SAME * 100) return '±0';
  return `${pp > 0 ? '+' : '−'}${Math.abs(pp).toFixed(Math.abs(pp) < 1 ? 2 : 1)} pp`;
}

// A DOM element: string props become attributes, other values (checked,
// colSpan) properties, on* props listeners.
function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k in e && typeof v !== 'string') e[k] = v;
    else e.setAttribute(k, v);
  }
  e.append(...children.filter((c) => c != null));
  return e;
}

// ---------------------------------------------------------------------------
// API access. Each channel (summary, flame, …) has at most one request in
// flight: a newer one aborts the older, so a slow answer never overwrites
// a newer one. Failures go to the visible error line, per channel, and a
// channel's next success clears its message.

const controllers = {};
const errors = new Map();
let busy = 0;

async function getJSON(channel, path, params) {
  controllers[channel]?.abort();
  const ctl = new AbortController();
  controllers[channel] = ctl;
  const qs = params.toString();
  busy++;
  try {
    const res = await fetch(`api/${path}${qs ? `?${qs}` : ''}`, { signal: ctl.signal });
    const buf = await res.arrayBuffer();
    const text = new TextDecoder().decode(buf);
    if (ctl.signal.aborted) return null;
    if (!res.ok) throw new Error(`${res.status} ${res.statusText}: ${text.trim() || '(no message)'}`);
    const data = JSON.parse(text);
    showError(channel, null);
    return { data, bytes: buf.byteLength };
  } catch (err) {
    if (err.name !== 'AbortError') showError(channel, `api/${path}: ${err.message}`);
    return null;
  } finally {
    busy--;
    if (controllers[channel] === ctl) controllers[channel] = null;
  }
}

function showError(channel, msg) {
  if (msg) errors.set(channel, msg);
  else errors.delete(channel);
  const box = $('error');
  box.textContent = [...errors.values()].join('\n');
  box.hidden = errors.size === 0;
}

// The filters without the time range: the timeline always spans the whole
// store so that a range can be picked from it.
function filterParams() {
  const p = new URLSearchParams();
  addProcess(p, '', state.proc);
  if (state.container) p.append('container', state.container);
  if (state.thread) p.append('thread', state.thread);
  if (state.label) p.append('label', state.label);
  if (state.service) p.append('service', state.service);
  if (state.trace) p.append('trace', state.trace);
  if (state.measure !== 'cpu') p.append('measure', state.measure);
  if (state.namespace) p.append('namespace', state.namespace);
  if (state.pod) p.append('pod', state.pod);
  for (const k of state.kinds) p.append('kind', k);
  return p;
}

function selectionParams() {
  const p = filterParams();
  if (state.range) {
    p.set('from', state.range[0]);
    p.set('to', state.range[1]);
  }
  return p;
}

// Adds a process choice of the selects: one pid, or every process of an
// executable.
function addProcess(p, prefix, choice) {
  const [kind, value] = [choice.slice(0, choice.indexOf(':')), choice.slice(choice.indexOf(':') + 1)];
  if (kind === 'pid') p.set(`${prefix}pid`, value);
  else if (kind === 'name') p.set(`${prefix}process`, value);
}

// Adds the baseline's base_ parameters; false when none is chosen yet.
// Absent base_ parameters take the main selection's values (api.md).
function addBaseline(p) {
  if (state.baseMode === 'process') {
    if (!state.baseProc) return false;
    addProcess(p, 'base_', state.baseProc);
    return true;
  }
  if (!state.baseRange) return false;
  p.set('base_from', state.baseRange[0]);
  p.set('base_to', state.baseRange[1]);
  return true;
}

function baselineHint() {
  return state.baseMode === 'process'
    ? 'Choose a baseline process above to compare with.'
    : 'Drag on the timeline to choose the baseline time range to compare with.';
}

// ---------------------------------------------------------------------------
// Header

async function loadSummary() {
  const r = await getJSON('summary', 'summary', new URLSearchParams());
  if (!r) return;
  const s = (state.summary = r.data);
  $('host').textContent = s.host || '';
  $('version').textContent = s.version || '';
  document.title = s.host ? `${s.host} · ebpf-profiler` : 'ebpf-profiler';
  const cov = $('coverage');
  cov.textContent = s.end ? fmtRange([s.start, s.end]) : 'none yet';
  cov.title = s.end ? `${fmtDateTime(s.start)} – ${fmtDateTime(s.end)}` : '';
  $('samples').textContent = fmtInt(s.samples || 0);
  if (storeEmpty()) renderFlameEmpty();
}

function storeEmpty() {
  return state.summary != null && !state.summary.samples && !state.summary.heapProfiles;
}

// The daemon's reporter interval, from the summary.
function reportEverySeconds() {
  return state.summary?.intervalSeconds || 5;
}

function updateDownloads() {
  const qs = selectionParams().toString();
  $('dl-pprof').href = `api/pprof${qs ? `?${qs}` : ''}`;
  $('dl-collapsed').href = `api/collapsed${qs ? `?${qs}` : ''}`;
}

// ---------------------------------------------------------------------------
// Filters

async function loadFilters() {
  const r = await getJSON('filters', 'filters', selectionParams());
  if (!r) return;
  const f = r.data;
  const procs = processOptions(f.processes || []);
  fillSelect($('f-process'), 'All processes', procs, state.proc);
  fillSelect($('base-process'), 'Choose a process…', procs, state.baseProc);
  fillSelect($('f-container'), 'All containers',
    (f.containers || []).map((c) => [c.id, c.id.length > 12 ? c.id.slice(0, 12) : c.id]), state.container);
  fillSelect($('f-thread'), 'All threads', (f.threads || []).map((t) => [t.name, t.name]), state.thread);
  const labels = (f.labels || []).map((l) => l.name);
  fillSelect($('f-label'), 'All labels', labels.map((l) => [l, l]), state.label);
  const keys = [...new Set(labels.map((l) => l.slice(0, l.indexOf('='))))].sort();
  fillSelect($('f-service'), 'All services', (f.services || []).map((n) => [n.name, n.name]), state.service);
  fillSelect($('f-namespace'), 'All namespaces', (f.namespaces || []).map((n) => [n.name, n.name]), state.namespace);
  fillSelect($('f-pod'), 'All pods', (f.pods || []).map((n) => [n.name, n.name]), state.pod);
  fillSelect($('f-group'), 'executable', [['container', 'container'], ['service', 'service'], ['pod', 'pod'],
    ['namespace', 'namespace'],
    ['thread', 'thread name'],
    ...keys.map((k) => [`label:${k}`, `label ${k}`])], state.group);
  fillKinds((f.kinds || []).map((k) => k.name));
}

// The process choices: each process by name and pid, and before them each
// executable that runs as several processes (php-fpm's workers, say) as
// one choice.
function processOptions(list) {
  const pids = new Map();
  for (const p of list) pids.set(p.name, (pids.get(p.name) || 0) + 1);
  const opts = [];
  for (const [name, n] of pids) if (n > 1) opts.push([`name:${name}`, `${name} (all ${n} processes)`]);
  for (const p of list) opts.push([`pid:${p.pid}`, `${p.name} (${p.pid})`]);
  return opts;
}

// Rebuilds a select only when its options changed, so that the live
// refresh does not close a list the user has open. A chosen value that is
// no longer offered stays, marked.
function fillSelect(sel, allLabel, items, current) {
  const opts = [['', allLabel], ...items];
  if (current && !items.some(([v]) => v === current)) opts.push([current, `${current} (no samples here)`]);
  const key = JSON.stringify(opts);
  if (sel.dataset.key === key) return;
  sel.dataset.key = key;
  sel.replaceChildren(...opts.map(([v, label]) => new Option(label, v, false, v === current)));
  sel.value = current;
}

function fillKinds(names) {
  const box = $('f-kinds');
  const all = [...new Set([...names, ...state.kinds])];
  const key = all.join('\n');
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.querySelectorAll('label').forEach((l) => l.remove());
  for (const name of all) {
    const cb = el('input', { type: 'checkbox', value: name, checked: state.kinds.has(name) });
    box.append(el('label', {}, cb, name));
  }
}

function onFilterChange() {
  state.proc = $('f-process').value;
  state.container = $('f-container').value;
  state.thread = $('f-thread').value;
  state.label = $('f-label').value;
  state.service = $('f-service').value;
  state.namespace = $('f-namespace').value;
  state.pod = $('f-pod').value;
  if ($('f-group').value !== state.group) {
    state.group = $('f-group').value;
    state.focus = [];   // the tree's paths start elsewhere
  }
  state.kinds = new Set([...$('f-kinds').querySelectorAll('input:checked')].map((c) => c.value));
  // The filters' lists count the measure: another one lists others.
  const measured = $('f-measure').value !== state.measure;
  state.measure = $('f-measure').value;
  selectionChanged({ filters: measured });
}

// Everything that depends on the selection is fetched again.
function selectionChanged({ filters = true } = {}) {
  updateDownloads();
  updateRangeLabel();
  loadTimeline();
  if (filters) loadFilters();
  loadView();
}

// ---------------------------------------------------------------------------
// Canvas helper: sizes the backing store by devicePixelRatio so that lines
// and text stay crisp, and draws in CSS pixels.

function setupCanvas(canvas, w, h) {
  const dpr = window.devicePixelRatio || 1;
  canvas.style.height = `${h}px`;
  canvas.width = Math.max(1, Math.round(w * dpr));
  canvas.height = Math.max(1, Math.round(h * dpr));
  const ctx = canvas.getContext('2d');
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  return ctx;
}

function uiFont(px, weight = '') {
  return `${weight} ${px}px ${getComputedStyle(document.body).fontFamily}`.trim();
}

// ---------------------------------------------------------------------------
// Timeline

async function loadTimeline() {
  const p = filterParams();
  const width = $('timeline').clientWidth || 600;
  p.set('buckets', Math.max(10, Math.min(2000, Math.floor(width / 3))));
  const r = await getJSON('timeline', 'timeline', p);
  if (!r) return;
  state.timeline = r.data;
  drawTimeline();
}

function timelineSpan() {
  const tl = state.timeline;
  return tl && tl.counts?.length ? { t0: tl.start, span: tl.step * tl.counts.length } : null;
}

function drawTimeline() {
  const c = $('timeline');
  const w = c.clientWidth;
  const h = c.clientHeight || 72;
  const ctx = setupCanvas(c, w, h);
  const tl = state.timeline;
  const sp = timelineSpan();
  ctx.font = uiFont(11);
  ctx.fillStyle = '#f7f8fa';
  ctx.fillRect(0, 0, w, h - TL_AXIS);
  if (!sp) {
    ctx.fillStyle = '#667080';
    ctx.fillText('no samples yet', 8, (h - TL_AXIS) / 2 + 4);
    return;
  }
  const plotH = h - TL_AXIS;
  const max = tl.counts.reduce((a, b) => Math.max(a, b), 1);
  const bw = w / tl.counts.length;
  ctx.fillStyle = '#8ea3c2';
  tl.counts.forEach((n, i) => {
    const bh = (n / max) * (plotH - 6);
    if (bh > 0) ctx.fillRect(i * bw, plotH - bh, Math.max(bw - 0.6, 0.6), bh);
  });
  drawTimeAxis(ctx, sp, w, plotH);
  // Bytes are a level (the last heap profiles), not a count per step.
  state.timelinePeak = countsBytes() ? `peak ${fmtCount(max)}` : `peak ${fmtCount(max)} per ${fmtDuration(tl.step)}`;
  if (!state.timelineHover) $('tl-hover').textContent = state.timelinePeak;
  const css = getComputedStyle(document.documentElement);
  if (state.view === 'diff' && state.baseMode === 'range' && state.baseRange) {
    shadeRange(ctx, sp, w, plotH, state.baseRange, css.getPropertyValue('--base-range'));
  }
  if (state.range) shadeRange(ctx, sp, w, plotH, state.range, css.getPropertyValue('--main-range'));
  if (state.drag) {
    const color = dragSetsBaseline() ? '--base-range' : '--main-range';
    const [a, b] = [state.drag.x0, state.drag.x1].sort((p, q) => p - q);
    shadeRange(ctx, sp, w, plotH, [xToTime(a, w), xToTime(b, w)], css.getPropertyValue(color));
  }
}

function timeToX(t, w) {
  const sp = timelineSpan();
  return ((t - sp.t0) / sp.span) * w;
}

function xToTime(x, w) {
  const sp = timelineSpan();
  return sp.t0 + (Math.min(Math.max(x, 0), w) / w) * sp.span;
}

function shadeRange(ctx, sp, w, plotH, [from, to], color) {
  const x0 = Math.max(0, timeToX(from, w));
  const x1 = Math.min(w, timeToX(to, w));
  ctx.save();
  ctx.fillStyle = color.trim();
  ctx.globalAlpha = 0.18;
  ctx.fillRect(x0, 0, x1 - x0, plotH);
  ctx.globalAlpha = 1;
  ctx.fillRect(x0, 0, 1.5, plotH);
  ctx.fillRect(x1 - 1.5, 0, 1.5, plotH);
  ctx.restore();
}

// Ticks at a round step that gives about one label per 110 px.
function drawTimeAxis(ctx, { t0, span }, w, plotH) {
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  const want = (span / 1000) / Math.max(1, w / 110);
  const step = (steps.find((s) => s >= want) || 86400) * 1000;
  const tz = new Date(t0).getTimezoneOffset() * 60000;  // round in local time
  ctx.fillStyle = '#667080';
  ctx.strokeStyle = '#c9ced6';
  ctx.beginPath();
  ctx.moveTo(0, plotH + 0.5);
  ctx.lineTo(w, plotH + 0.5);
  for (let t = Math.ceil((t0 - tz) / step) * step + tz; t < t0 + span; t += step) {
    const x = Math.round(((t - t0) / span) * w) + 0.5;
    ctx.moveTo(x, plotH);
    ctx.lineTo(x, plotH + 4);
    const label = step >= 60000 ? fmtTime(t).slice(0, 5) : fmtTime(t);
    if (x > 16 && x < w - 30) ctx.fillText(label, x + 3, plotH + 12);
  }
  ctx.stroke();
}

function dragSetsBaseline() {
  return state.view === 'diff' && state.baseMode === 'range' && state.dragTarget === 'base';
}

function initTimeline() {
  const c = $('timeline');
  const x = (e) => e.clientX - c.getBoundingClientRect().left;
  c.addEventListener('pointerdown', (e) => {
    if (!timelineSpan() || e.button !== 0) return;
    c.setPointerCapture(e.pointerId);
    state.drag = { x0: x(e), x1: x(e) };
  });
  c.addEventListener('pointermove', (e) => {
    if (!timelineSpan()) return;
    if (state.drag) {
      state.drag.x1 = x(e);
      drawTimeline();
    }
    showTimelineHover(x(e), c.clientWidth);
  });
  c.addEventListener('pointerup', () => {
    const d = state.drag;
    state.drag = null;
    if (d && Math.abs(d.x1 - d.x0) >= 3) {
      const w = c.clientWidth;
      const [a, b] = [d.x0, d.x1].sort((p, q) => p - q);
      setRange(xToTime(a, w), xToTime(b, w));
    } else {
      drawTimeline();
    }
  });
  c.addEventListener('pointerleave', () => {
    state.timelineHover = false;
    $('tl-hover').textContent = state.timelinePeak || '';
  });
}

function showTimelineHover(x, w) {
  const tl = state.timeline;
  const i = Math.min(tl.counts.length - 1, Math.max(0, Math.floor((x / w) * tl.counts.length)));
  const t = tl.start + i * tl.step;
  state.timelineHover = true;
  $('tl-hover').textContent = `${fmtTime(t)}: ${fmtCount(tl.counts[i])}`;
}

// A dragged range, whole seconds ([from, to) has one-second resolution).
function setRange(from, to) {
  const r = [Math.floor(from / 1000) * 1000, Math.ceil(to / 1000) * 1000];
  if (dragSetsBaseline()) {
    state.baseRange = r;
    updateRangeLabel();
    drawTimeline();
    loadView();
    return;
  }
  state.range = r;
  setLive(false);
  selectionChanged();
}

function updateRangeLabel() {
  const label = $('range-label');
  const main = state.range ? fmtRange(state.range) : `whole store${state.live ? ', live' : ''}`;
  label.replaceChildren('Selection: ', el('span', { class: 'main' }, main));
  if (state.view === 'diff' && state.baseMode === 'range') {
    const base = state.baseRange ? fmtRange(state.baseRange) : 'none';
    label.append('  ·  Baseline: ', el('span', { class: 'base' }, base));
  }
  $('base-range').textContent = state.baseRange ? fmtRange(state.baseRange) : '';
  $('base-clear').hidden = !state.baseRange;
}

// ---------------------------------------------------------------------------
// Live mode: follow the newest data over the whole range. A refresh is
// skipped while an earlier one is still in flight.

function setLive(on) {
  state.live = on;
  if (on) state.range = null;
  const b = $('live');
  b.setAttribute('aria-pressed', String(on));
  b.textContent = on ? '● Live' : 'Live';
  updateRangeLabel();
}

function refreshAll() {
  loadSummary();
  loadTimeline();
  loadFilters();
  loadView();
}

setInterval(() => {
  if (state.live && !document.hidden && busy === 0) refreshAll();
}, LIVE_MS);

// ---------------------------------------------------------------------------
// Frame colours: a fixed hue per kind, with a small per-name variation in
// lightness and hue so that neighbouring frames can be told apart. The
// runtimes' kinds go by their registered names, which may differ from the
// spec's (cpython, jvm): the aliases map those.

const KIND_ALIASES = { cpython: 'python', jvm: 'hotspot', java: 'hotspot', js: 'v8', node: 'v8', nodejs: 'v8', golang: 'go', '.net': 'dotnet', clr: 'dotnet' };
const PALETTE = {   // [hue, saturation %, lightness %]
  root: [0, 0, 74],
  process: [210, 18, 74],
  group: [160, 14, 76],
  kernel: [28, 85, 62],
  native: [4, 66, 68],
  python: [212, 62, 69],
  hotspot: [138, 42, 60],
  v8: [50, 72, 58],
  ruby: [345, 60, 70],
  php: [248, 46, 74],
  perl: [184, 46, 58],
  dotnet: [276, 44, 70],
  go: [194, 64, 62],
  'abort-marker': [0, 0, 58],
  truncated: [0, 0, 86],
};

function hashStr(s) {  // FNV-1a
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return h >>> 0;
}

function kindHSL(kind) {
  return PALETTE[KIND_ALIASES[kind] ?? kind] ?? [hashStr(kind) % 360, 40, 68];
}

// The 11 × 13 variants of each kind's colour, made once: a graph of
// 50,000 frames then builds no colour strings.
const HUE_STEPS = 11;
const LIGHT_STEPS = 13;
const variantCache = new Map();

function kindVariants(kind) {
  let v = variantCache.get(kind);
  if (v) return v;
  const [h, s, l] = kindHSL(kind);
  v = [];
  for (let dh = 0; dh < HUE_STEPS; dh++) {
    for (let dl = 0; dl < LIGHT_STEPS; dl++) {
      v.push(s === 0 ? `hsl(0 0% ${l}%)` : `hsl(${h + dh - 5} ${s}% ${l + dl - 6}%)`);
    }
  }
  variantCache.set(kind, v);
  return v;
}

function frameColor(kind, name) {
  const v = hashStr(name);
  return kindVariants(kind)[(v % HUE_STEPS) * LIGHT_STEPS + ((v >>> 8) % LIGHT_STEPS)];
}

// Red for a share that grew, blue for one that shrank, grey when about
// equal; the square root makes small changes visible.
function diffColor(delta) {
  const m = Math.abs(delta);
  if (m < DIFF_SAME) return 'hsl(0 0% 80%)';
  const t = Math.min(1, Math.sqrt(m / DIFF_FULL));
  return `hsl(${delta > 0 ? 0 : 215} ${Math.round(40 + 45 * t)}% ${Math.round(84 - 26 * t)}%)`;
}

// ---------------------------------------------------------------------------
// Flame graph: fetching and layout

async function loadFlame() {
  const diff = state.view === 'diff';
  const p = selectionParams();
  if (diff && !addBaseline(p)) {
    controllers.flame?.abort();
    state.flame = null;
    renderFlame(baselineHint());
    return;
  }
  if (state.focus.length) p.set('focus', state.focus.join(','));
  if (state.search) p.set('search', state.search);
  if (state.group) p.set('group', state.group);
  const r = await getJSON('flame', 'flame', p);
  if (!r) {
    if (errors.has('flame') && !state.flame) renderFlameEmpty('The flame graph could not be loaded: see the error above.');
    return;
  }
  hooks.lastFetchBytes = r.bytes;
  state.flame = prepareFlame(r.data, diff);
  renderFlame();
}

// Lays the nodes out once per response, in units of the root's width: a
// node starts where its previous sibling ended (nodes come in pre-order,
// a parent before its children). In diff mode a node's width is its share
// now plus its share in the baseline, so that what only the baseline has
// (total 0) shows too, and children still fit in their parent.
function prepareFlame(resp, diff) {
  const nd = resp.nodes;
  const len = nd.parent.length;
  const T = resp.total || 0;
  const B = diff ? resp.baseTotal || 0 : 0;
  const weight = new Float64Array(len);
  const x = new Float64Array(len);
  const next = new Float64Array(len);  // where the next child of a node starts
  const depth = new Uint16Array(len);
  const delta = diff ? new Float64Array(len) : null;
  const color = new Array(len);
  if (diff) nd.baseTotal ??= new Array(len).fill(0);
  for (let i = 0; i < len; i++) {
    if (diff) {
      const now = T ? nd.total[i] / T : 0;
      const was = B ? nd.baseTotal[i] / B : 0;
      weight[i] = now + was;
      delta[i] = now - was;
      color[i] = diffColor(delta[i]);
    } else {
      weight[i] = nd.total[i];
      color[i] = frameColor(resp.kinds[nd.kind[i]], resp.strings[nd.name[i]]);
    }
    const p = nd.parent[i];
    if (p >= 0) {
      depth[i] = depth[p] + 1;
      x[i] = next[p];
      next[p] += weight[i];
    }
    next[i] = x[i];
  }
  return { resp, diff, len, T, B, weight, x, depth, delta, color, hit: [], rows: 0, scale: 0 };
}

// ---------------------------------------------------------------------------
// Flame graph: drawing

function renderFlame(hint) {
  const f = state.flame;
  if (f) hooks.rootName = f.len ? f.resp.strings[f.resp.nodes.name[0]] : f.resp.path?.at(-1)?.name ?? null;
  renderBreadcrumb(f ? f.resp.path || [] : [{ id: '', name: 'all', kind: 'root' }]);
  renderLegend(f);
  renderMatchInfo(f);
  $('flame-info').textContent = f && f.T + f.B > 0
    ? `${fmtCount(f.T)}${f.diff ? ` vs ${fmtNum(f.B)} in the baseline` : ''} · ${fmtInt(f.len)} nodes` +
      (f.resp.pruned ? ` (${fmtInt(f.resp.pruned)} too small to show)` : '')
    : '';
  if (!f || f.len === 0 || f.weight[0] <= 0) {
    renderFlameEmpty(hint);
    return;
  }
  $('flame-empty').hidden = true;
  $('flame').hidden = false;
  drawFlame();
}

function renderFlameEmpty(hint) {
  const box = $('flame-empty');
  const canvas = $('flame');
  if (state.view === 'top') return;
  if (!hint && state.flame && state.flame.weight[0] > 0) return;
  canvas.hidden = true;
  hooks.nodesDrawn = 0;
  if (hint) {
    box.replaceChildren(hint);
  } else if (storeEmpty()) {
    box.replaceChildren(`No samples yet — the daemon reports every ${reportEverySeconds()} s; this page refreshes by itself while live.`);
  } else if (countsTime() && state.summary && !state.summary.offCPU) {
    box.replaceChildren('No off-CPU time: the daemon records it with -off-cpu-threshold (e.g. -off-cpu-threshold=0.1).');
  } else if (countsBytes() && state.summary && !state.summary.heapProfiles) {
    box.replaceChildren('No heap profiles: the daemon reads those of Go programs every -go-heap-interval (60 s by default; 0 turns them off).');
  } else if (!state.flame) {
    box.replaceChildren('Loading…');
  } else if (state.focus.length) {
    box.replaceChildren('The zoomed-in frame has no samples in this selection.',
      el('button', { type: 'button', onclick: () => setFocus([]) }, 'Zoom out to all'));
  } else {
    box.replaceChildren('No samples in this selection.');
  }
  box.hidden = false;
}

function rowY(depth, rows) {
  return state.icicle ? depth * ROW : (rows - 1 - depth) * ROW;
}

// One pass over the nodes: frames narrower than MIN_W are skipped (their
// children are narrower still), labels only where they fit. Hit testing
// uses the drawn nodes per depth, in x order (pre-order gives that).
function drawFlame() {
  const f = state.flame;
  const t0 = performance.now();
  const canvas = $('flame');
  const w = $('flame-wrap').clientWidth;
  const scale = w / f.weight[0];
  let rows = 1;
  for (let i = 0; i < f.len; i++) {
    if (f.depth[i] >= rows && f.weight[i] * scale >= MIN_W) rows = f.depth[i] + 1;
  }
  // The graph scrolls inside its box. A new graph (another view, zoom or
  // mode) starts at its root: the bottom of a flame graph, the top of an
  // icicle; a refresh of the same graph stays where the reader scrolled,
  // counted from the root.
  const wrap = $('flame-wrap');
  const key = [state.view, state.icicle, ...state.focus].join('/');
  const same = key === state.drawnKey;
  state.drawnKey = key;
  const fromBottom = same ? wrap.scrollHeight - wrap.scrollTop - wrap.clientHeight : 0;
  const fromTop = same ? wrap.scrollTop : 0;
  const ctx = setupCanvas(canvas, w, rows * ROW);
  wrap.scrollTop = state.icicle ? fromTop : wrap.scrollHeight - wrap.clientHeight - fromBottom;
  ctx.font = uiFont(12);
  ctx.textBaseline = 'middle';
  const maxCharW = ctx.measureText('W').width;
  const nd = f.resp.nodes;
  const strings = f.resp.strings;
  const searching = state.search !== '';
  const hit = Array.from({ length: rows }, () => []);
  let drawn = 0;
  for (let i = 0; i < f.len; i++) {
    const fw = f.weight[i] * scale;
    if (fw < MIN_W) continue;
    const fx = f.x[i] * scale;
    const fy = rowY(f.depth[i], rows);
    const matched = searching && nd.match?.[i];
    ctx.fillStyle = matched && !f.diff ? MATCH_COLOR : f.color[i];
    ctx.fillRect(fx, fy, fw > 2 ? fw - 1 : fw, ROW - 1);
    if (matched && f.diff && fw > 4) {
      ctx.strokeStyle = MATCH_COLOR;
      ctx.lineWidth = 2;
      ctx.strokeRect(fx + 1, fy + 1, fw - 3, ROW - 3);
    }
    if (fw >= LABEL_MIN_W) {
      const text = fitText(ctx, strings[nd.name[i]], fw - 7, maxCharW);
      if (text) {
        ctx.fillStyle = TEXT_COLOR;
        ctx.fillText(text, fx + 3, fy + ROW / 2);
      }
    }
    hit[f.depth[i]].push(i);
    drawn++;
  }
  Object.assign(f, { hit, rows, scale });
  canvas.setAttribute('aria-label', `Flame graph of ${fmtCount(f.T)} under ${strings[nd.name[0]]}`);
  noteDraw(f, drawn, performance.now() - t0);
}

function noteDraw(f, drawn, ms) {
  hooks.lastDrawMs = ms;
  hooks.nodesDrawn = drawn;
  hooks.rootName = f.resp.strings[f.resp.nodes.name[0]];
  hooks.focus = [...state.focus];
  hooks.draws++;
  if (!hooks.ready && drawn > 0 && f.T > 0) {
    hooks.firstDrawMs = performance.now();
    hooks.ready = true;
  }
}

// The longest prefix of s (with an ellipsis) that fits in maxW. Most names
// fit outright, which the upper bound of a wide glyph decides without
// measuring.
function fitText(ctx, s, maxW, maxCharW) {
  if (maxW < maxCharW * 1.5) return '';
  if (s.length * maxCharW <= maxW) return s;
  const full = ctx.measureText(s).width;
  if (full <= maxW) return s;
  for (let n = Math.floor((s.length * maxW) / full); n > 1; n--) {  // one letter says nothing
    const t = `${s.slice(0, n)}…`;
    if (ctx.measureText(t).width <= maxW) return t;
  }
  return '';
}

// The drawn node under a point given in client coordinates, or -1.
function nodeAt(clientX, clientY) {
  const f = state.flame;
  if (!f || !f.rows) return -1;
  const r = $('flame').getBoundingClientRect();
  const x = clientX - r.left;
  const row = Math.floor((clientY - r.top) / ROW);
  const list = f.hit[state.icicle ? row : f.rows - 1 - row];
  if (!list || !list.length) return -1;
  let lo = 0;
  let hi = list.length - 1;
  while (lo < hi) {  // the last node that starts at or before x
    const mid = (lo + hi + 1) >> 1;
    if (f.x[list[mid]] * f.scale <= x) lo = mid;
    else hi = mid - 1;
  }
  const i = list[lo];
  const x0 = f.x[i] * f.scale;
  return x >= x0 && x < x0 + f.weight[i] * f.scale ? i : -1;
}

// ---------------------------------------------------------------------------
// Flame graph: tooltip, zoom, breadcrumb, legend

function showTooltip(i, e) {
  const f = state.flame;
  const nd = f.resp.nodes;
  const s = f.resp.strings;
  const tip = $('tooltip');
  const file = nd.file[i] >= 0 ? s[nd.file[i]] + (nd.line[i] ? `:${nd.line[i]}` : '') : '';
  const row = (k, v, cls) => el('tr', {}, el('td', {}, k), el('td', cls ? { class: cls } : {}, v));
  const rows = [
    row('Kind', f.resp.kinds[nd.kind[i]]),
    row('Total', `${fmtNum(nd.total[i])} (${pct(nd.total[i], f.T)})`),
    row('Self', `${fmtNum(nd.self[i])} (${pct(nd.self[i], f.T)})`),
  ];
  if (f.diff) {
    rows.push(
      row('Baseline', `${fmtNum(nd.baseTotal[i])} (${pct(nd.baseTotal[i], f.B)}), self ${fmtNum(nd.baseSelf?.[i] ?? 0)}`),
      row('Share', `${pct(nd.total[i], f.T)} now, ${pct(nd.baseTotal[i], f.B)} before`),
      row('Change', fmtDelta(f.delta[i]), f.delta[i] > DIFF_SAME ? 'up' : f.delta[i] < -DIFF_SAME ? 'down' : ''),
    );
  }
  tip.replaceChildren(
    el('div', { class: 'name' }, s[nd.name[i]]),
    file ? el('div', { class: 'file' }, file) : null,
    el('table', {}, el('tbody', {}, ...rows)),
  );
  tip.hidden = false;
  const { width, height } = tip.getBoundingClientRect();
  const left = e.clientX + 14 + width > innerWidth ? e.clientX - width - 10 : e.clientX + 14;
  const top = e.clientY + 16 + height > innerHeight ? e.clientY - height - 10 : e.clientY + 16;
  tip.style.left = `${Math.max(4, left)}px`;
  tip.style.top = `${Math.max(4, top)}px`;
}

function hideTooltip() {
  $('tooltip').hidden = true;
}

// Zooms into node i: the focus is the id path from below the response
// root to i, after the current focus (the response root is the focused
// node). Clicking the root zooms out one level.
function zoomTo(i) {
  if (i === 0) {
    zoomOut();
    return;
  }
  const nd = state.flame.resp.nodes;
  const ids = [];
  for (let j = i; j > 0; j = nd.parent[j]) ids.push(nd.id[j]);
  setFocus([...state.focus, ...ids.reverse()]);
}

function zoomOut() {
  if (state.focus.length) setFocus(state.focus.slice(0, -1));
}

function setFocus(ids) {
  state.focus = ids;
  hooks.focus = [...ids];
  hideTooltip();
  loadFlame();
}

function renderBreadcrumb(path) {
  const items = [];
  path.forEach((p, k) => {
    if (k) items.push(el('span', { class: 'sep', 'aria-hidden': 'true' }, '›'));
    const last = k === path.length - 1;
    const b = el('button', { type: 'button', title: `${p.name} (${p.kind})` }, p.name);
    if (last) b.setAttribute('aria-current', 'location');
    else b.addEventListener('click', () => setFocus(path.slice(1, k + 1).map((q) => q.id)));
    items.push(b);
  });
  $('breadcrumb').replaceChildren(...items);
}

function renderLegend(f) {
  const box = $('legend');
  if (!f || f.diff || !f.T) {  // the diff bar carries the diff scale
    box.replaceChildren();
    return;
  }
  const swatch = (color, label) => el('span', {}, el('i', { class: 'sw', style: `background:${color}` }), label);
  const items = f.resp.kinds.map((k) => {
    const [h, s, l] = kindHSL(k);
    return swatch(`hsl(${h} ${s}% ${l}%)`, k);
  });
  if (state.search) items.push(swatch(MATCH_COLOR, 'matches search'));
  box.replaceChildren(...items);
}

function renderMatchInfo(f) {
  const info = $('match-info');
  if (!state.search || !f || state.view === 'top') {
    info.textContent = '';
    return;
  }
  const m = f.resp.matched || 0;
  info.textContent = `matched: ${fmtCount(m)} (${f.T ? ((100 * m) / f.T).toFixed(1) : '0.0'}%)`;
}

function initFlame() {
  const c = $('flame');
  c.addEventListener('mousemove', (e) => {
    const i = nodeAt(e.clientX, e.clientY);
    if (i < 0) hideTooltip();
    else showTooltip(i, e);
  });
  c.addEventListener('mouseleave', hideTooltip);
  c.addEventListener('click', (e) => {
    const i = nodeAt(e.clientX, e.clientY);
    if (i >= 0) zoomTo(i);
  });
  document.addEventListener('keydown', (e) => {
    const typing = e.target instanceof HTMLInputElement || e.target instanceof HTMLSelectElement;
    if (e.key === 'Escape' && !typing && state.view !== 'top') zoomOut();
  });
  $('mode').addEventListener('click', () => {
    state.icicle = !state.icicle;
    $('mode').setAttribute('aria-pressed', String(state.icicle));
    if (state.flame?.rows) drawFlame();
  });
  let timer = 0;
  $('search').addEventListener('input', (e) => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      state.search = e.target.value.trim();
      if (state.view !== 'top') loadFlame();
    }, 250);
  });
}

// ---------------------------------------------------------------------------
// Top functions

async function loadTop() {
  const diff = state.view === 'diff';
  const p = selectionParams();
  if (diff && !addBaseline(p)) {
    controllers.top?.abort();
    renderTop(null, false, baselineHint());
    return;
  }
  p.set('sort', state.sort);
  p.set('limit', TOP_LIMIT);
  const r = await getJSON('top', 'top', p);
  if (r) renderTop(r.data, diff);
}

// The columns; a diff adds the baseline's shares and the change.
function topColumns(T, B, diff) {
  const share = (a, b) => (b ? a / b : 0);
  const dSelf = (r) => share(r.self, T) - share(r.baseSelf, B);
  const dTotal = (r) => share(r.total, T) - share(r.baseTotal, B);
  return [
    { head: 'Function', cls: 'fn', cell: (r) => r.name },
    { head: 'Kind', cell: (r) => r.kind },
    { head: 'File', cls: 'file', cell: (r) => r.file || '', title: true },
    { head: 'Self', sort: 'self', num: true, cell: (r) => fmtNum(r.self) },
    { head: 'Self %', num: true, cell: (r) => pct(r.self, T) },
    diff && { head: 'Base self %', num: true, cell: (r) => pct(r.baseSelf, B) },
    diff && { head: 'Δ self', num: true, cell: (r) => fmtDelta(dSelf(r)), delta: dSelf },
    { head: 'Total', sort: 'total', num: true, cell: (r) => fmtNum(r.total) },
    { head: 'Total %', num: true, cell: (r) => pct(r.total, T) },
    diff && { head: 'Base total %', num: true, cell: (r) => pct(r.baseTotal, B) },
    diff && { head: 'Δ total', num: true, cell: (r) => fmtDelta(dTotal(r)), delta: dTotal },
  ].filter(Boolean);
}

function renderTop(data, diff, note) {
  const T = data?.total || 0;
  const B = data?.baseTotal || 0;
  const cols = topColumns(T, B, diff);
  $('top').tHead.replaceChildren(el('tr', {}, ...cols.map(topHeader)));
  let rows = (data?.rows || []).map((r) => el('tr', {}, ...cols.map((c) => topCell(c, r))));
  if (!rows.length) {
    const msg = note || (storeEmpty()
      ? `No samples yet — the daemon reports every ${reportEverySeconds()} s.`
      : 'No samples in this selection.');
    rows = [el('tr', {}, el('td', { class: 'note', colSpan: cols.length }, msg))];
  }
  $('top').tBodies[0].replaceChildren(...rows);
  $('top-caption').textContent = data
    ? `Functions by ${state.sort} ${countsBytes() ? 'bytes' : countsTime() ? 'time' : 'samples'}, of ${fmtCount(T)}${diff ? ` (baseline ${fmtNum(B)})` : ''}` +
      ` · self: the function was the leaf; total: anywhere on the stack`
    : '';
}

function topHeader(c) {
  const th = el('th', { scope: 'col', class: c.num ? 'num' : '' });
  if (!c.sort) {
    th.textContent = c.head;
    return th;
  }
  const active = state.sort === c.sort;
  th.setAttribute('aria-sort', active ? 'descending' : 'none');
  th.append(el('button', {
    type: 'button',
    title: `Sort by ${c.sort} samples`,
    onclick: () => { state.sort = c.sort; loadTop(); },
  }, `${c.head}${active ? ' ▼' : ''}`));
  return th;
}

function topCell(c, r) {
  const text = c.cell(r);
  const cls = [c.num ? 'num' : '', c.cls || ''];
  if (c.delta) {
    const d = c.delta(r);
    if (d > DIFF_SAME) cls.push('up');
    else if (d < -DIFF_SAME) cls.push('down');
  }
  const td = el('td', { class: cls.filter(Boolean).join(' ') }, text);
  if (c.title && text) td.title = text;
  return td;
}

// ---------------------------------------------------------------------------
// Views and the baseline controls

function loadView() {
  if (state.view !== 'top') loadFlame();
  if (state.view !== 'flame') loadTop();
}

function setView(v) {
  state.view = v;
  for (const name of ['flame', 'top', 'diff']) $(`tab-${name}`).setAttribute('aria-selected', String(name === v));
  $('flame-panel').hidden = v === 'top';
  $('top-panel').hidden = v === 'flame';
  $('diff-bar').hidden = v !== 'diff';
  hideTooltip();
  updateDragTarget();
  updateRangeLabel();
  drawTimeline();
  loadView();
}

function updateDragTarget() {
  $('drag-target').hidden = !(state.view === 'diff' && state.baseMode === 'range');
}

function setBaseMode(mode) {
  state.baseMode = mode;
  document.querySelector(`input[name="basemode"][value="${mode}"]`).checked = true;
  updateDragTarget();
  updateRangeLabel();
  drawTimeline();
  loadView();
}

function initControls() {
  for (const id of ['f-process', 'f-container', 'f-service', 'f-namespace', 'f-pod', 'f-thread', 'f-label', 'f-group', 'f-measure']) {
    $(id).addEventListener('change', onFilterChange);
  }
  // A trace id counts once it is whole (or cleared).
  const onTrace = () => {
    const v = $('f-trace').value.trim().toLowerCase();
    if (v === state.trace || (v !== '' && !/^[0-9a-f]{32}$/.test(v))) return;
    state.trace = v;
    selectionChanged({ filters: false });
  };
  $('f-trace').addEventListener('input', onTrace);
  $('f-trace').addEventListener('change', onTrace);
  $('f-kinds').addEventListener('change', onFilterChange);
  for (const name of ['flame', 'top', 'diff']) $(`tab-${name}`).addEventListener('click', () => setView(name));
  $('live').addEventListener('click', () => {
    if (state.live) {
      setLive(false);
      return;
    }
    setLive(true);
    selectionChanged();
    loadSummary();
  });
  for (const r of document.querySelectorAll('input[name="basemode"]')) {
    r.addEventListener('change', () => setBaseMode(r.value));
  }
  for (const r of document.querySelectorAll('input[name="drag"]')) {
    r.addEventListener('change', () => { state.dragTarget = r.value; });
  }
  // Picking a process means comparing with it, whatever the radio said.
  $('base-process').addEventListener('change', (e) => {
    state.baseProc = e.target.value;
    setBaseMode('process');
  });
  $('base-clear').addEventListener('click', () => {
    state.baseRange = null;
    updateRangeLabel();
    drawTimeline();
    loadView();
  });
}

// Redraws (without fetching) when the width changes: window resizes,
// devicePixelRatio changes with the browser's zoom.
function initResize() {
  let lastW = 0;
  let lastDpr = window.devicePixelRatio;
  let queued = false;
  const redraw = () => {
    queued = false;
    const w = $('flame-wrap').clientWidth;
    if (w === lastW && window.devicePixelRatio === lastDpr) return;
    lastW = w;
    lastDpr = window.devicePixelRatio;
    drawTimeline();
    if (state.flame?.rows) drawFlame();
  };
  const queue = () => {
    if (!queued) requestAnimationFrame(redraw);
    queued = true;
  };
  new ResizeObserver(queue).observe($('flame-wrap'));
  window.addEventListener('resize', queue);
}

// ---------------------------------------------------------------------------
// Test hooks

// The widest drawn frame with exactly this name: {x, y} is its centre in
// CSS pixels relative to the viewport (where to click), {w, h} its size,
// {left, top} its corner. It is scrolled into view first.
hooks.frameRect = (name) => {
  const f = state.flame;
  if (!f || !f.rows || $('flame-panel').hidden || $('flame').hidden) return null;
  const nd = f.resp.nodes;
  let best = -1;
  for (const list of f.hit) {
    for (const i of list) {
      if (f.resp.strings[nd.name[i]] === name && (best < 0 || f.weight[i] > f.weight[best])) best = i;
    }
  }
  if (best < 0) return null;
  const canvas = $('flame');
  const rect = () => {
    const r = canvas.getBoundingClientRect();
    const w = Math.max(0, f.weight[best] * f.scale - 1);
    const left = r.left + f.x[best] * f.scale;
    const top = r.top + rowY(f.depth[best], f.rows);
    return { x: left + w / 2, y: top + (ROW - 1) / 2, w, h: ROW - 1, left, top };
  };
  const wrap = $('flame-wrap');
  const y = rowY(f.depth[best], f.rows);
  if (y < wrap.scrollTop || y + ROW > wrap.scrollTop + wrap.clientHeight) {
    wrap.scrollTop = y - wrap.clientHeight / 2;
  }
  const r = rect();
  if (r.top < 0 || r.top + ROW > innerHeight) {
    window.scrollBy(0, r.top - innerHeight / 2);
    return rect();
  }
  return r;
};

// The drawn nodes of a differential flame graph with their change of
// share (delta = share now − share in the baseline) and colour.
hooks.diffColors = () => {
  const f = state.flame;
  if (!f || !f.diff || !f.rows) return [];
  const nd = f.resp.nodes;
  const out = [];
  for (const list of f.hit) {
    for (const i of list) {
      out.push({
        name: f.resp.strings[nd.name[i]],
        kind: f.resp.kinds[nd.kind[i]],
        share: f.T ? nd.total[i] / f.T : 0,
        baseShare: f.B ? nd.baseTotal[i] / f.B : 0,
        delta: f.delta[i],
        color: f.color[i],
      });
    }
  }
  return out;
};

// ---------------------------------------------------------------------------

initTimeline();
initFlame();
initControls();
initResize();
setLive(true);
updateDownloads();
renderFlame();
refreshAll();
