// The status page of spark-receivers: polls the JSON API, draws SVG charts and tables.
// No library, no network access beyond this driver: everything is drawn here.
"use strict";

const REFRESH_MS = 2000;
const WINDOW_MIN = Number(new URLSearchParams(location.search).get("minutes")) || 5;
const BATCH_ROWS = 15;
const SVG_NS = "http://www.w3.org/2000/svg";

function fmt(n, digits = 0) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  return Number(n).toLocaleString("en-US", { maximumFractionDigits: digits });
}
function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}
function clock(ms) {
  const d = new Date(ms);
  const pad = (x, w = 2) => String(x).padStart(w, "0");
  const base = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return ms % 1000 ? `${base}.${pad(d.getMilliseconds(), 3)}` : base;
}
function el(tag, attrs = {}, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function svg(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

// One time series chart: points [[t_ms, value]], optional dashed line at `interval`.
function drawChart(id, points, tMin, tMax, interval, unit) {
  const node = document.getElementById(id);
  const w = node.clientWidth || 480, h = node.clientHeight || 150;
  const left = 52, right = 8, top = 8, bottom = 20;
  node.setAttribute("viewBox", `0 0 ${w} ${h}`);
  node.replaceChildren();
  const values = points.map((p) => p[1]);
  const maxValue = values.length ? Math.max(...values) : 0;
  const yMax = niceMax(Math.max(maxValue, interval ? interval * 1.1 : 0));
  const x = (t) => left + ((t - tMin) / Math.max(1, tMax - tMin)) * (w - left - right);
  const y = (v) => top + (1 - v / yMax) * (h - top - bottom);
  node.append(svg("line", { class: "axis", x1: left, y1: h - bottom, x2: w - right, y2: h - bottom }));
  node.append(svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: h - bottom }));
  for (const frac of [0, 0.5, 1]) {
    node.append(svg("text", { class: "grid", x: left - 4, y: y(yMax * frac) + 3, "text-anchor": "end" }, fmt(yMax * frac, yMax * frac < 10 ? 1 : 0)));
  }
  node.append(svg("text", { class: "grid", x: left, y: h - 6 }, clock(tMin)));
  node.append(svg("text", { class: "grid", x: w - right, y: h - 6, "text-anchor": "end" }, clock(tMax)));
  if (interval) {
    node.append(svg("line", { class: "interval", x1: left, y1: y(interval), x2: w - right, y2: y(interval) }));
    node.append(svg("text", { class: "interval-label", x: w - right - 2, y: y(interval) - 3, "text-anchor": "end" }, `batch interval ${fmt(interval)} ${unit}`));
  }
  if (points.length) {
    const line = points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    const first = x(points[0][0]).toFixed(1), last = x(points[points.length - 1][0]).toFixed(1);
    node.append(svg("polygon", { class: "area", points: `${first},${y(0)} ${line} ${last},${y(0)}` }));
    node.append(svg("polyline", { class: "series", points: line }));
  }
  node.dataset.max = String(maxValue);
  node.dataset.points = String(points.length);
  const avg = values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
  document.getElementById(id.replace("chart-", "legend-")).textContent =
    `${unit} · avg ${fmt(avg, avg !== null && avg < 10 ? 1 : 0)} · max ${fmt(maxValue)}`;
}

function card(k, v) {
  const c = el("div", { class: "card" });
  c.append(el("div", { class: "k" }, k), el("div", { class: "v" }, v));
  return c;
}

function renderStatistics(s) {
  const up = s.startTime > 0 ? Math.round((Date.now() - s.startTime) / 1000) : 0;
  document.getElementById("app").textContent =
    `${s.appName || "streaming context"} · ${s.state} · batch interval ${fmt(s.batchDuration)} ms · up ${fmt(up)} s`;
  document.getElementById("problem").textContent = s.failure ? `failed: ${s.failure}` : "";
  document.getElementById("summary").replaceChildren(
    card("Receivers active", `${s.numActiveReceivers} / ${s.numReceivers}`),
    card("Records received", fmt(s.numReceivedRecords)),
    card("Records processed", fmt(s.numProcessedRecords)),
    card("Batches completed", fmt(s.numTotalCompletedBatches)),
    card("Batches pending", fmt(s.numActiveBatches)),
    card("Avg input rate", `${fmt(s.avgInputRate)} /s`),
    card("Avg processing", `${fmt(s.avgProcessingTime)} ms`),
    card("Avg total delay", `${fmt(s.avgTotalDelay)} ms`),
  );
  return s;
}

function renderReceivers(receivers) {
  const body = document.querySelector("#receivers tbody");
  body.replaceChildren(...receivers.map((r) => {
    const tr = el("tr", { "data-stream": r.streamId });
    const where = [r.executorId, r.executorHost].filter(Boolean).join(" / ") || "–";
    const limit = r.rateLimit === null ? "unlimited" : fmt(r.rateLimit);
    const error = r.lastErrorMessage ? `${clock(r.lastErrorTime)} ${r.lastErrorMessage}` : "";
    tr.append(
      el("td", {}, String(r.streamId)), el("td", {}, r.streamName),
      el("td", { class: `state state-${r.state}` }, r.state), el("td", {}, where),
      el("td", { class: "num" }, fmt(r.inputRate)), el("td", { class: "num" }, limit),
      el("td", { class: "num" }, fmt(r.numRecords)), el("td", { class: "num" }, bytes(r.bytes)),
      el("td", { class: "num" }, `${bytes(r.blockStoreMemoryBytes)} / ${bytes(r.blockStoreDiskBytes)}`),
      el("td", { class: "num" }, `${fmt(r.throttledSeconds, 1)} s`),
      el("td", { class: "num" }, `${fmt(r.badRecords)} (${r.badRecordPolicy})`),
      el("td", { class: "num" }, fmt(r.restarts)), el("td", { class: "err" }, error),
    );
    return tr;
  }));
}

function renderStreams(streams) {
  const body = document.querySelector("#streams tbody");
  body.replaceChildren(...streams.map((s) => {
    const tr = el("tr", { "data-stream": s.streamId });
    tr.append(
      el("td", {}, String(s.streamId)), el("td", {}, s.streamName),
      el("td", {}, s.kind === "structured" ? "Structured Streaming" : "batches"),
      el("td", {}, s.receiverType), el("td", { class: "num" }, fmt(s.numReceivedRecords)),
      el("td", { class: "num" }, fmt(s.inputRate)),
      el("td", { class: "num" }, s.rateLimit === null ? "unlimited" : fmt(s.rateLimit)),
    );
    return tr;
  }));
}

function metadataText(stream) {
  if (!stream.metadata.length) return "";
  const shown = stream.metadata.length > 2
    ? [stream.metadata[0], stream.metadata[stream.metadata.length - 1]] : stream.metadata;
  const more = stream.metadata.length - shown.length + stream.metadataOmitted;
  return shown.map((m) => JSON.stringify(m)).join(" … ") + (more > 0 ? ` (+${more})` : "");
}

function renderBatches(batches, intervalMs) {
  const tMax = batches.length ? batches[batches.length - 1].batchTime : Date.now();
  // The last WINDOW_MIN minutes, or since the first batch kept when the stream is younger.
  const tMin = Math.max(tMax - WINDOW_MIN * 60 * 1000, batches.length ? batches[0].batchTime : 0);
  const shown = batches.filter((b) => b.batchTime >= tMin);
  const series = (f) => shown.filter((b) => f(b) !== null).map((b) => [b.batchTime, f(b)]);
  drawChart("chart-input-rate", series((b) => b.inputRate), tMin, tMax, 0, "records/s");
  drawChart("chart-scheduling-delay", series((b) => b.schedulingDelay), tMin, tMax, intervalMs, "ms");
  drawChart("chart-processing-time", series((b) => b.processingTime), tMin, tMax, intervalMs, "ms");
  drawChart("chart-total-delay", series((b) => b.totalDelay), tMin, tMax, intervalMs, "ms");
  const body = document.querySelector("#batches tbody");
  body.replaceChildren(...batches.slice(-BATCH_ROWS).reverse().map((b) => {
    const tr = el("tr", { "data-batch": b.batchId });
    const perStream = el("td");
    for (const s of b.streams) {
      const line = el("div", {}, `${s.streamId}: ${fmt(s.numRecords)} records, ${s.numBlocks} blocks `);
      const meta = metadataText(s);
      if (meta) line.append(el("code", {}, meta));
      perStream.append(line);
    }
    const ops = el("td", {}, b.outputOperations.map((o) => `${o.name} ${fmt(o.durationMs)} ms`).join(", "));
    for (const o of b.stateOperators || []) {
      const m = o.customMetrics;
      const saved = m.savedBytes ? `, saved ${fmt(m.savedBytes)} bytes in ${fmt(o.commitTimeMs)} ms` : "";
      ops.append(el("div", { class: "muted" }, `${o.operatorName} ${m.stateName}: ${fmt(o.numRowsTotal)} keys, ${fmt(o.allUpdatesTimeMs)} ms${saved}`));
    }
    tr.append(
      el("td", {}, clock(b.batchTime)), el("td", { class: "num" }, fmt(b.inputSize)), perStream,
      el("td", { class: "num" }, `${fmt(b.schedulingDelay)} ms`),
      el("td", { class: "num" }, `${fmt(b.processingTime)} ms`),
      el("td", { class: "num" }, `${fmt(b.totalDelay)} ms`), ops,
      el("td", { class: `status-${b.status}` }, b.firstFailureReason ? `${b.status}: ${b.firstFailureReason.split("\n").slice(-2).join(" ")}` : b.status),
    );
    return tr;
  }));
}

// API addresses are built on the page's origin, never on its address: a page opened as
// http://user:secret@host:port/ (how a browser sends basic auth from an address) would
// give relative addresses those credentials, and fetch() refuses any address holding
// them. The browser still sends the credentials it was given for this origin.
const API_BASE = new URL(".", location.origin + location.pathname);

async function getJson(path) {
  const response = await fetch(new URL(path, API_BASE), { cache: "no-store" });
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
  return response.json();
}

async function refresh() {
  try {
    const [stats, streams, receivers, batches] = await Promise.all([
      getJson("api/v1/statistics"), getJson("api/v1/streams"), getJson("api/v1/receivers"),
      getJson("api/v1/batches?limit=400"),
    ]);
    renderStatistics(stats);
    renderStreams(streams);
    renderReceivers(receivers);
    renderBatches(batches, stats.batchDuration);
    document.body.dataset.refreshed = String(Date.now());
  } catch (e) {
    document.getElementById("problem").textContent = `cannot reach the driver: ${e.message}`;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
