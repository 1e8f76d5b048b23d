// ComfyUI-FastAR: the Live World node's view and controls (plain JavaScript, served by ComfyUI from WEB_DIRECTORY).
//
// While a Live World node plays, the server sends each chunk's frames on ComfyUI's websocket (fastar.live.start,
// fastar.live.frames, fastar.live.end; nodes/live.py). This draws them in the node with the frame rate and the
// cache's MiB. While the node is selected, W A S D and the arrows (and mouse movement over its frames, for a
// variant steered by a mouse) are sent as the play's key state to POST /fastar/live/{play}/keys; other keys, and
// keys typed into a text field, go to ComfyUI as always. A play that ended answers 404 and the view stops sending.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const NODE_TYPE = "FastAR_LiveWorld";
const VIEW_HEIGHT = 280; // pixels the node keeps below its widgets for the frames and the figures
const HISTORY = 120; // chunks in the frame-rate and cache plot
const MOUSE_SEND_MS = 60;

// Read by the browser tests: frames shown, the last ones (pixels, camera), the keys sent, the plays seen.
const RECENT = 400;
const state = (window.fastarLive = window.fastarLive || {
  frames: 0, messages: 0, last: null, recent: [], sent: [], started: [], ended: [],
});

function viewOf(node) {
  if (!node.__fastarLive) {
    node.__fastarLive = {
      play: null, status: "idle", variant: null, mouse: false, keys: new Set(), held: [], shown: null,
      canvas: document.createElement("canvas"), queue: [], timer: null, fps: null, cache: null, history: [],
      mouseMove: [0, 0], mouseTimer: null, serverHeld: [],
    };
  }
  return node.__fastarLive;
}

function findNode(id) {
  const graph = app.graph;
  if (!graph || id === null || id === undefined) return null;
  const text = String(id);
  return graph.getNodeById(Number(text)) || graph.getNodeById(text.split(":").pop()) || null;
}

function isSelected(node) {
  const selected = app.canvas && app.canvas.selected_nodes;
  return !!selected && Object.values(selected).includes(node);
}

function redraw() {
  if (app.graph) app.graph.setDirtyCanvas(true, false);
}

function showFrame(node, frame) {
  const view = viewOf(node);
  const bytes = Uint8Array.from(atob(frame.rgb), (c) => c.charCodeAt(0));
  const image = new ImageData(frame.width, frame.height);
  for (let i = 0, j = 0; i < frame.width * frame.height; i++) {
    image.data[j++] = bytes[3 * i];
    image.data[j++] = bytes[3 * i + 1];
    image.data[j++] = bytes[3 * i + 2];
    image.data[j++] = 255;
  }
  view.canvas.width = frame.width;
  view.canvas.height = frame.height;
  view.canvas.getContext("2d").putImageData(image, 0, 0);
  view.shown = frame;
  state.frames += 1;
  state.last = { ...frame.meta, node: String(node.id), frames_shown: state.frames };
  state.recent = [...state.recent.slice(1 - RECENT), { ...state.last, rgb: frame.rgb, width: frame.width,
                                                      height: frame.height }];
  redraw();
}

function drainQueue(node) {
  const view = viewOf(node);
  const next = view.queue.shift();
  if (next) showFrame(node, next);
  view.timer = view.queue.length ? setTimeout(() => drainQueue(node), next ? next.delay : 0) : null;
}

async function sendKeys(node) {
  const view = viewOf(node);
  if (!view.play) return;
  const body = { keys: view.held.slice() };
  if (view.mouse && (view.mouseMove[0] || view.mouseMove[1])) {
    body.mouse = view.mouseMove;
    view.mouseMove = [0, 0];
  }
  state.sent.push({ play: view.play, ...body });
  try {
    const response = await api.fetchApi(`/fastar/live/${view.play}/keys`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    if (response.status === 404) {
      view.play = null; // the play ended: nothing more to send
      view.status = "ended";
    } else if (response.status === 200) {
      view.serverHeld = (await response.json()).held || [];
    } else {
      console.warn("FAST-AR live keys:", (await response.json()).error);
    }
  } catch (error) {
    console.warn("FAST-AR live keys:", error);
  }
  redraw();
}

function releaseAll(node) {
  const view = viewOf(node);
  if (view.held.length) {
    view.held = [];
    sendKeys(node);
  }
}

function playingNodes() {
  return (app.graph ? app.graph._nodes || app.graph.nodes || [] : []).filter(
    (n) => n.type === NODE_TYPE && n.__fastarLive && n.__fastarLive.play);
}

function typingIntoAField(event) {
  const t = event.target;
  return !!t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT" || t.isContentEditable);
}

function onKey(event, down) {
  if (typingIntoAField(event)) return;
  for (const node of playingNodes()) {
    const view = viewOf(node);
    if (!isSelected(node)) {
      releaseAll(node);
      continue;
    }
    if (!view.keys.has(event.key)) continue;
    event.preventDefault();
    event.stopImmediatePropagation();
    if (down && event.repeat) return;
    const held = view.held.filter((k) => k.toLowerCase() !== event.key.toLowerCase());
    if (down) held.push(event.key);
    view.held = held;
    sendKeys(node);
    return;
  }
}

function onMouseMove(event) {
  for (const node of playingNodes()) {
    const view = viewOf(node);
    if (!view.mouse || !isSelected(node) || !app.canvas) continue;
    const [x, y] = app.canvas.convertEventToCanvasOffset(event);
    const [nx, ny] = node.pos;
    if (x < nx || y < ny || x > nx + node.size[0] || y > ny + node.size[1]) continue;
    view.mouseMove = [view.mouseMove[0] + (event.movementX || 0), view.mouseMove[1] + (event.movementY || 0)];
    if (!view.mouseTimer) {
      view.mouseTimer = setTimeout(() => { view.mouseTimer = null; sendKeys(node); }, MOUSE_SEND_MS);
    }
  }
}

function drawPlot(ctx, history, key, colour, x, y, w, h) {
  const max = Math.max(1e-9, ...history.map((p) => p[key] || 0));
  ctx.strokeStyle = colour;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  history.forEach((p, i) => {
    const px = x + (i / (HISTORY - 1)) * w;
    const py = y + h - ((p[key] || 0) / max) * (h - 2);
    i ? ctx.lineTo(px, py) : ctx.moveTo(px, py);
  });
  ctx.stroke();
}

function drawView(node, ctx) {
  const view = viewOf(node);
  const top = node.size[1] - VIEW_HEIGHT;
  const width = node.size[0] - 20;
  const plotH = 36, textH = 34;
  const frameH = VIEW_HEIGHT - plotH - textH - 10;
  ctx.save();
  ctx.fillStyle = "#111";
  ctx.fillRect(10, top, width, frameH);
  if (view.shown) {
    const scale = Math.min(width / view.canvas.width, frameH / view.canvas.height);
    const w = view.canvas.width * scale, h = view.canvas.height * scale;
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(view.canvas, 10 + (width - w) / 2, top + (frameH - h) / 2, w, h);
  }
  ctx.fillStyle = "#ddd";
  ctx.font = "12px sans-serif";
  const fps = view.fps === null ? "-" : view.fps.toFixed(1);
  const cache = view.cache === null ? "-" : view.cache.toFixed(2);
  ctx.fillText(`${fps} frames/s   cache ${cache} MiB   ${view.status}`, 12, top + frameH + 14);
  const hint = !view.play ? "" : isSelected(node)
    ? `keys: ${(view.serverHeld || []).join(" ") || "none"}` : "select this node to steer (W A S D, arrows)";
  ctx.fillText(hint, 12, top + frameH + 29);
  const plotTop = top + frameH + textH;
  ctx.fillStyle = "#1c1e22";
  ctx.fillRect(10, plotTop, width, plotH);
  drawPlot(ctx, view.history, "fps", "#4c9", 10, plotTop, width, plotH);
  drawPlot(ctx, view.history, "cache", "#e93", 10, plotTop, width, plotH);
  ctx.restore();
}

app.registerExtension({
  name: "ComfyUI-FastAR.LiveWorld",
  async setup() {
    api.addEventListener("fastar.live.start", ({ detail }) => {
      state.started.push(detail);
      const node = findNode(detail.node);
      if (!node) return;
      const view = viewOf(node);
      Object.assign(view, { play: detail.play, status: "playing", variant: detail.variant, mouse: detail.mouse,
                            keys: new Set(detail.keys), held: [], history: [], queue: [], fps: null, cache: null });
      redraw();
    });
    api.addEventListener("fastar.live.frames", ({ detail }) => {
      const node = findNode(detail.node);
      if (!node) return;
      const view = viewOf(node);
      if (detail.play !== view.play) return;
      state.messages += 1;
      view.fps = detail.fps;
      view.cache = detail.cache_mib;
      view.serverHeld = detail.held;
      view.history = [...view.history, { fps: detail.fps, cache: detail.cache_mib }].slice(-HISTORY);
      const meta = { play: detail.play, chunk: detail.chunk, frame_start: detail.frame_start, fps: detail.fps,
                     cache_mib: detail.cache_mib, held: detail.held, camera: detail.camera || null };
      const delay = detail.rgb.length > 1 ? (1000 * detail.chunk_seconds) / detail.rgb.length : 0;
      detail.rgb.forEach((rgb, i) => view.queue.push({
        rgb, width: detail.width, height: detail.height, delay,
        meta: { ...meta, frame: detail.frame_start + i, camera: meta.camera ? meta.camera[i] : null },
      }));
      if (!view.timer) drainQueue(node);
      redraw();
    });
    api.addEventListener("fastar.live.end", ({ detail }) => {
      const node = findNode(detail.node);
      state.ended.push(detail);
      if (!node) return;
      const view = viewOf(node);
      if (detail.play !== view.play) return;
      view.play = null;
      view.held = [];
      view.status = detail.reason;
      redraw();
    });
    window.addEventListener("keydown", (e) => onKey(e, true), true);
    window.addEventListener("keyup", (e) => onKey(e, false), true);
    window.addEventListener("mousemove", onMouseMove, true);
    window.addEventListener("blur", () => playingNodes().forEach(releaseAll));
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (nodeData.name !== NODE_TYPE) return;
    const created = nodeType.prototype.onNodeCreated;
    nodeType.prototype.onNodeCreated = function () {
      const result = created ? created.apply(this, arguments) : undefined;
      const [w, h] = this.computeSize(); // the widgets' height and the view's
      this.size = [Math.max(this.size[0], w), Math.max(this.size[1], h)];
      return result;
    };
    const computeSize = nodeType.prototype.computeSize;
    nodeType.prototype.computeSize = function () {
      const size = computeSize ? computeSize.apply(this, arguments) : [300, 100];
      return [Math.max(size[0], 300), size[1] + VIEW_HEIGHT];
    };
    const drawForeground = nodeType.prototype.onDrawForeground;
    nodeType.prototype.onDrawForeground = function (ctx) {
      if (drawForeground) drawForeground.apply(this, arguments);
      if (!this.flags || !this.flags.collapsed) drawView(this, ctx);
    };
  },
});
